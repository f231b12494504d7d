package kafkaadapter_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
)

// msgIndex reads the producer's index back from a value "i:...".
func msgIndex(m *consumer.Message) int {
	s := string(m.Value)
	if i := strings.IndexByte(s, ':'); i >= 0 {
		s = s[:i]
	}
	n, _ := strconv.Atoi(s)
	return n
}

// recordingSink wraps the Kafka dead-letter sink and marks letters finished
// once the broker confirmed them.
func recordingSink(t testing.TB, topic string, l *ledger) (dlq.Sink, *atomic.Int64) {
	t.Helper()
	sink, err := kafkaadapter.NewDeadLetterSink(cluster.Kafka(), topic)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sink.Close() })
	var n atomic.Int64
	return dlq.SinkFunc(func(ctx context.Context, letter *dlq.Letter) error {
		if err := sink.Write(ctx, letter); err != nil {
			return err
		}
		n.Add(1)
		l.finish(letter.Origin)
		return nil
	}), &n
}

// TestLedger runs 10k messages over 4 partitions through handlers with
// random latency, retryable errors and poison messages: every message ends
// handled or dead-lettered, duplicates are counted, and every commit
// (seen by OnCommit and read back from the broker) covers only finished
// offsets and never goes backwards.
func TestLedger(t *testing.T) {
	const n, parts = 10000, 4
	topic := cluster.Topic(t, "ledger", parts)
	dlqTopic := cluster.Topic(t, "ledger-dlq", 1)
	group := kafkatest.UniqueName("ledger")
	end := produceN(t, topic, n, 64, nil)
	l := newLedger(t, topic)
	sink, letters := recordingSink(t, dlqTopic, l)

	stopWatch := watchCommits(t, group, topic, parts)

	var retried atomic.Int64
	cfg := testConfig(group, topic)
	cfg.OnCommit = l.onCommit
	m := startMember(t, cfg, consumer.Route{
		Workers: 16,
		Retry:   consumer.RetryPolicy{MaxAttempts: 5, BaseDelay: time.Millisecond, MaxDelay: 5 * time.Millisecond},
		Handler: func(ctx context.Context, m *consumer.Message) error {
			i := msgIndex(m)
			if d := rand.IntN(1000); d < 300 {
				time.Sleep(time.Duration(d) * time.Microsecond * 3)
			}
			switch {
			case i%97 == 5:
				return consumer.Permanent(errors.New("poison"))
			case i%19 == 3 && m.Attempt == 1:
				retried.Add(1)
				return errors.New("transient")
			}
			l.finish(m.Origin)
			return nil
		},
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
	})
	waitFor(t, 40*time.Second, "all offsets committed", func() bool { return committedAll(group, topic, end) })
	m.stop(t)
	brokerBad := stopWatch()

	unique, dups := l.counts()
	st := m.src.Stats()
	t.Logf("%s: %d unique, %d duplicates, %d dead letters, %d retried, %d commits, stats %+v",
		cluster.Kind(), unique, dups, letters.Load(), retried.Load(), l.commits, st)
	if int64(unique) != total(end) {
		t.Fatalf("finished %d of %d; missing %v", unique, total(end), l.missing(end))
	}
	if want := int64(n/97 + 1); letters.Load() < want-1 {
		t.Errorf("dead letters %d, want about %d", letters.Load(), want)
	}
	if retried.Load() == 0 || st.LocalRetries == 0 {
		t.Errorf("no in-process retries: %d / %+v", retried.Load(), st)
	}
	for _, f := range append(l.failures(), brokerBad...) {
		t.Error(f)
	}
	if l.commits == 0 {
		t.Error("no commits observed")
	}
}

