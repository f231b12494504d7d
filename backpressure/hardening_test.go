package backpressure

import (
	"context"
	"errors"
	"math"
	"testing"
	"testing/synctest"
	"time"
)

// A negative Retrier.MaxDelay used to reach rand.N with a non-positive
// argument and panic on the first retry; it now means no delay. In fake
// time, so "no delay" is exact: a wall-clock bound (500 ms) is what a
// descheduled test on a loaded machine can exceed without any sleep.
func TestRetrierNegativeMaxDelayDoesNotPanic(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := Retrier{MaxDelay: -1}
		calls := 0
		fail := errors.New("down")
		start := time.Now()
		err := r.Do(context.Background(), func(context.Context) error { calls++; return fail })
		if calls != 3 || !errors.Is(err, ErrRetriesExhausted) || !IsOverloaded(err) || !errors.Is(err, fail) {
			t.Fatalf("calls %d err %v", calls, err)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("negative MaxDelay slept %v", d)
		}
	})
}

// NaN slipped through range checks written as "x < lo || x > hi": a NaN
// throttle K rejected every request forever, a NaN retry ratio allowed
// every retry, a NaN backoff made the limit garbage.
func TestNaNOptionsRefused(t *testing.T) {
	nan := math.NaN()
	if _, err := NewThrottle(ThrottleOptions{K: nan}); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("throttle K NaN: %v", err)
	}
	if _, err := NewRetryBudget(RetryBudgetOptions{Ratio: nan}); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("retry ratio NaN: %v", err)
	}
	if _, err := NewAdaptiveLimit(AdaptiveLimitOptions{Max: 4, Backoff: nan}); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("adaptive backoff NaN: %v", err)
	}
	if _, err := NewAdaptiveLimit(AdaptiveLimitOptions{Max: 4, Tolerance: nan}); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("adaptive tolerance NaN: %v", err)
	}
}

// CapMax lowers Max and the limit in force, never below Min, and a larger
// value changes nothing; the decrease then works from the capped value.
func TestAdaptiveCapMax(t *testing.T) {
	al, err := NewAdaptiveLimit(AdaptiveLimitOptions{Min: 2, Max: 1000, MinSamples: 1, Interval: time.Second, Target: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if l := al.CapMax(2000); l != 1000 {
		t.Fatalf("raised: %d", l)
	}
	if l := al.CapMax(10); l != 10 {
		t.Fatalf("capped limit %d", l)
	}
	if lo, hi := al.Bounds(); lo != 2 || hi != 10 {
		t.Fatalf("bounds %d..%d", lo, hi)
	}
	al.ObserveAt(t0, time.Second, ResultOK)
	if l := al.ObserveAt(t0.Add(time.Second), time.Second, ResultOK); l != 8 {
		t.Fatalf("after a slow interval %d, want 8 (10×0.8)", l)
	}
	if l := al.CapMax(1); l != 2 {
		t.Fatalf("capped below Min: %d", l)
	}
}

// SetLimit below what is held takes nothing back: admission stops until
// settlements bring the count under the new limit, then resumes one slot at
// a time; raising it wakes a waiter at once.
func TestWindowSetLimitBelowInUse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w, _ := NewWindow(8, 1<<20)
		for range 6 {
			if !w.TryAcquire(1, 10) {
				t.Fatal("acquire")
			}
		}
		if l := w.SetLimit(2); l != 2 {
			t.Fatalf("limit %d", l)
		}
		if m, b := w.Free(); m != 0 || b != 0 || w.TryAcquire(1, 1) {
			t.Fatalf("free %d/%d after lowering below in use", m, b)
		}
		for range 4 {
			w.Release(1, 10)
		}
		if m, _ := w.InUse(); m != 2 || w.TryAcquire(1, 1) {
			t.Fatalf("in use %d: admitted at the limit", m)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		got := make(chan int, 1)
		go func() {
			n, _, err := w.WaitFreeAtLeast(ctx, 4)
			if err != nil {
				n = -1
			}
			got <- n
		}()
		synctest.Wait() // the waiter is blocked
		w.SetLimit(100) // clamped to 8: 6 free
		if n := <-got; n != 6 {
			t.Fatalf("woken with %d free, want 6", n)
		}
		if w.Limit() != 8 {
			t.Fatalf("limit %d", w.Limit())
		}
		w.Release(2, 20)
		if m, b := w.InUse(); m != 0 || b != 0 {
			t.Fatalf("in use %d/%d", m, b)
		}
	})
}

// Throttle.DoAt and Retrier.Now: the time-dependent decisions of Do take
// an injected time like the other At methods.
func TestDoAtTwins(t *testing.T) {
	th, err := NewThrottle(ThrottleOptions{Rand: func() float64 { return 0.999 }})
	if err != nil {
		t.Fatal(err)
	}
	refuse := func(context.Context) error { return Overloaded(errors.New("full")) }
	for range 10 {
		_ = th.DoAt(context.Background(), t0, refuse)
	}
	if req, acc := th.CountsAt(t0); req != 10 || acc != 0 {
		t.Fatalf("counts at t0: %d requests, %d accepts", req, acc)
	}
	if p := th.ProbabilityAt(t0); p != 10.0/11 {
		t.Fatalf("p %v, want 10/11", p)
	}
	if req, _ := th.CountsAt(t0.Add(3 * time.Minute)); req != 0 {
		t.Fatalf("not forgotten after the window: %d", req)
	}

	b, _ := NewRetryBudget(RetryBudgetOptions{MinRetries: -1})
	for range 9 {
		b.AttemptAt(t0)
	}
	calls := 0
	r := Retrier{MaxAttempts: 2, Budget: b, BaseDelay: -1, Now: func() time.Time { return t0 }}
	err = r.Do(context.Background(), func(context.Context) error {
		if calls++; calls == 1 {
			return errors.New("flaky")
		}
		return nil
	})
	if err != nil || calls != 2 {
		t.Fatalf("retry within the budget at t0 refused: %v after %d calls", err, calls)
	}
	if f, rt := b.UsageAt(t0); f != 10 || rt != 1 {
		t.Fatalf("usage at t0: %d first, %d retries", f, rt)
	}
}
