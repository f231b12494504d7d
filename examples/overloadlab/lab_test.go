package main

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/backpressure"
)

func TestRecorderClassifiesRuns(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m := labMsg{pub: t0, deadline: t0.Add(100 * time.Millisecond), crit: backpressure.Critical}
	r := &recorder{}
	r.run(m, t0.Add(10*time.Millisecond), t0.Add(30*time.Millisecond), true, false)   // on time
	r.run(m, t0.Add(90*time.Millisecond), t0.Add(110*time.Millisecond), true, false)  // late
	r.run(m, t0.Add(100*time.Millisecond), t0.Add(120*time.Millisecond), true, true)  // started expired
	r.run(m, t0.Add(95*time.Millisecond), t0.Add(100*time.Millisecond), false, false) // cut off
	all := summarize(r.snapshot(), window{from: t0, until: t0.Add(time.Second)}, nil)
	if all.good != 1 || all.late != 3 || all.wasted != 1 || all.handled != 3 || all.degraded != 1 {
		t.Fatalf("all: %+v", all)
	}
	if all.p50 != 110*time.Millisecond || all.p99 != 120*time.Millisecond {
		t.Fatalf("p50 %v p99 %v", all.p50, all.p99)
	}
	// Only runs ending inside the window count.
	early := summarize(r.snapshot(), window{from: t0, until: t0.Add(105 * time.Millisecond)}, nil)
	if early.good != 1 || early.late != 1 || early.handled != 1 {
		t.Fatalf("early window: %+v", early)
	}
	if got := r.cutCount(); got != 1 {
		t.Fatalf("cut %d, want 1", got)
	}
}

func TestPhasesDue(t *testing.T) {
	s := trialSpec{phases: []phase{{time.Second, 100}, {2 * time.Second, 10}}}
	for _, c := range []struct {
		el   time.Duration
		want int
	}{{0, 0}, {500 * time.Millisecond, 50}, {time.Second, 100}, {2 * time.Second, 110}, {10 * time.Second, 120}} {
		if got := s.due(c.el); got != c.want {
			t.Errorf("due(%v) = %d, want %d", c.el, got, c.want)
		}
	}
	if s.total() != 3*time.Second {
		t.Errorf("total %v", s.total())
	}
}

func TestStartByMargin(t *testing.T) {
	for _, c := range []struct{ cost, deadline, want time.Duration }{
		{20 * time.Millisecond, 500 * time.Millisecond, 100 * time.Millisecond}, // deadline/5
		{50 * time.Millisecond, 500 * time.Millisecond, 100 * time.Millisecond}, // 2×cost
		{50 * time.Millisecond, 100 * time.Millisecond, 50 * time.Millisecond},  // capped at deadline − cost
		{2 * time.Millisecond, 100 * time.Millisecond, 20 * time.Millisecond},
	} {
		if got := startByMargin(c.cost, c.deadline); got != c.want {
			t.Errorf("startByMargin(%v, %v) = %v, want %v", c.cost, c.deadline, got, c.want)
		}
	}
}

func TestPercentile(t *testing.T) {
	var d []time.Duration
	for i := 100; i >= 1; i-- {
		d = append(d, time.Duration(i)*time.Millisecond)
	}
	if p := percentile(d, 0.5); p != 50*time.Millisecond {
		t.Errorf("p50 %v", p)
	}
	if p := percentile(d, 0.99); p != 99*time.Millisecond {
		t.Errorf("p99 %v", p)
	}
	if p := percentile(nil, 0.99); p != 0 {
		t.Errorf("empty p99 %v", p)
	}
}

func TestEncodeDecode(t *testing.T) {
	m := labMsg{id: 42, pub: time.Unix(5, 6), deadline: time.Unix(7, 8), crit: backpressure.Sheddable}
	got, ok := decode(m.encode(64))
	if !ok || got.id != m.id || !got.pub.Equal(m.pub) || !got.deadline.Equal(m.deadline) || got.crit != m.crit {
		t.Fatalf("round trip %+v -> %+v", m, got)
	}
	if _, ok := decode([]byte("short")); ok {
		t.Fatal("decoded a short payload")
	}
}

func TestParseFlagsDefaults(t *testing.T) {
	c, err := parseFlags(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if c.windowFor(c.workers) != 8 || c.marginFor(c.cost, c.deadline) != 100*time.Millisecond || len(c.steps) != 5 || len(c.kinds) != 4 {
		t.Fatalf("window %d margin %v steps %v kinds %v", c.windowFor(c.workers), c.marginFor(c.cost, c.deadline), c.steps, c.kinds)
	}
	if _, err := parseFlags([]string{"-consumers", "minimal,nope"}, nil); err == nil {
		t.Fatal("bad consumer accepted")
	}
	g, err := parseFlags([]string{"-mode", "grid", "-quick"}, nil)
	if err != nil || len(g.grid.costList) != 1 || len(g.grid.loadList) != 2 || g.grid.measure != time.Second {
		t.Fatalf("quick grid: %v %+v", err, g.grid)
	}
	if _, err := parseFlags([]string{"-steps", "1,x"}, nil); err == nil {
		t.Fatal("bad steps accepted")
	}
	if _, err := parseFlags([]string{"-mode", "nope"}, nil); err == nil {
		t.Fatal("bad mode accepted")
	}
	q, err := parseFlags([]string{"-quick"}, nil)
	if err != nil || q.stepDur != 2*time.Second || len(q.steps) != 3 {
		t.Fatalf("quick: %v %v %v", err, q.stepDur, q.steps)
	}
}
