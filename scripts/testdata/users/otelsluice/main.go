// A user of otelsluice: the tracing hook with the global provider.
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/otelsluice"
	"github.com/sluice-go/sluice/sluicetest"
)

func main() {
	tc := otelsluice.New(otelsluice.Options{TracerProvider: otel.GetTracerProvider(), Propagator: propagation.TraceContext{}})
	src := sluicetest.NewSource()
	src.Publish("order-1", []byte("{}"), nil, time.Now())
	c, err := consumer.New(consumer.Options{Hook: tc}, consumer.Route{
		Name: "orders", Source: src,
		Handler: func(context.Context, *consumer.Message) error { return nil },
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
