package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/sluicetest"
)

// A batch route: one bulk write per batch instead of one write per
// message. The handler marks the one row it cannot decode as a permanent
// failure, so that message alone is dead-lettered (here: terminated, the
// route has no sink) and the rest of its batch is acked.
func ExampleBatchHandler() {
	src := sluicetest.NewSource() // an adapter's Source in real use
	for i := range 250 {
		v := fmt.Sprint(i)
		if i == 42 {
			v = "not a number"
		}
		src.Publish(fmt.Sprint("order-", i), []byte(v), nil, time.Time{})
	}
	var mu sync.Mutex
	table := map[string]string{} // stands for a database table
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:   "orders",
		Source: src,
		BatchHandler: func(ctx context.Context, b *consumer.Batch) error {
			rows := map[string]string{}
			for i, m := range b.Messages {
				var n int
				if _, err := fmt.Sscan(string(m.Value), &n); err != nil {
					b.Fail(i, consumer.Permanent(errors.New("cannot decode")))
					continue
				}
				rows[string(m.Key)] = string(m.Value)
			}
			mu.Lock() // one bulk write (a COPY, a bulk index call)
			defer mu.Unlock()
			for k, v := range rows {
				table[k] = v
			}
			return nil
		},
		Batch: consumer.BatchPolicy{MaxMessages: 100}, // the zero value needs no tuning
	})
	if err != nil {
		panic(err)
	}
	stats, err := sluicetest.RunUntil(context.Background(), c, 10*time.Second, func(s []consumer.RouteStats) bool {
		return sluicetest.Final(s[0]) == 250
	})
	fmt.Println("run:", err)
	fmt.Println("rows:", len(table))
	fmt.Println("acked:", stats[0].Settled[consumer.OutcomeSucceeded])
	fmt.Println("terminated:", stats[0].Settled[consumer.OutcomeTerminated])
	fmt.Println("messages in batches:", stats[0].Batch.Messages)
	// Output:
	// run: <nil>
	// rows: 249
	// acked: 249
	// terminated: 1
	// messages in batches: 250
}

// Per-message outcomes in one batch: a row the store rejects for good is
// marked Permanent (dead-lettered alone), a row whose shard is overloaded is
// handed back with backpressure.Overloaded (nak'd with backoff, not retried
// in this process), a row that hit a transient error is marked with it
// (retried); the others are acked. Each message keeps its own attempts.
func ExampleBatch_Fail() {
	src := sluicetest.NewSource()
	for _, id := range []string{"ok-1", "bad", "busy", "flaky", "ok-2"} {
		src.Publish(id, []byte(id), nil, time.Time{})
	}
	var mu sync.Mutex
	written := map[string]int{}
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:   "rows",
		Source: src,
		Retry:  consumer.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		BatchHandler: func(ctx context.Context, b *consumer.Batch) error {
			mu.Lock()
			defer mu.Unlock()
			for i, m := range b.Messages {
				switch id := string(m.Value); {
				case id == "bad":
					b.Fail(i, consumer.Permanent(errors.New("constraint violated")))
				case id == "busy" && m.Attempt == 1:
					b.Fail(i, backpressure.Overloaded(errors.New("shard busy")))
				case id == "flaky" && m.Attempt == 1:
					b.Fail(i, errors.New("connection reset"))
				default:
					written[id]++
				}
			}
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	stats, err := sluicetest.RunUntil(context.Background(), c, 10*time.Second, func(s []consumer.RouteStats) bool {
		return sluicetest.Final(s[0]) == 5
	})
	s := stats[0].Settled
	fmt.Println("run:", err)
	fmt.Println("written:", len(written))
	fmt.Println("succeeded:", s[consumer.OutcomeSucceeded], "terminated:", s[consumer.OutcomeTerminated])
	fmt.Println("retried:", s[consumer.OutcomeRetried], "overloaded:", s[consumer.OutcomeOverloaded])
	// Output:
	// run: <nil>
	// written: 4
	// succeeded: 4 terminated: 1
	// retried: 1 overloaded: 1
}

// An ordered batch route: a batch holds each key's messages in delivery
// order, so a bulk write applies an account's entries in order, and
// batches still run on every worker. A byte bound and a linger shape the
// batches (a batch waits up to 5 ms for more, never past its earliest
// deadline's predicted end).
func ExampleBatchPolicy_ordered() {
	src := sluicetest.NewSource()
	for i := range 30 {
		acct := fmt.Sprint("acct-", i%3)
		src.PublishMsg(sluicetest.Msg{ID: fmt.Sprint(i), Key: []byte(acct), Value: []byte(fmt.Sprint(i))})
	}
	var mu sync.Mutex
	applied := map[string][]string{} // per account, in the order written
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:     "ledger",
		Source:   src,
		Workers:  4,
		Ordering: consumer.ByKey,
		Batch:    consumer.BatchPolicy{MaxMessages: 8, MaxBytes: 64 << 10, Linger: 5 * time.Millisecond},
		BatchHandler: func(ctx context.Context, b *consumer.Batch) error {
			mu.Lock()
			defer mu.Unlock()
			for _, m := range b.Messages {
				applied[string(m.Key)] = append(applied[string(m.Key)], string(m.Value))
			}
			return nil
		},
	})
	if err != nil {
		panic(err)
	}
	_, err = sluicetest.RunUntil(context.Background(), c, 10*time.Second, func(s []consumer.RouteStats) bool {
		return sluicetest.Final(s[0]) == 30
	})
	fmt.Println("run:", err)
	for _, acct := range []string{"acct-0", "acct-1", "acct-2"} {
		fmt.Println(acct, applied[acct])
	}
	// Output:
	// run: <nil>
	// acct-0 [0 3 6 9 12 15 18 21 24 27]
	// acct-1 [1 4 7 10 13 16 19 22 25 28]
	// acct-2 [2 5 8 11 14 17 20 23 26 29]
}
