package backpressure

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestCriticalityContext(t *testing.T) {
	ctx := context.Background()
	if _, ok := CriticalityFrom(ctx); ok {
		t.Fatal("bare ctx carries a class")
	}
	if _, ok := HeaderValue(ctx); ok {
		t.Fatal("bare ctx has a header value")
	}
	type k struct{}
	ctx = context.WithValue(WithCriticality(context.WithValue(ctx, k{}, "v"), SheddablePlus), k{}, "w")
	if c, ok := CriticalityFrom(ctx); !ok || c != SheddablePlus {
		t.Fatalf("got %v %v", c, ok)
	}
	if ctx.Value(k{}) != "w" {
		t.Fatal("other values lost")
	}
	v, ok := HeaderValue(ctx)
	if !ok || v != "SHEDDABLE_PLUS" {
		t.Fatalf("header %q", v)
	}
	if c, err := ParseCriticality(v); err != nil || c != SheddablePlus {
		t.Fatal("header does not round-trip")
	}
	if c, _ := CriticalityFrom(WithCriticality(ctx, Criticality(9))); c != Sheddable {
		t.Fatalf("invalid class stored as %v", c)
	}
}

func TestOverloadedMarker(t *testing.T) {
	base := errors.New("503")
	err := Overloaded(base)
	if !IsOverloaded(err) || !errors.Is(err, base) {
		t.Fatal("marker lost")
	}
	if Overloaded(err) != err {
		t.Fatal("double wrap")
	}
	if !IsOverloaded(ErrThrottled) || IsOverloaded(base) {
		t.Fatal("ErrThrottled")
	}
}

func TestRetryBudgetRatioAndSlide(t *testing.T) {
	if _, err := NewRetryBudget(RetryBudgetOptions{Ratio: 2}); !errors.Is(err, ErrInvalidOption) {
		t.Fatal("ratio 2 accepted")
	}
	b, err := NewRetryBudget(RetryBudgetOptions{}) // 10%, at least 5, 10 s
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		b.AttemptAt(t0)
	}
	ok := 0
	for range 50 {
		if b.RetryAt(t0.Add(time.Second)) {
			ok++
		}
	}
	if ok != 10 || b.Exhausted() != 40 {
		t.Fatalf("allowed %d retries (want 10%% of 100 = 10), exhausted %d", ok, b.Exhausted())
	}
	// 11 s later the first attempts and retries have slid out: only the
	// minimum allowance is left.
	later := t0.Add(11 * time.Second)
	if f, r := b.UsageAt(later); f != 0 || r != 0 {
		t.Fatalf("window did not slide: %d %d", f, r)
	}
	ok = 0
	for range 10 {
		if b.RetryAt(later) {
			ok++
		}
	}
	if ok != 5 {
		t.Fatalf("quiet window allowed %d, want 5", ok)
	}
	none, _ := NewRetryBudget(RetryBudgetOptions{MinRetries: -1})
	if none.RetryAt(t0) {
		t.Fatal("MinRetries -1 still allowed a retry with no attempts")
	}
}

// Seed 003: 3 layers × 3 attempts cost the bottom 9 (or 27). With Retrier
// the bottom sees 3: the innermost gives up marked overloaded and no outer
// layer retries.
func TestRetrierNestedLayersDoNotMultiply(t *testing.T) {
	var bottom atomic.Int64
	down := errors.New("dependency failure")
	r := &Retrier{BaseDelay: -1}
	layer := func(next func(context.Context) error) func(context.Context) error {
		return func(ctx context.Context) error { return r.Do(ctx, next) }
	}
	call := layer(layer(layer(func(context.Context) error { bottom.Add(1); return down })))
	err := call(context.Background())
	if got := bottom.Load(); got != 3 {
		t.Fatalf("bottom attempts %d, want 3", got)
	}
	if !IsOverloaded(err) || !errors.Is(err, ErrRetriesExhausted) || !errors.Is(err, down) {
		t.Fatalf("err %v", err)
	}
	t.Logf("nested 3x3x3: bottom attempts %d (naive nesting: 27)", bottom.Load())

	// A non-retryable error and an overloaded one return after 1 attempt.
	bottom.Store(0)
	perm := errors.New("bad request")
	r2 := &Retrier{BaseDelay: -1, Retryable: func(e error) bool { return !errors.Is(e, perm) }}
	if err := r2.Do(context.Background(), func(context.Context) error { bottom.Add(1); return perm }); err != perm {
		t.Fatalf("%v", err)
	}
	if err := r2.Do(context.Background(), func(context.Context) error { bottom.Add(1); return Overloaded(nil) }); err != ErrOverloaded {
		t.Fatalf("%v", err)
	}
	if bottom.Load() != 2 {
		t.Fatalf("attempts %d, want 2", bottom.Load())
	}
}

