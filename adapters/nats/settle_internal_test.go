package natsadapter

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
)

// TestSentListStaysBoundedWithNaksOnly: ConfirmBatch keeps the settlements
// it sent in order for a later answer to cover; an answer to a Nak covers
// nothing, so a route whose every run fails (naks only) must still not
// grow that list without end. Before the fix it grew by one entry per
// nak; 1,000 naks against a bound of 96 show it. (It asked for 2,000 runs
// within 30 s of wall time: under -race -cpu 1 with a CPU hog it got
// 1,372. The run is counted, not timed; the deadline only ends a broken
// run.)
func TestSentListStaysBoundedWithNaksOnly(t *testing.T) {
	const window, naks = 16, 1000
	js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "NAKS", Subjects: []string{"naks.>"}}); err != nil {
		t.Fatal(err)
	}
	for range window {
		if _, err := js.Publish(ctx, "naks.x", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	src, err := NewSourceFor(ctx, js, "NAKS", jetstream.ConsumerConfig{Durable: "naks"}, SourceOptions{PollWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "naks",
		Source:  src,
		Workers: 4,
		Expiry:  expiry.Policy{IgnoreHeader: true},
		Handler: func(context.Context, *consumer.Message) error {
			runs.Add(1)
			return errors.New("always")
		},
		Retry:  consumer.RetryPolicy{MaxAttempts: 1000, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		Window: consumer.WindowPolicy{Messages: window, Bytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	for runs.Load() < naks && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	src.set.mu.Lock()
	sent, pending := len(src.set.sent), len(src.set.pending)
	src.set.mu.Unlock()
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	t.Logf("%d runs, all nak'd: %d sends listed, %d pending", runs.Load(), sent, pending)
	if runs.Load() < naks {
		t.Fatalf("only %d runs", runs.Load())
	}
	if sent > 2*window+64 {
		t.Fatalf("%d sends listed after %d naks (%d pending): the list grows", sent, runs.Load(), pending)
	}
}
