package main

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/backpressure"
)

func TestRecorderClassifiesRuns(t *testing.T) {
	t0 := time.Unix(1000, 0)
	m := labMsg{pub: t0, deadline: t0.Add(100 * time.Millisecond), crit: backpressure.Critical}
	r := &recorder{until: t0.Add(time.Second)}
	r.run(m, t0.Add(10*time.Millisecond), t0.Add(30*time.Millisecond), true)   // on time
	r.run(m, t0.Add(90*time.Millisecond), t0.Add(110*time.Millisecond), true)  // late
	r.run(m, t0.Add(100*time.Millisecond), t0.Add(120*time.Millisecond), true) // started expired
	r.run(m, t0.Add(95*time.Millisecond), t0.Add(100*time.Millisecond), false) // cut off
	if r.good != 1 || r.goodWindow != 1 || r.late != 3 || r.wasted != 1 || r.handled != 3 {
		t.Fatalf("good %d window %d late %d wasted %d handled %d", r.good, r.goodWindow, r.late, r.wasted, r.handled)
	}
	if r.byClass[backpressure.Critical] != 1 {
		t.Fatalf("by class %v", r.byClass)
	}
	if got := r.cutCount(); got != 1 {
		t.Fatalf("cut %d, want 1", got)
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
	if c.window != 8 || c.margin != 100*time.Millisecond || len(c.steps) != 5 {
		t.Fatalf("window %d margin %v steps %v", c.window, c.margin, c.steps)
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
