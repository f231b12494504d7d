package consumer

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/backpressure"
)

func TestLatenciesLearn(t *testing.T) {
	var l latencies
	if _, _, ok := l.estimate(); ok {
		t.Fatal("an estimate before any run")
	}
	t0 := time.Unix(1000, 0)
	// The first runs count one by one.
	l.observe(t0, 30*time.Millisecond)
	if m, h, ok := l.estimate(); !ok || m != 30*time.Millisecond || h != 30*time.Millisecond {
		t.Fatalf("after one run: %v %v %v", m, h, ok)
	}
	// 1000 runs of 20 ms with every 50th at 100 ms: the ring holds the
	// last 256, of which 5 or 6 are slow: p99 is 100 ms, the mean ~21.6 ms.
	for i := range 1000 {
		d := 20 * time.Millisecond
		if i%50 == 49 {
			d = 100 * time.Millisecond
		}
		l.observe(t0.Add(time.Duration(i)*time.Millisecond), d)
	}
	m, h, _ := l.estimate()
	if h != 100*time.Millisecond || m < 21*time.Millisecond || m > 22*time.Millisecond {
		t.Fatalf("mean %v, p99 %v", m, h)
	}
	// The handler gets faster: within the ring's length the estimate follows.
	for i := range 256 {
		l.observe(t0.Add(2*time.Second+time.Duration(i)*recomputeEvery), 5*time.Millisecond)
	}
	if m, h, _ := l.estimate(); m != 5*time.Millisecond || h != 5*time.Millisecond {
		t.Fatalf("after the change: mean %v, p99 %v", m, h)
	}
}

func TestPlanWait(t *testing.T) {
	now := time.Unix(1000, 0)
	p := newPredictor(3)
	p.lat.observe(now, 20*time.Millisecond)
	// Worker 0 idle, worker 1 started 5 ms ago, worker 2 runs a message
	// without a deadline (half a run left, by assumption).
	p.busy[1].Store(now.Add(-5 * time.Millisecond).UnixNano())
	p.busy[2].Store(busyUntimed)
	pl := p.plan(now)
	for pos, want := range []time.Duration{0, 10, 15, 20, 30, 35, 40} {
		if got := pl.wait(pos); got != want*time.Millisecond {
			t.Errorf("wait(%d) = %v, want %v", pos, got, want*time.Millisecond)
		}
	}
	// Position 2 starts after 15 ms and needs 20 ms + 3 ms of margin.
	if pl.lateAt(now, now.Add(38*time.Millisecond), 2, 1) || !pl.lateAt(now, now.Add(37*time.Millisecond), 2, 1) {
		t.Error("lateAt: want on time with 38 ms, late with 37 ms")
	}
	if p.tooLate(now, now.Add(23*time.Millisecond), 1) || !p.tooLate(now, now.Add(22*time.Millisecond), 1) {
		t.Error("tooLate: want on time with 23 ms left, late with 22 ms")
	}
	// Without a run learned there is no prediction.
	if q := newPredictor(1); q.plan(now).lateAt(now, now, 5, 1) || q.tooLate(now, now, 1) {
		t.Error("a prediction before any run")
	}
}

func never() bool { return false }

func TestDrainWindowGrowsAndShrinks(t *testing.T) {
	d := drainWindow{on: true, lo: 8, hi: 256, limit: 8}
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	if l := d.observe(at(0), 8, 8, 8, never); l != 8 {
		t.Fatalf("decided within the first interval: %d", l)
	}
	// Half of each batch dropped: the limit doubles each interval, to hi.
	for i, want := range []int{16, 32, 64, 128, 256, 256} {
		if l := d.observe(at(100*(i+1)), 8, 8, 4, never); l != want {
			t.Fatalf("interval %d: limit %d, want %d", i+1, l, want)
		}
	}
	// 10% dropped: hold.
	if l := d.observe(at(700), 100, 100, 10, never); l != 256 {
		t.Fatalf("10%% dropped: %d", l)
	}
	// No drops: halve back to lo.
	for i, want := range []int{128, 64, 32, 16, 8, 8} {
		if l := d.observe(at(800+100*i), 8, 16, 0, never); l != want {
			t.Fatalf("no drops, interval %d: limit %d, want %d", i, l, want)
		}
	}
}

