package drain_test

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/drain"
	"github.com/sluice-go/sluice/sluicetest"
)

// A route drains its own backlog at 1000 messages/s until it catches up
// with messages younger than 5 s, instead of hitting its downstream with
// the whole backlog at once after an outage.
func Example() {
	backlog := sluicetest.NewSource() // an adapter's Source in real use
	for i := range 50 {
		backlog.Publish(strconv.Itoa(i), []byte("x"), nil, time.Now().Add(-time.Hour))
	}
	src, err := drain.New(backlog, drain.Options{Rate: 1000, CaughtUp: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name: "orders", Source: src,
		Handler: func(context.Context, *consumer.Message) error { return nil },
	})
	if err != nil {
		panic(err)
	}
	stats, err := sluicetest.RunUntil(context.Background(), c, 10*time.Second, func(s []consumer.RouteStats) bool {
		return s[0].Settled[consumer.OutcomeSucceeded] == 50
	})
	if err != nil {
		panic(err)
	}
	fmt.Println(stats[0].Settled[consumer.OutcomeSucceeded], "handled; still draining:", src.Draining())
	// Output: 50 handled; still draining: true
}
