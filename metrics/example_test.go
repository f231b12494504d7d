package metrics_test

import (
	"context"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/metrics"
	"github.com/sluice-go/sluice/sluicetest"
)

func Example() {
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg)
	if err != nil {
		panic(err)
	}
	src := sluicetest.NewSource()
	for i := range 3 {
		src.Publish(fmt.Sprint(i), []byte("hello"), nil, time.Now())
	}
	c, err := consumer.New(consumer.Options{Observer: obs}, consumer.Route{
		Name:    "greetings",
		Source:  src,
		Workers: 1,
		Handler: func(context.Context, *consumer.Message) error { return nil },
		Window:  consumer.WindowPolicy{Messages: 4, Bytes: 1 << 20},
	})
	if err != nil {
		panic(err)
	}
	_, err = sluicetest.RunUntil(context.Background(), c, 10*time.Second, func(s []consumer.RouteStats) bool {
		return s[0].Settled[consumer.OutcomeSucceeded] == 3
	})
	if err != nil {
		panic(err)
	}

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
	// latency series: 10
}
