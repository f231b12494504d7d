package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

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
