// A user of the core alone: one route on the in-memory Source, run to the end.
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	_ "github.com/sluice-go/sluice/dlq"
	_ "github.com/sluice-go/sluice/drain"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

func main() {
	src := sluicetest.NewSource()
	src.Publish("order-1", []byte("hello"), consumer.Headers{"Sluice-Deadline": {expiry.FormatDeadline(time.Now().Add(time.Minute))}}, time.Now())
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:   "orders",
		Source: src,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			if _, ok := ctx.Deadline(); !ok {
				return fmt.Errorf("no deadline in the handler's ctx")
			}
			return nil
		},
		Overload: consumer.OverloadPolicy{Criticality: backpressure.Critical},
	})
	if err != nil {
		log.Fatal(err)
	}
	stats, err := sluicetest.RunUntil(context.Background(), c, 10*time.Second, func(s []consumer.RouteStats) bool {
		return s[0].Settled[consumer.OutcomeSucceeded] == 1
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("succeeded:", stats[0].Settled[consumer.OutcomeSucceeded])
}
