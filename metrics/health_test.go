package metrics_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/metrics"
	"github.com/sluice-go/sluice/sluicetest"
)

const stateHelp = `# HELP sluice_route_state 1 for the route's state now (consumer.Consumer.Health: stopped, failed, not_ready, stuck, shedding, progressing, idle), else 0. The reason in words is on /readyz (package health).
# TYPE sluice_route_state gauge
`

func stateWant(route, now string) string {
	var b strings.Builder
	b.WriteString(stateHelp)
	for _, s := range consumer.RouteStates() {
		v := "0"
		if s.String() == now {
			v = "1"
		}
		b.WriteString(`sluice_route_state{criticality="CRITICAL",route="` + route + `",state="` + s.String() + `"} ` + v + "\n")
	}
	return b.String()
}

// sluice_route_state follows Consumer.Health: stopped before Run, idle,
// stuck while a handler hangs past StuckAfter, idle again after it returns.
func TestRouteStateMetric(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	src := sluicetest.NewSource()
	release := make(chan struct{})
	c, err := consumer.New(consumer.Options{Observer: obs, Health: consumer.HealthPolicy{StuckAfter: 100 * time.Millisecond}}, consumer.Route{
		Name: "orders", Source: src, Workers: 1,
		Handler:  func(context.Context, *consumer.Message) error { <-release; return nil },
		Overload: consumer.OverloadPolicy{Criticality: backpressure.Critical},
	})
	if err != nil {
		t.Fatal(err)
	}
	expect := func(state string) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			err := testutil.GatherAndCompare(reg, strings.NewReader(stateWant("orders", state)), "sluice_route_state")
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	expect("stopped")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	expect("idle")
	src.Publish("m", nil, nil, time.Time{})
	expect("stuck")
	close(release)
	expect("idle")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	expect("stopped")
	probs, err := testutil.GatherAndLint(reg, "sluice_route_state", "sluice_route_state_since_seconds")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range probs {
		t.Errorf("lint: %s: %s", p.Metric, p.Text)
	}
}
