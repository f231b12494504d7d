package kafkaadapter_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
)

// TestForgedNotBeforeBecomesDue is issue 24.3: a retry-topic record whose
// not-before lies far in the future (a skewed clock, a forged header) is
// held at most the route's longest delay after it was written. Before the
// fix the clamp (now + that delay) was applied again at every re-fetch (one
// per second while the partition waits), so the record slid forward and
// never became due: its partition was held forever.
func TestForgedNotBeforeBecomesDue(t *testing.T) {
	topic := cluster.Topic(t, "forged", 1)
	retryTopic := cluster.Topic(t, "forged-r", 1)
	group := kafkatest.UniqueName("forged")
	const maxDelay = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	written := time.Now()
	if err := cluster.Produce(ctx, retryTopic, []kafka.Message{
		{Value: []byte("forged"), Headers: []kafka.Header{{Key: kafkaadapter.HeaderNotBefore, Value: []byte("2100-01-01T00:00:00Z")}}},
		{Value: []byte("behind")}, // no headers: due at once, but behind the forged one
	}); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(group, topic)
	cfg.RetryTopic = retryTopic
	cfg.LocalRetryMaxDelay = time.Second
	src, err := kafkaadapter.NewSource(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if _, err := src.Attach(consumer.RouteLimits{Route: "test", Messages: 16, Bytes: 1 << 20, MaxAttempts: 3, MaxDelay: maxDelay}); err != nil {
		t.Fatal(err)
	}
	// Long enough for ten re-fetches of the waiting partition (one per
	// second): the record must come out after maxDelay, not slide.
	got := fetchAll(t, src, 2, maxDelay+10*time.Second, true)
	st := src.Stats()
	if len(got) != 2 {
		t.Fatalf("got %d of 2 retry records %v after %v; a not-before of 2100 held its partition (stats %+v)",
			len(got), time.Since(written), maxDelay+10*time.Second, st)
	}
	if string(got[0].Value) != "forged" || string(got[1].Value) != "behind" {
		t.Fatalf("handed out %q, %q: not in offset order", got[0].Value, got[1].Value)
	}
	if st.RetryClamped != 1 {
		t.Errorf("RetryClamped %d, want 1 (one record clamped once)", st.RetryClamped)
	}
}

// TestReadyBeforeAttach is issue 24.11: a Source joins its group when its
// route attaches it (consumer.New). Ready called before that waited until
// its ctx ended; it now says at once that there is nothing to wait for,
// and after consumer.New it returns once the group formed.
func TestReadyBeforeAttach(t *testing.T) {
	topic := cluster.Topic(t, "ready", 1)
	src, err := kafkaadapter.NewSource(testConfig(kafkatest.UniqueName("ready"), topic))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := src.Ready(ctx); !errors.Is(err, kafkaadapter.ErrNotAttached) {
		t.Fatalf("Ready before consumer.New: %v, want ErrNotAttached", err)
	}
	if ctx.Err() != nil {
		t.Fatal("Ready before consumer.New waited for its ctx")
	}
	if _, err := consumer.New(consumer.Options{}, consumer.Route{Name: "r", Source: src, Workers: 1, Window: testWindow,
		Handler: func(context.Context, *consumer.Message) error { return nil }}); err != nil {
		t.Fatal(err)
	}
	if err := src.Ready(ctx); err != nil {
		t.Fatalf("Ready after consumer.New: %v", err)
	}
	if a := src.Assigned(); len(a[topic]) != 1 {
		t.Fatalf("ready without its assignment: %v", a)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	if err := src.Ready(ctx); !errors.Is(err, consumer.ErrClosed) {
		t.Fatalf("Ready after Close: %v, want ErrClosed", err)
	}
}

// TestLargeRecordTwoLanes is issue 24.4: with two fetch lanes, a record
// that does not fit beside the other lane's reservation (held for that
// lane's whole long poll) was dropped and fetched again at once, for ever:
// 2 partitions, a 64 KiB window and one 56 KiB record made 20,000-26,000
// fetches in 10 s and delivered nothing. A record that did not fit is now
// claimed by its lane, which fetches it again once it fits, before any
// other lane reserves; the prefetch bound still holds.
func TestLargeRecordTwoLanes(t *testing.T) {
	const parts, big = 2, 56 << 10
	topic := cluster.Topic(t, "bigrec", parts)
	group := kafkatest.UniqueName("bigrec")
	cfg := testConfig(group, topic)
	cfg.FetchMaxWait = time.Second // the other lane's reservation is held this long when it has nothing
	window := consumer.WindowPolicy{Messages: 64, Bytes: 64 << 10}
	src := attachedSource(t, cfg, window)
	defer src.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := src.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	// Both lanes are in their long polls now; the record goes to one.
	msgs := []kafka.Message{{Key: []byte("big"), Value: make([]byte, big)}}
	if err := cluster.Produce(ctx, topic, msgs); err != nil {
		t.Fatal(err)
	}
	got := fetchAll(t, src, len(msgs), 10*time.Second, true)
	st := src.Stats()
	var large int
	for _, m := range got {
		if len(m.Value) == big {
			large++
		}
	}
	t.Logf("got %d of %d (the large one: %v) in %d fetch requests; peak %d bytes", len(got), len(msgs), large == 1, st.FetchRequests, st.PeakBytes)
	if large != 1 || len(got) != len(msgs) {
		t.Fatalf("got %d of %d messages, the %d-byte one %d times, in %d fetch requests (stats %+v)", len(got), len(msgs), big, large, st.FetchRequests, st)
	}
	// Idle long polls: one per lane per FetchMaxWait over at most 10 s.
	if st.FetchRequests > 40 {
		t.Errorf("%d fetch requests for one record: a lane fetched it again while it could not fit", st.FetchRequests)
	}
	if st.PeakBytes > window.Bytes {
		t.Errorf("peak %d bytes held or reserved, prefetch %d", st.PeakBytes, window.Bytes)
	}
}

// TestPoisonWithDLQDownKeepsFlowing is issue 24.10 on Kafka: with the
// dead-letter sink refusing every write, each poison record is nak'd again
// and again and waits in the Source for its next letter attempt. Those
// waits took the prefetch's message slots, so once about a prefetch's worth
// of poison records waited, no fetch was sent and good records stopped
// (kfake: 2,700-3,300 of 5,820 good after 60 s). In-process retries now
// have an allowance of their own (Config.LocalRetryMessages and
// LocalRetryBytes), outside the prefetch: 3 % poison with a window of 32
// leaves good traffic flowing.
func TestPoisonWithDLQDownKeepsFlowing(t *testing.T) {
	t.Run("refusing", func(t *testing.T) {
		poisonWithDLQDown(t, dlq.SinkFunc(func(context.Context, *dlq.Letter) error { return errors.New("dlq down") }))
	})
	t.Run("topic missing", func(t *testing.T) {
		sink, err := kafkaadapter.NewDeadLetterSink(cluster.Kafka(), kafkatest.UniqueName("no-such-dlq"))
		if err != nil {
			t.Fatal(err)
		}
		defer sink.Close()
		poisonWithDLQDown(t, sink)
	})
}

func poisonWithDLQDown(t *testing.T, sink dlq.Sink) {
	const n, every = 3000, 33 // 91 poison records, about three windows' worth
	topic := cluster.Topic(t, "poisondlq", 2)
	group := kafkatest.UniqueName("poisondlq")
	produceN(t, topic, n, 16, nil)
	var good, letters atomic.Int64
	route := consumer.Route{
		Workers: 8,
		Window:  consumer.WindowPolicy{Messages: 32, Bytes: 1 << 20},
		Retry:   consumer.RetryPolicy{BaseDelay: 50 * time.Millisecond, MaxDelay: time.Second},
		Handler: func(_ context.Context, m *consumer.Message) error {
			if msgIndex(m)%every == 0 {
				return consumer.Permanent(errors.New("poison"))
			}
			good.Add(1)
			return nil
		},
		DeadLetter: consumer.DeadLetterPolicy{Sink: dlq.SinkFunc(func(ctx context.Context, l *dlq.Letter) error {
			letters.Add(1)
			if err := sink.Write(ctx, l); err != nil {
				return err
			}
			t.Errorf("letter of %s/%d@%d written: the DLQ is down", l.Origin.Topic, l.Origin.Partition, l.Origin.Offset)
			return nil
		})},
	}
	m := startMember(t, testConfig(group, topic), route)
	defer m.stop(t)
	want := int64(n - (n+every-1)/every)
	deadline := time.Now().Add(60 * time.Second)
	for good.Load() < want && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	st := m.src.Stats()
	t.Logf("good %d of %d, %d failed letter writes, local retries %d, buffered %d (peak %d records)",
		good.Load(), want, letters.Load(), st.LocalRetries, st.Buffered, st.PeakBuffered)
	if good.Load() < want {
		t.Fatalf("%d of %d good records handled in 60 s with the DLQ down: the poison's letter retries held the prefetch", good.Load(), want)
	}
}
