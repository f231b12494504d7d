package franzadapter_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	franzadapter "github.com/sluice-go/sluice/adapters/franz"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/kafkacore"
	"github.com/sluice-go/sluice/sluicetest"
)

// groupOpts are a test group consumer's kgo options.
func groupOpts(group string, topics ...string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topics...),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.SessionTimeout(6 * time.Second),
		kgo.FetchMaxWait(500 * time.Millisecond),
	}
}

// newSource returns an attached Source, closed when the test ends.
func newSource(t *testing.T, cfg franzadapter.Config, l consumer.RouteLimits, opts ...kgo.Opt) *franzadapter.Source {
	t.Helper()
	src, err := franzadapter.NewSource(cfg, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	if _, err := src.Attach(l); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := src.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	return src
}

// fetchN fetches until n messages arrived (or the deadline).
func fetchN(t *testing.T, src *franzadapter.Source, n int, d time.Duration) []*consumer.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var out []*consumer.Message
	for len(out) < n {
		ms, err := src.Fetch(ctx, n-len(out), 1<<30)
		if ctx.Err() != nil {
			t.Fatalf("fetched %d of %d messages: %v", len(out), n, ctx.Err())
		}
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, ms...)
	}
	return out
}

func settle(t *testing.T, m *consumer.Message, op consumer.SettleOp, delay time.Duration) {
	t.Helper()
	if err := sluicetest.Settle(context.Background(), m, consumer.Settlement{Op: op, Delay: delay}); err != nil {
		t.Fatal(err)
	}
}

func values(n int, size int) []*kgo.Record {
	out := make([]*kgo.Record, n)
	for i := range out {
		v := fmt.Sprintf("%0*d", size, i)
		out[i] = &kgo.Record{Key: []byte(strconv.Itoa(i)), Value: []byte(v)}
	}
	return out
}