// TestCommitInvariant completes messages of each partition far out of
// order (32 workers, latency up to 20 ms) with commits every 20 ms: each
// commit covers only finished offsets and commits never decrease.
func TestCommitInvariant(t *testing.T) {
	const n, parts = 3000, 4
	topic := cluster.Topic(t, "invariant", parts)
	group := kafkatest.UniqueName("invariant")
	end := produceN(t, topic, n, 32, nil)
	l := newLedger(t, topic)
	stopWatch := watchCommits(t, group, topic, parts)

	cfg := testConfig(group, topic)
	cfg.CommitInterval = 20 * time.Millisecond
	cfg.CommitEvery = 50
	cfg.OnCommit = l.onCommit
	m := startMember(t, cfg, consumer.Route{
		Workers: 32,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			if rand.IntN(10) == 0 {
				time.Sleep(time.Duration(rand.IntN(20)) * time.Millisecond)
			}
			l.finish(m.Origin)
			return nil
		},
		Window: consumer.WindowPolicy{Messages: 128, Bytes: 1 << 20},
	})
	waitFor(t, 40*time.Second, "all offsets committed", func() bool { return committedAll(group, topic, end) })
	m.stop(t)
	brokerBad := stopWatch()
	unique, dups := l.counts()
	t.Logf("%s: %d unique, %d duplicates, %d commits", cluster.Kind(), unique, dups, l.commits)
	if int64(unique) != total(end) {
		t.Fatalf("finished %d of %d", unique, total(end))
	}
	if l.commits < 10 {
		t.Errorf("only %d commits: the invariant was hardly exercised", l.commits)
	}
	for _, f := range append(l.failures(), brokerBad...) {
		t.Error(f)
	}
}

// TestStuckPartition blocks the handler on one message of partition 0: the
// other partitions commit to their end, partition 0's commit stays exactly
// at the stuck offset, and moves on once the handler is released.
func TestStuckPartition(t *testing.T) {
	const n, parts = 800, 4
	const stuckAt = 5
	topic := cluster.Topic(t, "stuck", parts)
	group := kafkatest.UniqueName("stuck")
	end := produceN(t, topic, n, 32, nil)
	release := make(chan struct{})
	var released atomic.Bool
	cfg := testConfig(group, topic)
	m := startMember(t, cfg, consumer.Route{
		Workers: 4,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			if m.Origin.Partition == 0 && m.Origin.Offset == stuckAt {
				select {
				case <-release:
				case <-ctx.Done():
					return ctx.Err()
				}
			}
			return nil
		},
		Window: consumer.WindowPolicy{Messages: 64, Bytes: 1 << 20},
	})
	defer func() {
		if !released.Load() {
			close(release)
		}
		m.stop(t)
	}()
	others := map[int]int64{}
	for p, e := range end {
		if p != 0 {
			others[p] = e
		}
	}
	waitFor(t, 30*time.Second, "other partitions committed", func() bool { return committedAll(group, topic, others) })
	// Give partition 0 several commit intervals to (wrongly) move on.
	time.Sleep(5 * cfg.CommitInterval)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := cluster.Committed(ctx, group, topic, parts)
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != stuckAt {
		t.Fatalf("partition 0 committed %d while offset %d is stuck; want exactly %d", got[0], stuckAt, stuckAt)
	}
	close(release)
	released.Store(true)
	waitFor(t, 30*time.Second, "partition 0 committed after release", func() bool { return committedAll(group, topic, end) })
}

