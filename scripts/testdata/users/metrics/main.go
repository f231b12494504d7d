// A user of metrics: the Prometheus observer on the user's own registry.
package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/metrics"
	"github.com/sluice-go/sluice/sluicetest"
)

func main() {
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg)
	if err != nil {
		log.Fatal(err)
	}
	src := sluicetest.NewSource()
	src.Publish("1", []byte("hello"), nil, time.Now())
	c, err := consumer.New(consumer.Options{Observer: obs}, consumer.Route{
		Name: "greetings", Source: src,
		Handler: func(context.Context, *consumer.Message) error { return nil },
	})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := sluicetest.RunUntil(context.Background(), c, 10*time.Second, func(s []consumer.RouteStats) bool {
		return s[0].Settled[consumer.OutcomeSucceeded] == 1
	}); err != nil {
		log.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("metric families:", len(mfs))
}