// A downstream that always fails: with a budget, total attempts stay within
// first attempts × (1 + ratio) + the minimum allowance.
func TestRetrierBudgetBoundsAttempts(t *testing.T) {
	b, _ := NewRetryBudget(RetryBudgetOptions{})
	r := &Retrier{Budget: b, BaseDelay: -1}
	var calls atomic.Int64
	const n = 1000
	budgetStops := 0
	for range n {
		err := r.Do(context.Background(), func(context.Context) error { calls.Add(1); return errors.New("down") })
		if errors.Is(err, ErrRetryBudget) {
			budgetStops++
		}
	}
	ratio := float64(calls.Load()) / n
	t.Logf("always-failing downstream: %d calls for %d requests = %.3f attempts/request, %d stopped by the budget", calls.Load(), n, ratio, budgetStops)
	if ratio > 1.1+1e-9 {
		t.Fatalf("attempts ratio %.3f > 1.1", ratio)
	}
	if budgetStops == 0 {
		t.Fatal("budget never refused")
	}
}

func TestThrottleProbabilityFormula(t *testing.T) {
	if _, err := NewThrottle(ThrottleOptions{K: 0.5}); !errors.Is(err, ErrInvalidOption) {
		t.Fatal("K<1 accepted")
	}
	never := func() float64 { return 0.999999 } // a draw that passes unless p ~ 1
	th, _ := NewThrottle(ThrottleOptions{Rand: never})
	if p := th.ProbabilityAt(t0); p != 0 {
		t.Fatalf("idle p=%v", p)
	}
	// 10 requests, 5 accepted: 10 - 2*5 = 0.
	for i := range 10 {
		th.AllowAt(t0)
		th.RecordAt(t0, i < 5)
	}
	if p := th.ProbabilityAt(t0); p != 0 {
		t.Fatalf("p=%v, want 0", p)
	}
	// 10 more, none accepted: (20 - 10) / 21.
	for range 10 {
		th.AllowAt(t0.Add(time.Second))
		th.RecordAt(t0.Add(time.Second), false)
	}
	if p, want := th.ProbabilityAt(t0.Add(time.Second)), 10.0/21; p != want {
		t.Fatalf("p=%v, want %v", p, want)
	}
	// Nothing accepted for a long time: p approaches but never reaches 1,
	// so probes keep going through.
	all, _ := NewThrottle(ThrottleOptions{})
	through := 0
	for i := range 100000 {
		if all.AllowAt(t0.Add(time.Duration(i) * time.Millisecond)) {
			through++
		}
	}
	if p := all.ProbabilityAt(t0.Add(100 * time.Second)); p >= 1 || p < 0.99 {
		t.Fatalf("p=%v", p)
	}
	if through == 0 {
		t.Fatal("no request ever got through")
	}
	// The window forgets: 2 minutes later p is 0 again, with no reset.
	if p := all.ProbabilityAt(t0.Add(100*time.Second + 2*time.Minute + 2*time.Second)); p != 0 {
		t.Fatalf("p=%v after the window", p)
	}
}

// A backend with capacity 100/s is offered 300/s for 4 minutes, then its
// capacity returns (1000/s) for 4 minutes. Simulated time, 10 ms steps.
func TestThrottleSimulatedBackend(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	th, _ := NewThrottle(ThrottleOptions{Rand: rng.Float64})
	type phase struct{ sent, accepted, offered int }
	run := func(from time.Time, d time.Duration, capacity int) (phase, phase) {
		var all, last phase
		var tokens float64
		steps := int(d / (10 * time.Millisecond))
		for s := range steps {
			now := from.Add(time.Duration(s) * 10 * time.Millisecond)
			tokens = min(tokens+float64(capacity)/100, float64(capacity)/100+1)
			for range 3 { // 300/s
				var p phase
				p.offered = 1
				if th.AllowAt(now) {
					p.sent = 1
					if tokens >= 1 {
						tokens--
						p.accepted = 1
					}
					th.RecordAt(now, p.accepted == 1)
				}
				all.offered += p.offered
				all.sent += p.sent
				all.accepted += p.accepted
				if s >= steps-6000 { // the last minute
					last.offered += p.offered
					last.sent += p.sent
					last.accepted += p.accepted
				}
			}
		}
		return all, last
	}
	_, over := run(t0, 4*time.Minute, 100)
	sentRate, accRate := float64(over.sent)/60, float64(over.accepted)/60
	t.Logf("overload (capacity 100/s, offered 300/s), last minute: backend sees %.0f/s, accepts %.0f/s, ratio %.2f (K=2), p=%.2f",
		sentRate, accRate, sentRate/accRate, th.ProbabilityAt(t0.Add(4*time.Minute)))
	if sentRate > 2.2*accRate {
		t.Fatalf("backend sees %.0f/s > ~K×accepted %.0f/s", sentRate, accRate)
	}
	if sentRate >= 290 {
		t.Fatal("throttle did not reduce the load")
	}
	_, rec := run(t0.Add(4*time.Minute), 4*time.Minute, 1000)
	pEnd := th.ProbabilityAt(t0.Add(8 * time.Minute))
	t.Logf("recovered (capacity 1000/s), last minute: backend sees %.0f/s, accepts %.0f/s, p=%.3f",
		float64(rec.sent)/60, float64(rec.accepted)/60, pEnd)
	if pEnd != 0 || rec.sent < rec.offered*99/100 {
		t.Fatalf("did not recover: p=%v, sent %d of %d", pEnd, rec.sent, rec.offered)
	}
}