// TestRebalanceChurn runs three members of one group that join and leave
// while processing: nothing is lost, commits never go backwards, and no
// commit is refused for a stale generation.
func TestRebalanceChurn(t *testing.T) {
	const n, parts = 6000, 6
	topic := cluster.Topic(t, "churn", parts)
	group := kafkatest.UniqueName("churn")
	end := produceN(t, topic, n, 32, nil)
	l := newLedger(t, topic)
	stopWatch := watchCommits(t, group, topic, parts)

	route := func() consumer.Route {
		return consumer.Route{
			Workers: 8,
			Handler: func(ctx context.Context, m *consumer.Message) error {
				d := time.Duration(500+rand.IntN(2000)) * time.Microsecond
				if rand.IntN(500) == 0 {
					d = 700 * time.Millisecond // outlives RevokeGrace: a stale settle
				}
				time.Sleep(d)
				l.finish(m.Origin)
				return nil
			},
			Window: consumer.WindowPolicy{Messages: 64, Bytes: 1 << 20},
		}
	}
	cfg := testConfig(group, topic)
	cfg.OnCommit = l.onCommit
	var stats []kafkaadapter.Stats
	progress := func(min int) func() bool {
		return func() bool { u, _ := l.counts(); return u >= min }
	}
	a := startMember(t, cfg, route())
	waitFor(t, 20*time.Second, "first progress", progress(500))
	b := startMember(t, cfg, route())
	waitFor(t, 20*time.Second, "progress with two", progress(1500))
	c := startMember(t, cfg, route())
	waitFor(t, 20*time.Second, "progress with three", progress(2500))
	a.stop(t)
	stats = append(stats, a.src.Stats())
	waitFor(t, 20*time.Second, "progress after a left", progress(3500))
	d := startMember(t, cfg, route())
	waitFor(t, 20*time.Second, "progress after d joined", progress(4500))
	b.stop(t)
	stats = append(stats, b.src.Stats())
	waitFor(t, 40*time.Second, "all committed", func() bool { return committedAll(group, topic, end) })
	c.stop(t)
	d.stop(t)
	stats = append(stats, c.src.Stats(), d.src.Stats())
	brokerBad := stopWatch()

	unique, dups := l.counts()
	var gens, stale, dropped, commitErrs, fenced int64
	for _, s := range stats {
		gens += s.Generations
		stale += s.StaleSettles
		dropped += s.Dropped
		commitErrs += s.CommitErrors
		fenced += s.FencedCommits
	}
	if fenced > 0 {
		t.Errorf("%d commits refused for a stale generation", fenced)
	}
	t.Logf("%s: %d unique, %d duplicates, %d generations, %d stale settles, %d dropped, %d commit errors, %d commits",
		cluster.Kind(), unique, dups, gens, stale, dropped, commitErrs, l.commits)
	if int64(unique) != total(end) {
		t.Fatalf("finished %d of %d; missing %v", unique, total(end), l.missing(end))
	}
	if gens < 5 {
		t.Errorf("only %d generations: no churn", gens)
	}
	for _, f := range append(l.failures(), brokerBad...) {
		t.Error(f)
	}
}

// TestDeadLetterWriteFails: while the dead-letter topic cannot be written,
// poison messages are not committed; after a restart with a working sink
// they are delivered again and dead-lettered.
func TestDeadLetterWriteFails(t *testing.T) {
	const n, parts = 60, 2
	topic := cluster.Topic(t, "dlqfail", parts)
	group := kafkatest.UniqueName("dlqfail")
	end := produceN(t, topic, n, 16, nil)
	l := newLedger(t, topic)
	var failed atomic.Int64
	var poisonMu sync.Mutex
	firstPoison := map[int]int64{} // lowest poison offset per partition
	broken := dlq.SinkFunc(func(ctx context.Context, letter *dlq.Letter) error {
		failed.Add(1)
		poisonMu.Lock()
		p := int(letter.Origin.Partition)
		if o, ok := firstPoison[p]; !ok || letter.Origin.Offset < o {
			firstPoison[p] = letter.Origin.Offset
		}
		poisonMu.Unlock()
		return errors.New("dead-letter topic unavailable")
	})
	handler := func(ctx context.Context, m *consumer.Message) error {
		if msgIndex(m)%10 == 0 {
			return consumer.Permanent(errors.New("poison"))
		}
		l.finish(m.Origin)
		return nil
	}
	route := consumer.Route{
		Workers:    4,
		Handler:    handler,
		Retry:      consumer.RetryPolicy{BaseDelay: 5 * time.Millisecond, MaxDelay: 20 * time.Millisecond},
		DeadLetter: consumer.DeadLetterPolicy{Sink: broken},
	}
	cfg := testConfig(group, topic)
	cfg.OnCommit = l.onCommit
	m := startMember(t, cfg, route)
	waitFor(t, 20*time.Second, "failed dead-letter writes", func() bool { return failed.Load() > 3*n/10 })
	waitFor(t, 20*time.Second, "good messages handled", func() bool { u, _ := l.counts(); return u == n-n/10 })
	time.Sleep(3 * cfg.CommitInterval)
	m.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := cluster.Committed(ctx, group, topic, parts)
	if err != nil {
		t.Fatal(err)
	}
	poisonMu.Lock()
	for p, first := range firstPoison {
		if got[p] > first {
			t.Fatalf("partition %d committed %d past its poison message at %d, which was never dead-lettered", p, got[p], first)
		}
	}
	if len(firstPoison) == 0 {
		t.Fatal("no poison message reached the sink")
	}
	poisonMu.Unlock()

	dlqTopic := cluster.Topic(t, "dlqfail-dlq", 1)
	sink, letters := recordingSink(t, dlqTopic, l)
	route.DeadLetter.Sink = sink
	m2 := startMember(t, cfg, route)
	waitFor(t, 30*time.Second, "all committed after restart", func() bool { return committedAll(group, topic, end) })
	m2.stop(t)
	if letters.Load() < n/10 {
		t.Errorf("dead letters after restart %d, want %d", letters.Load(), n/10)
	}
	for _, f := range l.failures() {
		t.Error(f)
	}
	t.Logf("%s: %d failed writes, then %d letters; commits before restart %v", cluster.Kind(), failed.Load(), letters.Load(), got)
}

