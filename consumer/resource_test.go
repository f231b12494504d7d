package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/sluicetest"
)

// fakeCPU plays a process whose CPU use is proportional to the handlers
// running: each running handler takes perRun of the target. Pressure is
// the mean since the previous call, as a CPU sampler measures it.
type fakeCPU struct {
	perRun float64

	mu      sync.Mutex
	running int
	last    time.Time // of the last change
	area    float64   // handler-seconds since the last sample
	since   time.Time // of the last sample
	p       float64   // the last sample
}

func (f *fakeCPU) add(d int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if !f.last.IsZero() {
		f.area += float64(f.running) * now.Sub(f.last).Seconds()
	}
	f.running += d
	f.last = now
}

func (f *fakeCPU) Pressure() float64 {
	f.add(0)
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	// Like ResourceMonitor, a new sample at most every 200 ms, shared by
	// every reader.
	if dt := now.Sub(f.since); dt >= 200*time.Millisecond {
		if !f.since.IsZero() {
			f.p = f.area / dt.Seconds() * f.perRun
		}
		f.area, f.since = 0, now
	}
	return f.p
}

// Two routes share a process whose handlers each take 30% of its CPU
// target, with 8 workers and a backlog each: over the target the routes cap
// their windows, the sheddable one harder, until the process is back under
// its target; the critical route keeps more of the CPU.
func TestResourceCapLowestCriticalityFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cpu := &fakeCPU{perRun: 0.3}
		h := func(ctx context.Context, m *consumer.Message) error {
			cpu.add(1)
			defer cpu.add(-1)
			time.Sleep(10 * time.Millisecond)
			return nil
		}
		var routes []consumer.Route
		var srcs []*sluicetest.Source
		for i, c := range []backpressure.Criticality{backpressure.Critical, backpressure.Sheddable} {
			src := sluicetest.NewSource()
			for j := range 5000 {
				src.Publish(fmt.Sprint(i, "-", j), nil, nil, time.Now())
			}
			srcs = append(srcs, src)
			routes = append(routes, consumer.Route{Name: c.String(), Source: src, Handler: h, Workers: 8,
				Overload: consumer.OverloadPolicy{Criticality: c}})
		}
		c, err := consumer.New(consumer.Options{Resource: cpu}, routes...)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- c.Run(ctx) }()
		time.Sleep(3 * time.Second) // settled
		d0 := c.Stats()
		time.Sleep(4 * time.Second)
		st := c.Stats()
		cancel()
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		crit, shed := st[0], st[1]
		done := func(i int) float64 {
			return float64(st[i].Settled[consumer.OutcomeSucceeded]-d0[i].Settled[consumer.OutcomeSucceeded]) / 4
		}
		// Each run takes 10 ms: the mean number running is done/s × 10 ms.
		use := (done(0) + done(1)) * 0.01 * cpu.perRun
		t.Logf("critical: cap %d, %.0f/s; sheddable: cap %d, %.0f/s; CPU at %.2f of the target over the last 4 s",
			crit.Overload.ResourceCap, done(0), shed.Overload.ResourceCap, done(1), use)
		if crit.Overload.ResourceCap == 0 || shed.Overload.ResourceCap == 0 {
			t.Fatal("no cap in force while over the target")
		}
		if done(1) >= done(0) {
			t.Error("the sheddable route did not give way first")
		}
		if use > 1.05 || use < 0.6 {
			t.Errorf("CPU at %.2f of the target, want at most 1 and not far below", use)
		}
	})
}