// Without drops, the window doubles while fetches come back full and the
// workers run dry (a backlog the window starves them of), holds once they
// no longer run dry, holds while fetches are full, and halves back once
// they come back short (no backlog).
func TestDrainWindowGrowsWhileWorkersStarve(t *testing.T) {
	d := drainWindow{on: true, lo: 16, hi: 256, limit: 16}
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	dry := true
	ranDry := func() bool { return dry }
	d.observe(at(0), 4, 4, 0, ranDry)
	for i, want := range []int{32, 64, 128, 256, 256} {
		if l := d.observe(at(100*(i+1)), 4, 4, 0, ranDry); l != want {
			t.Fatalf("full and dry, interval %d: limit %d, want %d", i+1, l, want)
		}
	}
	d.limit = 64
	dry = false
	if l := d.observe(at(600), 64, 64, 0, ranDry); l != 64 {
		t.Fatalf("full, not dry: limit %d, want it held at 64", l)
	}
	dry = true
	if l := d.observe(at(700), 10, 64, 0, ranDry); l != 32 {
		t.Fatalf("dry but short (no backlog): limit %d, want it halved to 32", l)
	}
}

func TestUnitsOf(t *testing.T) {
	w, _ := backpressure.NewWindow(400, 1<<20)
	r := &route{window: w}
	r.cfg.Window.Messages = 400
	m := func(h Headers) *Message { return &Message{Headers: h} }
	if u := r.unitsOf(m(nil)); u != 1 {
		t.Fatalf("without a cost policy: %d units", u)
	}
	r.cfg.Window.Cost = CostPolicy{Header: CostHeader, Class: func(m *Message) string { return m.Headers.Get("kind") }}
	for _, c := range []struct {
		h    Headers
		want int
	}{
		{Headers{CostHeader: {"7"}}, 7},
		{Headers{CostHeader: {"5000"}}, 100}, // capped at a quarter of the window
		{Headers{CostHeader: {"junk"}}, 1},   // nothing learned yet: one unit
		{Headers{"kind": {"report"}}, 1},
	} {
		if u := r.unitsOf(m(c.h)); u != c.want {
			t.Errorf("%v: %d units, want %d", c.h, u, c.want)
		}
	}
	// Learned: reports take ~40 ms (EWMA, 1/8 per run).
	r.costs.observe("report", 40*time.Millisecond)
	r.costs.observe("report", 48*time.Millisecond)
	if u := r.unitsOf(m(Headers{"kind": {"report"}})); u != 41 {
		t.Errorf("learned report: %d units, want 41 (41 ms at 1 ms a unit)", u)
	}
	// Never more than the limit in force.
	w.SetLimit(10)
	if u := r.unitsOf(m(Headers{CostHeader: {"50"}})); u != 10 {
		t.Errorf("limit 10: %d units", u)
	}
}

// Under a resource cap of c running messages the plan has c slots, not a
// slot per worker: an idle worker does not take a message while c run.
func TestPlanCountsTheResourceCap(t *testing.T) {
	now := time.Unix(1000, 0)
	p := newPredictor(4)
	p.lat.observe(now, 20*time.Millisecond)
	p.slots.Store(2)
	// Workers 0 and 1 started 5 and 15 ms ago (15 and 5 ms left), 2 and
	// 3 idle: both slots are taken.
	p.busy[0].Store(now.Add(-5 * time.Millisecond).UnixNano())
	p.busy[1].Store(now.Add(-15 * time.Millisecond).UnixNano())
	pl := p.plan(now)
	for pos, want := range []time.Duration{5, 15, 25, 35} {
		if got := pl.wait(pos); got != want*time.Millisecond {
			t.Errorf("two running, cap 2: wait(%d) = %v, want %v", pos, got, want*time.Millisecond)
		}
	}
	// One running: one slot free now.
	p.busy[0].Store(0)
	pl = p.plan(now)
	for pos, want := range []time.Duration{0, 5, 20, 25} {
		if got := pl.wait(pos); got != want*time.Millisecond {
			t.Errorf("one running, cap 2: wait(%d) = %v, want %v", pos, got, want*time.Millisecond)
		}
	}
	// Three running after the cap fell to 2: a slot frees when two of
	// them have finished.
	p.busy[0].Store(now.Add(-5 * time.Millisecond).UnixNano())
	p.busy[2].Store(now.Add(-10 * time.Millisecond).UnixNano())
	pl = p.plan(now)
	for pos, want := range []time.Duration{10, 15, 30} {
		if got := pl.wait(pos); got != want*time.Millisecond {
			t.Errorf("three running, cap 2: wait(%d) = %v, want %v", pos, got, want*time.Millisecond)
		}
	}
	// No cap: a slot per worker.
	p.slots.Store(0)
	if pl = p.plan(now); len(pl.free) != 4 || pl.wait(0) != 0 {
		t.Errorf("no cap: %v", pl.free)
	}
}