// TestRetryTopic: a Nak with a delay above LocalRetryMaxDelay goes to the
// retry topic with a not-before header; the original is committed once the
// copy is stored, and the copy comes back no earlier than its not-before as
// attempt 2, with the original origin.
func TestRetryTopic(t *testing.T) {
	const n, parts = 40, 2
	topic := cluster.Topic(t, "retry", parts)
	retryTopic := cluster.Topic(t, "retry-r", 1)
	group := kafkatest.UniqueName("retry")
	end := produceN(t, topic, n, 16, nil)
	l := newLedger(t, topic)
	var mu sync.Mutex
	failedAt := map[int]time.Time{}
	var early, wrongAttempt atomic.Int64
	const delay = 300 * time.Millisecond
	cfg := testConfig(group, topic)
	cfg.RetryTopic = retryTopic
	cfg.LocalRetryMaxDelay = 50 * time.Millisecond
	m := startMember(t, cfg, consumer.Route{
		Workers: 4,
		Retry:   consumer.RetryPolicy{MaxAttempts: 3, BaseDelay: delay, MaxDelay: delay},
		Handler: func(ctx context.Context, m *consumer.Message) error {
			i := msgIndex(m)
			mu.Lock()
			defer mu.Unlock()
			if m.Attempt == 1 {
				failedAt[i] = time.Now()
				return errors.New("try later")
			}
			if m.Attempt != 2 {
				wrongAttempt.Add(1)
			}
			// Backoff is full jitter in [0, delay]: only "not before the
			// failure" is certain, and the origin must be the original.
			if time.Now().Before(failedAt[i]) || m.Origin.Topic != topic || m.Topic != topic {
				early.Add(1)
			}
			l.finish(m.Origin)
			return nil
		},
	})
	waitFor(t, 30*time.Second, "all retried", func() bool { u, _ := l.counts(); return u == n })
	waitFor(t, 30*time.Second, "originals committed", func() bool { return committedAll(group, topic, end) })
	m.stop(t)
	st := m.src.Stats()
	t.Logf("%s: stats %+v", cluster.Kind(), st)
	if st.RetryWrites == 0 {
		t.Errorf("no retry-topic writes: %+v", st)
	}
	if early.Load() > 0 || wrongAttempt.Load() > 0 {
		t.Errorf("%d early or mislabelled retries, %d with a wrong attempt", early.Load(), wrongAttempt.Load())
	}
}

