package kafkaadapter_test

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/sluicetest"
)

// ledger records what happened to every message of one topic, by partition
// and offset, and checks commits against it.
type ledger struct {
	t     testing.TB
	topic string

	mu        sync.Mutex
	finished  map[int]map[int64]int // times each offset was finished (success or dead letter)
	checked   map[int]int64         // offsets below this were verified finished
	committed map[int]int64         // highest commit seen by OnCommit
	bad       []string
	commits   int
}

func newLedger(t testing.TB, topic string) *ledger {
	return &ledger{t: t, topic: topic, finished: map[int]map[int64]int{}, checked: map[int]int64{}, committed: map[int]int64{}}
}

func (l *ledger) finish(o dlq.Origin) {
	if o.Topic != l.topic {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.finished[int(o.Partition)]
	if m == nil {
		m = map[int64]int{}
		l.finished[int(o.Partition)] = m
	}
	m[o.Offset]++
}

// onCommit is a Config.OnCommit: every offset below a committed one must be
// finished already, and commits never go backwards.
func (l *ledger) onCommit(gen int32, offsets map[string]map[int]int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.commits++
	for p, off := range offsets[l.topic] {
		if prev, ok := l.committed[p]; ok && off < prev {
			l.bad = append(l.bad, fmt.Sprintf("p%d commit went back %d -> %d (gen %d)", p, prev, off, gen))
		}
		l.committed[p] = max(l.committed[p], off)
		for o := l.checked[p]; o < off; o++ {
			if l.finished[p][o] == 0 {
				l.bad = append(l.bad, fmt.Sprintf("p%d committed %d (gen %d) but offset %d not finished", p, off, gen, o))
				break
			}
		}
		l.checked[p] = max(l.checked[p], off)
	}
}

// counts returns how many offsets were finished at least once, and how many
// extra times (duplicates).
func (l *ledger) counts() (unique, dups int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range l.finished {
		for _, n := range m {
			unique++
			dups += n - 1
		}
	}
	return unique, dups
}

func (l *ledger) failures() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.bad...)
}

// missing lists up to 10 offsets in [0, end[p]) never finished.
func (l *ledger) missing(end map[int]int64) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for p, e := range end {
		for o := int64(0); o < e && len(out) < 10; o++ {
			if l.finished[p][o] == 0 {
				out = append(out, fmt.Sprintf("p%d@%d", p, o))
			}
		}
	}
	return out
}

// watchCommits polls the broker's committed offsets of group every 100 ms
// and notes a commit that decreased. The returned stop ends the polling and
// returns those notes.
func watchCommits(t testing.TB, group, topic string, partitions int) (stop func() []string) {
	ctx, cancel := context.WithCancel(context.Background())
	var mu sync.Mutex
	var bad []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		last := map[int]int64{}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			qctx, qcancel := context.WithTimeout(ctx, 5*time.Second)
			got, err := cluster.Committed(qctx, group, topic, partitions)
			qcancel()
			if err != nil {
				continue
			}
			for p, off := range got {
				if off < last[p] && off >= 0 {
					mu.Lock()
					bad = append(bad, fmt.Sprintf("broker commit of p%d went back %d -> %d", p, last[p], off))
					mu.Unlock()
				}
				last[p] = max(last[p], off)
			}
		}
	}()
	return func() []string {
		cancel()
		<-done
		mu.Lock()
		defer mu.Unlock()
		return bad
	}
}

// produceN writes n messages with value "i" and key "k<i>" to topic and
// returns the end offset of each partition.
func produceN(t testing.TB, topic string, n, size int, headers func(i int) []kafka.Header) map[int]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	msgs := make([]kafka.Message, n)
	pad := make([]byte, max(0, size-8))
	for i := range msgs {
		v := append([]byte(strconv.Itoa(i)+":"), pad...)
		msgs[i] = kafka.Message{Key: []byte("k" + strconv.Itoa(i)), Value: v}
		if headers != nil {
			msgs[i].Headers = headers(i)
		}
	}
	if err := cluster.Produce(ctx, topic, msgs); err != nil {
		t.Fatal(err)
	}
	return endOffsets(t, topic)
}

