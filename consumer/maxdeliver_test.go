package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/sluicetest"
)

func TestRetryAttemptsAboveBrokerMaxDeliverRefused(t *testing.T) {
	src := sluicetest.NewSource()
	src.MaxDeliver = 2
	r := route("r", src, func(context.Context, *consumer.Message) error { return nil })
	r.Retry.MaxAttempts = 3
	if _, err := consumer.New(consumer.Options{}, r); !errors.Is(err, consumer.ErrInvalidOption) {
		t.Fatalf("MaxAttempts 3 over MaxDeliver 2: %v", err)
	}
	r.Retry.MaxAttempts = 2
	if _, err := consumer.New(consumer.Options{}, r); err != nil {
		t.Fatal(err)
	}
}

// An "overloaded" result is nak'd for the broker to keep, except on the
// broker's last delivery, where a Nak would drop it: then it is
// dead-lettered.
func TestOverloadedOnLastDeliveryIsDeadLettered(t *testing.T) {
	src := sluicetest.NewSource()
	src.MaxDeliver = 3
	src.Publish("m", []byte("v"), nil, time.Now())
	var letters atomic.Int64
	var class atomic.Value
	r := route("r", src, func(context.Context, *consumer.Message) error {
		return backpressure.Overloaded(errors.New("downstream full"))
	})
	r.Retry.MaxAttempts = 3
	r.DeadLetter.Sink = dlq.SinkFunc(func(_ context.Context, l *dlq.Letter) error {
		class.Store(l.Class)
		letters.Add(1)
		return nil
	})
	c, err := consumer.New(consumer.Options{}, r)
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, c)
	eventually(t, "dead letter", func() bool { return letters.Load() == 1 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	led, _ := src.Ledger()
	rec := led["m"]
	if rec.Dropped || rec.Deliveries != 3 || rec.Naks != 2 || rec.Terms != 1 {
		t.Fatalf("ledger %+v", rec)
	}
	if class.Load() != consumer.ClassOverloaded {
		t.Fatalf("class %v", class.Load())
	}
	if s := c.Stats()[0]; s.Settled[consumer.OutcomeOverloaded] != 2 || s.Settled[consumer.OutcomeDeadLettered] != 1 {
		t.Fatalf("settled %v", s.Settled)
	}
}