// TestPrefetchBound blocks every handler: the Source stops pulling once
// its buffer is full, holding at most its prefetch's bytes (Bound with
// the responses in transit) and, by count, the prefetch plus one response
// of at most PrefetchMessages (one lane: 16 slots over 4 partitions), and
// the backlog stays at the broker as lag. Released, everything completes.
func TestPrefetchBound(t *testing.T) {
	const n, parts, size = 5000, 4, 1024
	topic := cluster.Topic(t, "bound", parts)
	group := kafkatest.UniqueName("bound")
	end := produceN(t, topic, n, size, nil)
	release := make(chan struct{})
	cfg := testConfig(group, topic)
	window := consumer.WindowPolicy{Messages: 16, Bytes: 64 << 10}
	m := startMember(t, cfg, consumer.Route{Workers: 4, Window: window, Handler: func(ctx context.Context, m *consumer.Message) error {
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}})
	waitFor(t, 20*time.Second, "a full buffer", func() bool { return m.src.Stats().Buffered > 0 })
	time.Sleep(500 * time.Millisecond)
	st := m.src.Stats()
	// The test producer writes batches of up to 1000 records.
	bound := m.src.Bound(1000*(size+64), 1)
	t.Logf("%s: fetched %d of %d while stuck, peak %d bytes, bound %d", cluster.Kind(), st.Fetched, n, st.PeakBytes, bound)
	if msgs, bytes := kafkaadapter.HeldBound(m.src, 1); st.PeakBytes > bytes || st.PeakBuffered > msgs || bytes != window.Bytes {
		t.Errorf("held %d records / %d bytes at peak, bound %d / %d (window %d / %d; whole bound with transit %d)",
			st.PeakBuffered, st.PeakBytes, msgs, bytes, window.Messages, window.Bytes, bound)
	}
	if st.Fetched >= n {
		t.Errorf("fetched the whole backlog (%d) with every handler stuck", st.Fetched)
	}
	close(release)
	waitFor(t, 40*time.Second, "all committed", func() bool { return committedAll(group, topic, end) })
	m.stop(t)
}

// TestDeadlines: a message's deadline comes from the deadline header or
// from its record timestamp plus the route's MaxAge; expired messages are
// settled (and committed) without reaching the handler.
func TestDeadlines(t *testing.T) {
	const n = 90
	topic := cluster.Topic(t, "deadline", 1)
	group := kafkatest.UniqueName("deadline")
	now := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var msgs []kafka.Message
	for i := range n {
		m := kafka.Message{Value: []byte(strconv.Itoa(i) + ":"), Time: now}
		switch i % 3 {
		case 1: // too old by record time
			m.Time = now.Add(-2 * time.Minute)
		case 2: // deadline header already passed
			m.Headers = []kafka.Header{{Key: expiry.DefaultHeader, Value: []byte(expiry.FormatDeadline(now.Add(-time.Second)))}}
		}
		msgs = append(msgs, m)
	}
	if err := cluster.Produce(ctx, topic, msgs); err != nil {
		t.Fatal(err)
	}
	end := endOffsets(t, topic)
	var wrong atomic.Int64
	var handled atomic.Int64
	m := startMember(t, testConfig(group, topic), consumer.Route{
		Workers: 2, Expiry: expiry.Policy{MaxAge: time.Minute},
		Handler: func(ctx context.Context, m *consumer.Message) error {
			handled.Add(1)
			if msgIndex(m)%3 != 0 {
				wrong.Add(1)
			}
			return nil
		},
	})
	waitFor(t, 30*time.Second, "all committed", func() bool { return committedAll(group, topic, end) })
	st := m.c.Stats()[0]
	m.stop(t)
	if wrong.Load() != 0 || handled.Load() != n/3 {
		t.Fatalf("handler ran %d expired messages, %d in all (want %d)", wrong.Load(), handled.Load(), n/3)
	}
	if got := st.Settled[consumer.OutcomeExpired]; got != 2*n/3 {
		t.Fatalf("expired %d, want %d", got, 2*n/3)
	}
}