func endOffsets(t testing.TB, topic string) map[int]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	md, err := cluster.Client().Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		t.Fatal(err)
	}
	req := map[string][]kafka.OffsetRequest{}
	for _, p := range md.Topics[0].Partitions {
		req[topic] = append(req[topic], kafka.LastOffsetOf(p.ID))
	}
	res, err := cluster.Client().ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: req})
	if err != nil {
		t.Fatal(err)
	}
	out := map[int]int64{}
	for _, p := range res.Topics[topic] {
		out[p.Partition] = p.LastOffset
	}
	return out
}

func total(end map[int]int64) (n int64) {
	for _, e := range end {
		n += e
	}
	return n
}

// testConfig is a Source config for tests: short session and heartbeat, so
// rebalances are quick; it works on kfake and a real broker.
func testConfig(group string, topics ...string) kafkaadapter.Config {
	return kafkaadapter.Config{
		Cluster: cluster.Kafka(), GroupID: group, Topics: topics,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 250 * time.Millisecond,
		RebalanceTimeout: 10 * time.Second, CommitInterval: 100 * time.Millisecond,
		FetchMaxWait: 100 * time.Millisecond, PollWait: 200 * time.Millisecond,
		RevokeGrace: 500 * time.Millisecond,
	}
}

// testWindow is the route window tests use unless they say otherwise.
var testWindow = consumer.WindowPolicy{Messages: 256, Bytes: 1 << 20}

// attachedSource is a Source attached as a route with window w would
// attach it (so it joins its group), for tests that drive Fetch and settle
// messages themselves.
func attachedSource(t testing.TB, cfg kafkaadapter.Config, w consumer.WindowPolicy) *kafkaadapter.Source {
	t.Helper()
	src, err := kafkaadapter.NewSource(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Attach(consumer.RouteLimits{Route: "test", Messages: w.Messages, Bytes: w.Bytes, MaxAttempts: 3, MaxDelay: 30 * time.Second}); err != nil {
		_ = src.Close()
		t.Fatal(err)
	}
	return src
}

// settle settles m as a route would.
func settle(t testing.TB, m *consumer.Message, s consumer.Settlement) {
	t.Helper()
	if err := sluicetest.Settle(context.Background(), m, s); err != nil {
		t.Fatal(err)
	}
}

// member is one consumer-group member: a Source under a Consumer.
type member struct {
	src    *kafkaadapter.Source
	cancel context.CancelFunc
	done   chan error
	c      *consumer.Consumer
}

func startMember(t testing.TB, cfg kafkaadapter.Config, route consumer.Route, opts ...func(*kafkaadapter.Source)) *member {
	t.Helper()
	src, err := kafkaadapter.NewSource(cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range opts {
		o(src)
	}
	route.Source = src
	if route.Name == "" {
		route.Name = "r"
	}
	if route.Window.Messages == 0 {
		route.Window = testWindow
	}
	if route.Workers == 0 {
		route.Workers = 8
	}
	c, err := consumer.New(consumer.Options{ShutdownGrace: 5 * time.Second}, route)
	if err != nil {
		_ = src.Close()
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m := &member{src: src, cancel: cancel, done: make(chan error, 1), c: c}
	go func() { m.done <- c.Run(ctx) }()
	return m
}

// stop ends Run, then closes the Source (final commit, leave group).
func (m *member) stop(t testing.TB) {
	t.Helper()
	if m.cancel == nil {
		return
	}
	m.cancel()
	m.cancel = nil
	if err := <-m.done; err != nil {
		t.Errorf("run: %v", err)
	}
	if err := m.src.Close(); err != nil {
		t.Errorf("close: %v", err)
	}
}

// waitFor polls cond every 20 ms until it holds or timeout passes.
func waitFor(t testing.TB, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// committedAll reports whether group committed end for every partition.
func committedAll(group, topic string, end map[int]int64) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	parts := 0
	for p := range end {
		parts = max(parts, p+1)
	}
	got, err := cluster.Committed(ctx, group, topic, parts)
	if err != nil {
		return false
	}
	for p, e := range end {
		if got[p] != e {
			return false
		}
	}
	return true
}

var _ = kafkatest.UniqueName
