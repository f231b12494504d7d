package backpressure

import (
	"context"
	"testing"
	"time"
)

func TestComputePressure(t *testing.T) {
	base := PressureSignals{Limit: 10, Fetched: 1000, Dropped: 100}
	for _, c := range []struct {
		name string
		s    PressureSignals
		want Pressure
	}{
		{"idle", PressureSignals{Limit: 10, Fetched: 1000, Dropped: 100}, Pressure{}},
		{"window 9 of 10", PressureSignals{InUse: 9, Limit: 10, Fetched: 1100, Dropped: 100}, Pressure{PressureElevated, CauseSaturated}},
		{"3% dropped", PressureSignals{Limit: 10, Fetched: 1100, Dropped: 103}, Pressure{PressureElevated, CauseDropping}},
		{"10% dropped", PressureSignals{Limit: 10, Fetched: 1100, Dropped: 110}, Pressure{PressureHigh, CauseDropping}},
		{"wait 30% of slack", PressureSignals{Limit: 10, Fetched: 1000, Dropped: 100, QueueWait: 30, Slack: 100}, Pressure{PressureElevated, CauseQueueWait}},
		{"wait 80% of slack, full", PressureSignals{InUse: 10, Limit: 10, Fetched: 1000, Dropped: 100, QueueWait: 80, Slack: 100},
			Pressure{PressureHigh, CauseQueueWait | CauseSaturated}},
		{"throttle 0.05", PressureSignals{Limit: 10, Fetched: 1000, Dropped: 100, Throttle: 0.05}, Pressure{PressureElevated, CauseThrottled}},
		{"throttle 0.5", PressureSignals{Limit: 10, Fetched: 1000, Dropped: 100, Throttle: 0.5}, Pressure{PressureHigh, CauseThrottled}},
		{"resource 0.95", PressureSignals{Limit: 10, Fetched: 1000, Dropped: 100, Resource: 0.95}, Pressure{PressureElevated, CauseResource}},
		{"resource 1.2", PressureSignals{Limit: 10, Fetched: 1000, Dropped: 100, Resource: 1.2}, Pressure{PressureHigh, CauseResource}},
	} {
		if got := ComputePressure(base, c.s); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// Pressure rises at once and falls only after the signals stayed low for
// Hold.
func TestPressureGaugeHysteresis(t *testing.T) {
	var s PressureSignals
	s.Limit = 10
	g, err := NewPressureGauge(PressureOptions{}, func() PressureSignals { return s })
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	if p := g.LoadAt(at(0)); p.Level != PressureNormal {
		t.Fatalf("idle: %v", p)
	}
	s.Fetched, s.Dropped = 100, 50
	if p := g.LoadAt(at(50)); p.Level != PressureNormal {
		t.Fatalf("evaluated again within the interval: %v", p)
	}
	if p := g.LoadAt(at(100)); p != (Pressure{PressureHigh, CauseDropping}) {
		t.Fatalf("dropping: %v", p)
	}
	// The drops stop; the window stays full for a while: still High (held),
	// then Elevated once held for Hold, then Normal after another Hold.
	s.InUse = 10
	for ms := 200; ms < 1200; ms += 100 {
		if p := g.LoadAt(at(ms)); p.Level != PressureHigh {
			t.Fatalf("at %d ms: %v, want high held", ms, p)
		}
	}
	if p := g.LoadAt(at(1200)); p != (Pressure{PressureElevated, CauseSaturated}) {
		t.Fatalf("after the hold: %v", p)
	}
	s.InUse = 0
	if p := g.LoadAt(at(1300)); p.Level != PressureElevated {
		t.Fatalf("the window emptied just now: %v", p)
	}
	if p := g.LoadAt(at(2300)); p.Level != PressureNormal {
		t.Fatalf("a hold later: %v", p)
	}
	if n := g.Changes(); n != 3 {
		t.Fatalf("%d level changes, want 3", n)
	}
	// A short dip does not lower the level.
	s.Dropped += 100
	s.Fetched += 100
	g.LoadAt(at(2400))
	s.Fetched += 100
	g.LoadAt(at(2500))
	s.Dropped += 100
	s.Fetched += 100
	if p := g.LoadAt(at(2600)); p.Level != PressureHigh || g.Changes() != 4 {
		t.Fatalf("flapped: %v, %d changes", p, g.Changes())
	}
}

func TestPressureFrom(t *testing.T) {
	if p := PressureFrom(context.Background()); p != (Pressure{}) {
		t.Fatalf("without a gauge: %v", p)
	}
	g, _ := NewPressureGauge(PressureOptions{}, func() PressureSignals { return PressureSignals{InUse: 4, Limit: 4} })
	ctx := WithPressure(WithCriticality(context.Background(), Critical), g)
	if p := PressureFrom(ctx); p.Level != PressureElevated || p.String() != "elevated (saturated)" {
		t.Fatalf("%v", p)
	}
	if c, _ := CriticalityFrom(ctx); c != Critical {
		t.Fatalf("criticality lost: %v", c)
	}
	if _, err := NewPressureGauge(PressureOptions{Hold: -1}, nil); err == nil {
		t.Fatal("bad options accepted")
	}
}
