package kafkaadapter_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
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
