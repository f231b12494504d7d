package metrics_test

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/metrics"
)

func TestOverloadMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	info := consumer.RouteInfo{Name: "r", Criticality: backpressure.Critical, WindowMessages: 16}
	s := consumer.RouteStats{RouteInfo: info,
		Overload: consumer.OverloadStats{RetryBudgetExhausted: 7, ThrottleProbability: 0.25, ThrottleRefused: 40},
		Window:   consumer.WindowStats{Limit: 5, Adaptive: true}}
	s.Overload.Shed[consumer.ShedQueueFull][backpressure.Sheddable] = 3
	s.Overload.Shed[consumer.ShedNearDeadline][backpressure.Critical] = 2
	obs.ObserveRoute(info, func() consumer.RouteStats { return s })
	want := `
# HELP sluice_adaptive_limit Message limit in force set by the route's adaptive concurrency limit.
# TYPE sluice_adaptive_limit gauge
sluice_adaptive_limit{criticality="CRITICAL",route="r"} 5
# HELP sluice_retry_budget_exhausted_total Retryable failures the retry budget refused to retry.
# TYPE sluice_retry_budget_exhausted_total counter
sluice_retry_budget_exhausted_total{criticality="CRITICAL",route="r"} 7
# HELP sluice_throttle_probability Local reject probability of the route's adaptive throttle.
# TYPE sluice_throttle_probability gauge
sluice_throttle_probability{criticality="CRITICAL",route="r"} 0.25
# HELP sluice_throttle_refused_total Window slots the route's throttle kept the pull from filling.
# TYPE sluice_throttle_refused_total counter
sluice_throttle_refused_total{criticality="CRITICAL",route="r"} 40
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_adaptive_limit",
		"sluice_retry_budget_exhausted_total", "sluice_throttle_probability", "sluice_throttle_refused_total"); err != nil {
		t.Error(err)
	}
	if n, err := testutil.GatherAndCount(reg, "sluice_shed_total"); err != nil || n != 8 {
		t.Fatalf("shed series %d (%v), want 2 reasons × 4 classes", n, err)
	}
	mfs, _ := reg.Gather()
	got := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() == "sluice_shed_total" {
			for _, m := range mf.GetMetric() {
				got[label(m, "reason")+"/"+label(m, "class")] = m.GetCounter().GetValue()
			}
		}
	}
	if got["queue_full/SHEDDABLE"] != 3 || got["near_deadline/CRITICAL"] != 2 || got["queue_full/CRITICAL"] != 0 {
		t.Fatalf("shed %v", got)
	}
	if probs, err := testutil.GatherAndLint(reg); err != nil || len(probs) > 0 {
		t.Fatalf("lint %v %v", probs, err)
	}
}

func TestPressureAndPredictionMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg)
	if err != nil {
		t.Fatal(err)
	}
	info := consumer.RouteInfo{Name: "r", Criticality: backpressure.Critical, WindowMessages: 16}
	s := consumer.RouteStats{RouteInfo: info, Overload: consumer.OverloadStats{
		ExpiredEarly: 9, HandlerP99: 25 * time.Millisecond,
		Pressure: backpressure.Pressure{Level: backpressure.PressureHigh, Causes: backpressure.CauseSaturated | backpressure.CauseDropping},
	}}
	obs.ObserveRoute(info, func() consumer.RouteStats { return s })
	want := `
# HELP sluice_expired_early_total Messages settled as expired before their deadline because they were predicted to finish after it (predictive expiry); also in settled_total{outcome="expired"}.
# TYPE sluice_expired_early_total counter
sluice_expired_early_total{criticality="CRITICAL",route="r"} 9
# HELP sluice_handler_p99_seconds The 99th percentile of handler latency the route has learned from its recent runs on messages with a deadline (what predictive expiry uses); 0 before the first.
# TYPE sluice_handler_p99_seconds gauge
sluice_handler_p99_seconds{criticality="CRITICAL",route="r"} 0.025
# HELP sluice_pressure_cause 1 for each cause of the route's pressure level now, else 0.
# TYPE sluice_pressure_cause gauge
sluice_pressure_cause{cause="dropping",criticality="CRITICAL",route="r"} 1
sluice_pressure_cause{cause="queue_wait",criticality="CRITICAL",route="r"} 0
sluice_pressure_cause{cause="resource",criticality="CRITICAL",route="r"} 0
sluice_pressure_cause{cause="saturated",criticality="CRITICAL",route="r"} 1
sluice_pressure_cause{cause="throttled",criticality="CRITICAL",route="r"} 0
# HELP sluice_pressure_level How pressed the route is, as backpressure.PressureFrom tells its handlers: 0 normal, 1 elevated, 2 high.
# TYPE sluice_pressure_level gauge
sluice_pressure_level{criticality="CRITICAL",route="r"} 2
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "sluice_expired_early_total", "sluice_handler_p99_seconds",
		"sluice_pressure_cause", "sluice_pressure_level"); err != nil {
		t.Error(err)
	}
	if probs, err := testutil.GatherAndLint(reg); err != nil || len(probs) > 0 {
		t.Fatalf("lint %v %v", probs, err)
	}
}
