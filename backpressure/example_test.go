package backpressure_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/backpressure"
)

// A window of 3 messages covers queued and running work: the fourth is
// refused at once, before any work exists for it, and capacity comes back
// only when a message is settled.
func ExampleWindow() {
	w, _ := backpressure.NewWindow(3, 1<<20)
	for i := 1; i <= 4; i++ {
		fmt.Println(i, w.TryAcquire(1, 512))
	}
	w.Release(1, 512) // one message settled
	_ = w.Acquire(context.Background(), 1, 512)
	n, b := w.InUse()
	fmt.Println("in use:", n, b)
	// Output:
	// 1 true
	// 2 true
	// 3 true
	// 4 false
	// in use: 3 1536
}

// Client-side adaptive throttling with injected time: after 100 requests of
// which 20 were accepted, 100−2·20 of 101 are rejected locally.
func ExampleThrottle() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	th, _ := backpressure.NewThrottle(backpressure.ThrottleOptions{}) // K=2, 2 min window
	for i := range 100 {
		if th.AllowAt(now) {
			th.RecordAt(now, i < 20) // the downstream accepts 20
		}
	}
	fmt.Printf("reject probability %.3f\n", th.ProbabilityAt(now))
	fmt.Printf("after the window: %.3f\n", th.ProbabilityAt(now.Add(3*time.Minute)))
	// Output:
	// reject probability 0.594
	// after the window: 0.000
}

// A retry budget of 10% of first attempts (at least 5 per window).
func ExampleRetryBudget() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	b, _ := backpressure.NewRetryBudget(backpressure.RetryBudgetOptions{Ratio: 0.1})
	for range 200 {
		b.AttemptAt(now)
	}
	allowed := 0
	for range 100 {
		if b.RetryAt(now) {
			allowed++
		}
	}
	fmt.Println("retries allowed:", allowed, "refused:", b.Exhausted())
	// Output:
	// retries allowed: 20 refused: 80
}

// Nested layers that each retry 3 times cost the failing dependency 3
// calls, not 9: the inner Retrier gives up "overloaded, do not retry".
func ExampleRetrier() {
	calls := 0
	dependency := func(context.Context) error { calls++; return errors.New("503") }
	inner := &backpressure.Retrier{MaxAttempts: 3, BaseDelay: -1}
	outer := &backpressure.Retrier{MaxAttempts: 3, BaseDelay: -1}
	err := outer.Do(context.Background(), func(ctx context.Context) error {
		return inner.Do(ctx, dependency)
	})
	fmt.Println("calls:", calls)
	fmt.Println("overloaded:", backpressure.IsOverloaded(err))
	// Output:
	// calls: 3
	// overloaded: true
}

// AIMD concurrency: latency over the target shrinks the limit
// multiplicatively; under it, the limit grows by one per interval.
func ExampleAdaptiveLimit() {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	al, _ := backpressure.NewAdaptiveLimit(backpressure.AdaptiveLimitOptions{
		Min: 2, Max: 50, Initial: 20, Target: 100 * time.Millisecond, MinSamples: 1, Cooldown: -1,
	})
	observe := func(latency time.Duration) int {
		now = now.Add(time.Second) // one decision per 1 s interval
		return al.ObserveAt(now, latency, backpressure.ResultOK)
	}
	observe(10 * time.Millisecond) // starts the first interval
	fmt.Println("slow:", observe(300*time.Millisecond))
	fmt.Println("slow:", observe(300*time.Millisecond))
	fmt.Println("fast:", observe(20*time.Millisecond))
	fmt.Println("fast:", observe(20*time.Millisecond))
	// Output:
	// slow: 16
	// slow: 12
	// fast: 13
	// fast: 14
}

// Shared handler slots: a sheddable caller leaves 25% of the pool free for
// critical work, and a waiting critical caller is served first.
func ExampleSlots() {
	s, _ := backpressure.NewSlots(4)
	n := 0
	for s.TryAcquire(backpressure.Sheddable) {
		n++
	}
	fmt.Println("sheddable got", n, "of", s.Size())
	fmt.Println("critical gets the last:", s.TryAcquire(backpressure.Critical))
	// Output:
	// sheddable got 3 of 4
	// critical gets the last: true
}

// Work caused by a message carries its class: outgoing calls read it from
// ctx and messages copy it into a header.
func ExampleWithCriticality() {
	ctx := backpressure.WithCriticality(context.Background(), backpressure.SheddablePlus)
	c, _ := backpressure.CriticalityFrom(ctx)
	v, _ := backpressure.HeaderValue(ctx)
	fmt.Println(c, backpressure.CriticalityHeader+":", v)
	// Output:
	// SHEDDABLE_PLUS Sluice-Criticality: SHEDDABLE_PLUS
}

// A handler with a cheaper answer serves it while its route is pressed.
// The consumer puts the route's gauge on every handler ctx; here a gauge
// reads fixed signals: a full window and drops since the last look.
func ExamplePressureFrom() {
	signals := backpressure.PressureSignals{Limit: 8}
	g, _ := backpressure.NewPressureGauge(backpressure.PressureOptions{}, func() backpressure.PressureSignals { return signals })
	ctx := backpressure.WithPressure(context.Background(), g)
	answer := func(ctx context.Context) string {
		if backpressure.PressureFrom(ctx).Level >= backpressure.PressureElevated {
			return "cached answer"
		}
		return "full answer"
	}
	t0 := time.Now()
	fmt.Println(answer(ctx), g.LoadAt(t0))
	signals = backpressure.PressureSignals{InUse: 8, Limit: 8, Fetched: 100, Dropped: 20}
	fmt.Println(g.LoadAt(t0.Add(time.Second)))
	fmt.Println(answer(ctx))
	// Output:
	// full answer normal
	// high (saturated,dropping)
	// cached answer
}

// A ResourceMonitor reads the process's own CPU (its container's cgroup,
// else /proc/self/stat), GC share, scheduler latency and heap against
// GOMEMLIMIT; consumer.Options.Resource takes it, so routes cap their
// windows while the process is over its CPU target, sheddable routes first.
func ExampleResourceMonitor() {
	m, err := backpressure.NewResourceMonitor(backpressure.ResourceOptions{CPUTarget: 0.8})
	if err != nil {
		panic(err)
	}
	time.Sleep(300 * time.Millisecond) // one sampling interval
	u := m.Usage()
	fmt.Printf("CPU %.0f%% of %.1f cores (%s), GC %.0f%%, pressure %.2f\n", 100*u.CPU, u.Cores, u.Source, 100*u.GC, m.Pressure())
}
