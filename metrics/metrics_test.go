package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/metrics"
	"github.com/sluice-go/sluice/sluicetest"
)

func TestConsumerMetrics(t *testing.T) {
	const n, bad = 50, 5
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	src := sluicetest.NewSource()
	for i := range n {
		src.Publish(fmt.Sprintf("m%d", i), []byte("x"), nil, time.Now())
	}
	c, err := consumer.New(consumer.Options{Observer: obs}, consumer.Route{
		Name:    "orders",
		Source:  src,
		Workers: 4,
		Handler: func(_ context.Context, m *consumer.Message) error {
			var i int
			fmt.Sscanf(string(m.Key), "m%d", &i)
			if i%(n/bad) == 0 {
				return consumer.Permanent(errors.New("bad"))
			}
			return nil
		},
		Window:   consumer.WindowPolicy{Messages: 8, Bytes: 1 << 20},
		Overload: consumer.OverloadPolicy{Criticality: backpressure.Critical},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s := c.Stats()[0]
		if s.Settled[consumer.OutcomeSucceeded]+s.Settled[consumer.OutcomeTerminated] == n {
			break
		}
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("not settled: %+v", s)
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}

	want := fmt.Sprintf(`
# HELP sluice_fetched_total Messages fetched from the source.
# TYPE sluice_fetched_total counter
sluice_fetched_total{criticality="CRITICAL",route="orders"} %d
`, n)
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_fetched_total"); err != nil {
		t.Error(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	settled := map[string]float64{}
	var histCount uint64
	for _, mf := range mfs {
		switch mf.GetName() {
		case "sluice_settled_total":
			for _, m := range mf.GetMetric() {
				settled[label(m, "outcome")] = m.GetCounter().GetValue()
			}
		case "sluice_handler_duration_seconds":
			for _, m := range mf.GetMetric() {
				histCount += m.GetHistogram().GetSampleCount()
			}
		}
	}
	if settled["succeeded"] != n-bad || settled["terminated"] != bad {
		t.Errorf("settled = %v, want succeeded %d terminated %d", settled, n-bad, bad)
	}
	if len(settled) != len(consumer.Outcomes()) {
		t.Errorf("settled has %d outcomes, want %d", len(settled), len(consumer.Outcomes()))
	}
	if histCount != n {
		t.Errorf("histogram count = %d, want %d", histCount, n)
	}
	if got, err := testutil.GatherAndCount(reg, "sluice_goodput_total"); err != nil || got != 1 {
		t.Errorf("goodput series = %d, %v", got, err)
	}
	probs, err := testutil.GatherAndLint(reg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range probs {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

func TestRegisterTwice(t *testing.T) {
	reg := prometheus.NewRegistry()
	if _, err := metrics.New(reg); err != nil {
		t.Fatal(err)
	}
	if _, err := metrics.New(reg); err == nil {
		t.Fatal("second New on one registry: want error")
	}
}

func TestConstLabels(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg, metrics.WithConstLabels(prometheus.Labels{"service": "billing"}))
	if err != nil {
		t.Fatal(err)
	}
	obs.ObserveRoute(consumer.RouteInfo{Name: "r", WindowMessages: 3}, func() consumer.RouteStats {
		return consumer.RouteStats{RouteInfo: consumer.RouteInfo{Name: "r", WindowMessages: 3}}
	}).HandlerDone(consumer.OutcomeSucceeded, time.Millisecond)
	want := `
# HELP sluice_window_limit_messages The route window's message limit.
# TYPE sluice_window_limit_messages gauge
sluice_window_limit_messages{criticality="SHEDDABLE",route="r",service="billing"} 3
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_window_limit_messages"); err != nil {
		t.Error(err)
	}
}

// A batch route exports, per batch, its size, linger and run time; a
// route with a Handler exports none of them.
func TestBatchMetrics(t *testing.T) {
	const n = 120
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	src := sluicetest.NewSource()
	for i := range n {
		src.Publish(fmt.Sprintf("m%d", i), []byte("x"), nil, time.Time{})
	}
	c, err := consumer.New(consumer.Options{Observer: obs},
		consumer.Route{Name: "bulk", Source: src, Workers: 1, Batch: consumer.BatchPolicy{MaxMessages: 50},
			BatchHandler: func(context.Context, *consumer.Batch) error { return nil }},
		consumer.Route{Name: "single", Source: sluicetest.NewSource(),
			Handler: func(context.Context, *consumer.Message) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	stats, err := sluicetest.RunUntil(context.Background(), c, 10*time.Second, func(s []consumer.RouteStats) bool {
		return s[0].Settled[consumer.OutcomeSucceeded] == n
	})
	if err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*dto.Histogram{}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "sluice_batch_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "route" && l.GetValue() != "bulk" {
					t.Fatalf("%s has route %q", mf.GetName(), l.GetValue())
				}
			}
			got[mf.GetName()] = m.GetHistogram()
		}
	}
	batches := stats[0].Batch.Batches
	size := got["sluice_batch_messages"]
	if len(got) != 3 || size.GetSampleCount() != batches || size.GetSampleSum() != n ||
		got["sluice_batch_duration_seconds"].GetSampleCount() != batches || got["sluice_batch_linger_seconds"].GetSampleCount() != batches {
		t.Fatalf("histograms %v, %d batches", got, batches)
	}
}