// The prefetch bound with a route whose window is far smaller than the
// backlog: the Source never holds more records than its prefetch slots
// (it polls at most the free ones), nor more bytes than Bound says for the
// batches the producer wrote, and every record is handled once.
func TestPrefetchBound(t *testing.T) {
	topic := newTopic(t, "bound", 2)
	const n, size, maxBatch = 600, 200, 4000
	cl := client(t, kgo.DefaultProduceTopic(topic), kgo.ProducerBatchMaxBytes(maxBatch), kgo.ProducerLinger(20*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, values(n, size)...).FirstErr(); err != nil {
		t.Fatal(err)
	}
	src, err := franzadapter.NewSource(franzadapter.Config{}, groupOpts(uniqueName("bound"), topic)...)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var handled atomic.Int64
	seen := sync.Map{}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	window := consumer.WindowPolicy{Messages: 8, Bytes: 4096}
	cons, err := consumer.New(consumer.Options{}, consumer.Route{
		Name: "bound", Source: src, Workers: 2, Window: window,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			if _, dup := seen.LoadOrStore(string(m.Value), true); dup {
				t.Errorf("record %s handled twice", m.Value)
			}
			if handled.Add(1) == n {
				stop()
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := cons.Run(runCtx); err != nil {
		t.Fatal(err)
	}
	if handled.Load() != n {
		t.Fatalf("handled %d of %d", handled.Load(), n)
	}
	st := src.Stats()
	if st.PeakBuffered > window.Messages {
		t.Fatalf("held %d records, above the prefetch's %d slots", st.PeakBuffered, window.Messages)
	}
	// kfake and Kafka return a whole first batch even when it is larger
	// than asked: the bound is the prefetch plus one batch per broker.
	if bound := src.Bound(maxBatch+1024, 1); st.PeakBytes > bound {
		t.Fatalf("held %d bytes, above the bound %d", st.PeakBytes, bound)
	}
	t.Logf("peak %d records / %d bytes (prefetch %d / %d) in %d polls", st.PeakBuffered, st.PeakBytes, window.Messages, window.Bytes, st.Polls)
}

// What one owner settled above a stuck offset travels in the commit's
// metadata: the next owner (after a restart) passes over it and redoes
// only the stuck one.
func TestSettledMapAcrossRestart(t *testing.T) {
	topic := newTopic(t, "settled", 1)
	produce(t, topic, values(20, 10), false)
	group := uniqueName("settled")
	l := consumer.RouteLimits{Route: "settled", Messages: 100, Bytes: 1 << 20}
	committed := make(chan map[string]map[int32]int64, 16)
	src := newSource(t, franzadapter.Config{CommitInterval: 50 * time.Millisecond, OnCommit: func(o map[string]map[int32]int64) {
		select {
		case committed <- o:
		default:
		}
	}}, l, groupOpts(group, topic)...)
	ms := fetchN(t, src, 20, 30*time.Second)
	for _, m := range ms {
		if m.Origin.Offset != 3 {
			settle(t, m, consumer.SettleAck, 0)
		}
	}
	// Wait for a commit with everything but offset 3 in its map.
	deadline := time.After(30 * time.Second)
	for done := false; !done; {
		select {
		case o := <-committed:
			done = o[topic][0] == 3
		case <-deadline:
			t.Fatal("no commit at offset 3")
		}
	}
	// A commit carries the map only once settled: wait for one more.
	select {
	case <-committed:
	case <-time.After(2 * time.Second):
	}
	// Offset 3 is never settled: Close hands it back (its final commit
	// keeps the point at 3).
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}

	next := newSource(t, franzadapter.Config{}, l, groupOpts(group, topic)...)
	got := fetchN(t, next, 1, 30*time.Second)
	if got[0].Origin.Offset != 3 {
		t.Fatalf("the next owner got offset %d first, want the stuck 3", got[0].Origin.Offset)
	}
	settle(t, got[0], consumer.SettleAck, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 1500*time.Millisecond)
	defer cancel()
	if more, _ := next.Fetch(ctx, 100, 1<<30); len(more) > 0 {
		t.Fatalf("the next owner redid %d settled messages (first offset %d)", len(more), more[0].Origin.Offset)
	}
	if st := next.Stats(); st.SkippedSettled != 16 || st.MapsRestored != 1 {
		t.Fatalf("skipped %d settled records (want 16: offsets 4-19), maps restored %d", st.SkippedSettled, st.MapsRestored)
	}
}

// A Nak longer than LocalRetryMaxDelay goes to the retry topic and comes
// back after its not-before as the next attempt, key, value and header
// order kept; a short one stays in process.
func TestRetryTopicRoundTrip(t *testing.T) {
	topic := newTopic(t, "orders", 1)
	retry := newTopic(t, "orders-retry", 1)
	produce(t, topic, []*kgo.Record{{Key: []byte("k"), Value: []byte("v"), Headers: []kgo.RecordHeader{
		{Key: "b", Value: []byte("1")}, {Key: "a", Value: []byte("2")}, {Key: "b", Value: []byte("3")}}}}, false)
	src := newSource(t, franzadapter.Config{RetryTopic: retry, LocalRetryMaxDelay: 100 * time.Millisecond},
		consumer.RouteLimits{Route: "orders", Messages: 10, Bytes: 1 << 20, MaxDelay: time.Minute}, groupOpts(uniqueName("retry"), topic)...)
	m := fetchN(t, src, 1, 30*time.Second)[0]
	settle(t, m, consumer.SettleNak, 50*time.Millisecond) // in process
	m = fetchN(t, src, 1, 10*time.Second)[0]
	if m.Attempt != 2 {
		t.Fatalf("in-process retry: attempt %d, want 2", m.Attempt)
	}
	naked := time.Now()
	settle(t, m, consumer.SettleNak, 1500*time.Millisecond) // to the retry topic
	m = fetchN(t, src, 1, 30*time.Second)[0]
	if waited := time.Since(naked); waited < 1400*time.Millisecond {
		t.Fatalf("the retry came back after %v, before its not-before", waited)
	}
	if m.Attempt != 3 || m.Origin.Topic != topic || m.Origin.Offset != 0 || string(m.Key) != "k" || string(m.Value) != "v" {
		t.Fatalf("retry: attempt %d origin %+v key %q value %q", m.Attempt, m.Origin, m.Key, m.Value)
	}
	if got := strings.Join(m.Headers[franzadapter.HeaderOrder], ","); got != "b,a,b" || strings.Join(m.Headers["b"], ",") != "1,3" {
		t.Fatalf("headers after the retry topic: %v", m.Headers)
	}
	for k := range m.Headers {
		if kafkacore.IsRetryHeader(k) {
			t.Fatalf("retry header %s left for the handler", k)
		}
	}
	settle(t, m, consumer.SettleAck, 0)
	if st := src.Stats(); st.RetryWrites != 1 || st.LocalRetries != 1 {
		t.Fatalf("retry writes %d, local retries %d; want 1, 1", st.RetryWrites, st.LocalRetries)
	}
}

// Everything sluice writes through a kgo client lands where a Java
// producer would put it: kgo's default partitioner and the
// StickyKeyPartitioner hash keys with the core's murmur2.
func TestKgoPartitionersMatchJava(t *testing.T) {
	for name, p := range map[string]kgo.Partitioner{
		"default":      kgo.UniformBytesPartitioner(64<<10, true, true, nil),
		"sticky-key":   kgo.StickyKeyPartitioner(nil),
		"uniform-keys": kgo.UniformBytesPartitioner(1<<20, false, true, nil),
	} {
		tp := p.ForTopic("t")
		partition := tp.Partition
		if bp, ok := tp.(kgo.TopicBackupPartitioner); ok {
			// The uniform-bytes partitioner partitions only by backup
			// (keyed records by their hash, which needs no backup).
			partition = func(r *kgo.Record, n int) int { return bp.PartitionByBackup(r, n, nil) }
		}
		for i := range 300 {
			key := []byte(fmt.Sprintf("key-%d", i*7919))
			for _, n := range []int{1, 3, 12} {
				if got, want := partition(&kgo.Record{Key: key}, n), kafkacore.KeyPartition(key, n); got != want {
					t.Fatalf("%s: %q of %d partitions: kgo %d, Java %d", name, key, n, got, want)
				}
			}
		}
	}
}

// Attach refuses options that name no group or no topics, and a retry
// topic among the topics.
func TestAttachRefusesOptions(t *testing.T) {
	l := consumer.RouteLimits{Route: "r", Messages: 10, Bytes: 1 << 20}
	for name, c := range map[string]struct {
		cfg  franzadapter.Config
		opts []kgo.Opt
	}{
		"no group":        {opts: []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumeTopics("t")}},
		"no topics":       {opts: []kgo.Opt{kgo.SeedBrokers(brokers...), kgo.ConsumerGroup("g")}},
		"retry is topic":  {cfg: franzadapter.Config{RetryTopic: "t"}, opts: groupOpts("g", "t")},
		"retry and regex": {cfg: franzadapter.Config{RetryTopic: "r"}, opts: append(groupOpts("g", "t.*"), kgo.ConsumeRegex())},
	} {
		src, err := franzadapter.NewSource(c.cfg, c.opts...)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := src.Attach(l); err == nil {
			t.Errorf("%s: attached", name)
		}
		_ = src.Close()
	}
	if _, err := franzadapter.NewSource(franzadapter.Config{CommitEvery: -1}); err == nil {
		t.Error("NewSource took CommitEvery -1")
	}
}

// Unless the options set kgo.FetchMaxBytes, the Source sizes kgo's fetches
// from the prefetch (a quarter of PrefetchBytes, at most 1 MiB, per
// partition too); a FetchMaxBytes the user set stays.
func TestFetchSizedFromPrefetch(t *testing.T) {
	topic := newTopic(t, "sized", 1)
	l := consumer.RouteLimits{Route: "sized", Messages: 64, Bytes: 256 << 10}
	src := newSource(t, franzadapter.Config{}, l, groupOpts(uniqueName("sized"), topic)...)
	cl := src.Client()
	if got, _ := cl.OptValue(kgo.FetchMaxBytes).(int32); got != 64<<10 {
		t.Fatalf("FetchMaxBytes %d, want a quarter of the 256 KiB prefetch", got)
	}
	if got, _ := cl.OptValue(kgo.FetchMaxPartitionBytes).(int32); got != 64<<10 {
		t.Fatalf("FetchMaxPartitionBytes %d, want 64 KiB", got)
	}
	if b := src.Bound(0, 2); b != 256<<10+2*64<<10 {
		t.Fatalf("Bound %d, want the prefetch plus one 64 KiB fetch per broker", b)
	}
	own := newSource(t, franzadapter.Config{}, l, append(groupOpts(uniqueName("sized"), topic), kgo.FetchMaxBytes(123456))...)
	if got, _ := own.Client().OptValue(kgo.FetchMaxBytes).(int32); got != 123456 {
		t.Fatalf("the user's FetchMaxBytes became %d", got)
	}
}