// A downstream with 8 slots and service time s: latency is s up to 8
// concurrent calls and grows linearly beyond. Target 15 ms with s = 10 ms
// puts the knee at 12. When s doubles no limit can meet the target and the
// limit sinks to Min; when s recovers it ramps back additively.
func TestAdaptiveLimitConvergesAndRecovers(t *testing.T) {
	al, err := NewAdaptiveLimit(AdaptiveLimitOptions{Min: 2, Max: 64, Initial: 4, Target: 15 * time.Millisecond, Interval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	now := t0
	service := 10 * time.Millisecond
	var trace []int
	step := func(seconds int) {
		for range seconds {
			for range 50 {
				l := al.Limit()
				lat := service * time.Duration(max(8, l)) / 8
				now = now.Add(20 * time.Millisecond)
				al.ObserveAt(now, lat, ResultOK)
			}
			trace = append(trace, al.Limit())
		}
	}
	step(40)
	normal := al.Limit()
	changes := al.Changes()
	step(20)
	if al.Changes() != changes {
		t.Fatalf("limit flaps at steady state: %v", trace[40:])
	}
	service *= 2
	step(30)
	slow := al.Limit()
	service /= 2
	step(40)
	back := al.Limit()
	t.Logf("adaptive limit trace (1/s): %v", trace)
	t.Logf("normal %d, latency doubled %d, recovered %d (bounds 2..64)", normal, slow, back)
	if normal < 10 || normal > 12 {
		t.Fatalf("normal limit %d, want the knee 10..12", normal)
	}
	if slow != 2 {
		t.Fatalf("slow limit %d, want Min 2", slow)
	}
	if back != normal {
		t.Fatalf("recovered limit %d, want %d", back, normal)
	}
	// The ramp back is gradual: no step larger than Increase.
	for i := 91; i < len(trace); i++ {
		if trace[i]-trace[i-1] > 1 {
			t.Fatalf("step %d→%d", trace[i-1], trace[i])
		}
	}
}

func TestAdaptiveLimitOverloadedAndValidation(t *testing.T) {
	if _, err := NewAdaptiveLimit(AdaptiveLimitOptions{}); !errors.Is(err, ErrInvalidOption) {
		t.Fatal("Max 0 accepted")
	}
	al, _ := NewAdaptiveLimit(AdaptiveLimitOptions{Max: 10, MinSamples: 1})
	now := t0
	for i := range 5 {
		now = now.Add(time.Second)
		al.ObserveAt(now, time.Millisecond, ResultOverloaded)
		_ = i
	}
	if l := al.Limit(); l >= 10 || l < 1 {
		t.Fatalf("limit %d after overload", l)
	}
}

// The default headroom leaves critical work a slot in any pool of two or
// more: with 2 slots a sheddable route used to take both (10% of 2 rounded
// down to none).
func TestSlotsDefaultHeadroomLeavesCriticalASlot(t *testing.T) {
	for _, c := range []struct {
		n                int
		sheddable, sPlus int // most each may hold
	}{{1, 1, 1}, {2, 1, 1}, {3, 2, 2}, {4, 3, 3}, {10, 7, 9}, {20, 15, 18}} {
		for _, class := range []Criticality{Sheddable, SheddablePlus} {
			s, err := NewSlots(c.n)
			if err != nil {
				t.Fatal(err)
			}
			got := 0
			for s.TryAcquire(class) {
				got++
			}
			want := c.sheddable
			if class == SheddablePlus {
				want = c.sPlus
			}
			if got != want {
				t.Errorf("%d slots: %v took %d, want %d", c.n, class, got, want)
			}
			if got < c.n && !s.TryAcquire(Critical) {
				t.Errorf("%d slots: critical refused after %v took %d", c.n, class, got)
			}
		}
	}
	s, _ := NewSlots(10)
	if err := s.SetHeadroom(Sheddable, 0.01); err != nil {
		t.Fatal(err)
	}
	got := 0
	for s.TryAcquire(Sheddable) {
		got++
	}
	if got != 9 {
		t.Errorf("headroom 1%% of 10: sheddable took %d, want 9 (one slot kept)", got)
	}
}

func TestSlotsPriorityAndHeadroom(t *testing.T) {
	s, err := NewSlots(4)
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if !s.TryAcquire(Sheddable) {
			t.Fatal("sheddable refused below headroom")
		}
	}
	if s.TryAcquire(Sheddable) {
		t.Fatal("sheddable took the last slot (25% headroom)")
	}
	if !s.TryAcquire(Critical) {
		t.Fatal("critical refused")
	}
	// Full. One sheddable and one critical wait; the freed slot goes to the
	// critical one although it came later.
	got := make(chan Criticality, 2)
	go func() { _ = s.Acquire(context.Background(), Sheddable); got <- Sheddable }()
	waitFor(t, func() bool { return s.Waited()[Sheddable] == 1 })
	go func() { _ = s.Acquire(context.Background(), Critical); got <- Critical }()
	waitFor(t, func() bool { return s.Waited()[Critical] == 1 })
	s.Release()
	if c := <-got; c != Critical {
		t.Fatalf("%v got the slot first", c)
	}
	s.Release()
	s.Release() // now 2 held, sheddable may take one
	if c := <-got; c != Sheddable {
		t.Fatal(c)
	}
	// A waiter whose ctx ends leaves the pool unchanged.
	for s.TryAcquire(Critical) {
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
	defer cancel()
	if err := s.Acquire(ctx, CriticalPlus); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatal(err)
	}
	if s.InUse() != 4 {
		t.Fatalf("in use %d", s.InUse())
	}
	for range 4 {
		s.Release()
	}
	defer func() {
		if recover() == nil {
			t.Fatal("over-release did not panic")
		}
	}()
	s.Release()
}

func TestWindowSetLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := mustWindow(t, 8, 1000)
		if w.SetLimit(2) != 2 || w.Limit() != 2 {
			t.Fatal("SetLimit")
		}
		if !w.TryAcquire(1, 1) || !w.TryAcquire(1, 1) || w.TryAcquire(1, 1) {
			t.Fatal("limit 2 not enforced")
		}
		got := make(chan int, 1)
		go func() { n, _, _ := w.WaitFreeAtLeast(context.Background(), 4); got <- n }()
		synctest.Wait() // the waiter is blocked
		w.SetLimit(100) // clamped to 8, wakes the waiter
		if n := <-got; n != 6 {
			t.Fatalf("free %d, want 6", n)
		}
		if w.Limit() != 8 || w.SetLimit(0) != 1 {
			t.Fatal("clamp")
		}
		// A limit below the low-water mark must not wait forever.
		w.Release(2, 2)
		n, _, err := w.WaitFreeAtLeast(context.Background(), 4)
		if err != nil || n != 1 {
			t.Fatalf("free %d (%v) with limit 1 and nothing held, want 1", n, err)
		}
	})
}

