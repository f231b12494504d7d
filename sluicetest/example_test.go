package sluicetest_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/sluicetest"
)

// Test a handler and its dead-letter policy without a broker: the Source
// keeps a ledger of every delivery and settlement, the Sink keeps the
// letters, and RunUntil stops the consumer once every message has ended.
func Example() {
	src := sluicetest.NewSource()
	for _, id := range []string{"a", "b", "poison"} {
		src.Publish(id, []byte("payload"), nil, time.Time{})
	}
	sink := &sluicetest.Sink{}
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:   "orders",
		Source: src,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			if string(m.Key) == "poison" {
				return consumer.Permanent(errors.New("cannot decode"))
			}
			return nil
		},
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
	})
	if err != nil {
		panic(err)
	}
	_, err = sluicetest.RunUntil(context.Background(), c, 10*time.Second, func(s []consumer.RouteStats) bool {
		return sluicetest.Final(s[0]) == 3 && s[0].Held == 0
	})
	fmt.Println("run:", err)
	ledger, violations := src.Ledger()
	fmt.Println("a acked:", ledger["a"].Acks, "poison terminated:", ledger["poison"].Terms)
	fmt.Println("letters:", len(sink.Letters()), "violations:", len(violations))
	// Output:
	// run: <nil>
	// a acked: 1 poison terminated: 1
	// letters: 1 violations: 0
}

// MaxDeliver plays JetStream's delivery limit: a Nak on the last delivery
// drops the message, which is what a route must never do by accident.
func ExampleSource_maxDeliver() {
	src := sluicetest.NewSource()
	src.MaxDeliver = 2
	src.Publish("m", nil, nil, time.Time{})
	ctx := context.Background()
	for range 2 {
		msgs, _ := src.Fetch(ctx, 1, 1<<20)
		fmt.Println("attempt", msgs[0].Attempt)
		_ = sluicetest.Settle(ctx, msgs[0], consumer.Settlement{Op: consumer.SettleNak})
	}
	ledger, _ := src.Ledger()
	fmt.Println("dropped:", ledger["m"].Dropped, "queued:", src.Queued())
	// Output:
	// attempt 1
	// attempt 2
	// dropped: true queued: 0
}

// Unit-test a BatchHandler's per-message outcomes: which rows it marks as
// failed, and how each message of the batch would settle.
func ExampleRunBatch() {
	insert := func(ctx context.Context, b *consumer.Batch) error {
		for i, m := range b.Messages {
			if len(m.Value) == 0 {
				b.Fail(i, consumer.Permanent(errors.New("empty order")))
			}
		}
		return nil // the bulk write of the others went through
	}
	res := sluicetest.RunBatch(context.Background(), insert, sluicetest.Messages("o1", "", "o3")...)
	fmt.Println("succeeded:", res.Succeeded())
	fmt.Println("dead-lettered:", res.Permanent())
	// Output:
	// succeeded: 2
	// dead-lettered: [1]
}
