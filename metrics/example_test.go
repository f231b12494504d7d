package metrics_test

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/memsource"
	"github.com/sluice-go/sluice/metrics"
)

func Example() {
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg)
	if err != nil {
		panic(err)
	}
	src := memsource.New()
	for i := range 3 {
		src.Publish(fmt.Sprint(i), []byte("hello"), nil, time.Now())
	}
	c, err := consumer.New(consumer.Options{Observer: obs}, consumer.Route{
		Name: "greetings", Source: src, Workers: 1, MaxInFlight: 4, MaxInFlightBytes: 1 << 20,
		Handler: func(context.Context, *consumer.Message) error { return nil },
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for c.Stats()[0].Settled[consumer.OutcomeSucceeded] < 3 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done

	n, _ := testutil.GatherAndCount(reg, "sluice_handler_duration_seconds")
	mfs, _ := reg.Gather()
	for _, mf := range mfs {
		if mf.GetName() == "sluice_fetched_total" {
			fmt.Println("fetched:", mf.GetMetric()[0].GetCounter().GetValue())
		}
	}
	fmt.Println("latency series:", n)
	// Output:
	// fetched: 3
	// latency series: 9
}