// After an overload ends, both limits ramp back one step per interval (no
// step back to full load), and the sheddable route, with the longer
// Cooldown, reaches full concurrency last.
func TestRecoveryRampLowCriticalityLast(t *testing.T) {
	mk := func(cooldown int) *AdaptiveLimit {
		al, err := NewAdaptiveLimit(AdaptiveLimitOptions{Min: 1, Max: 10, Target: 50 * time.Millisecond, MinSamples: 1, Cooldown: cooldown})
		if err != nil {
			t.Fatal(err)
		}
		return al
	}
	crit, shed := mk(1), mk(5)
	now := t0
	tick := func(lat time.Duration, r Result) {
		now = now.Add(time.Second)
		crit.ObserveAt(now, lat, r)
		shed.ObserveAt(now, lat, r)
	}
	tick(time.Millisecond, ResultOK)
	for range 10 {
		tick(time.Millisecond, ResultOverloaded)
	}
	if crit.Limit() != 1 || shed.Limit() != 1 {
		t.Fatalf("overload: %d %d", crit.Limit(), shed.Limit())
	}
	var critFull, shedFull int
	prevC, prevS := 1, 1
	for i := 1; i <= 30; i++ {
		tick(10*time.Millisecond, ResultOK)
		if crit.Limit()-prevC > 1 || shed.Limit()-prevS > 1 {
			t.Fatalf("stepped: %d→%d, %d→%d", prevC, crit.Limit(), prevS, shed.Limit())
		}
		prevC, prevS = crit.Limit(), shed.Limit()
		if critFull == 0 && prevC == 10 {
			critFull = i
		}
		if shedFull == 0 && prevS == 10 {
			shedFull = i
		}
	}
	t.Logf("full concurrency after overload: critical at interval %d, sheddable at %d", critFull, shedFull)
	if critFull == 0 || shedFull <= critFull {
		t.Fatalf("critical %d, sheddable %d", critFull, shedFull)
	}
}
