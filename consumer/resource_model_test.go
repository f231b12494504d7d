package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/sluicetest"
)

// coresCPU plays a process on a few cores whose handlers are CPU-bound:
// its CPU use is the handlers running, at most cores, as a share of the
// cores; Pressure is that share over target, averaged since the previous
// sample (at most every 200 ms, like ResourceMonitor).
type coresCPU struct {
	cores, target float64

	mu      sync.Mutex
	running int
	last    time.Time
	area    float64
	since   time.Time
	p       float64
}

func (f *coresCPU) add(d int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if !f.last.IsZero() {
		f.area += min(float64(f.running), f.cores) * now.Sub(f.last).Seconds()
	}
	f.running += d
	f.last = now
}

func (f *coresCPU) Pressure() float64 {
	f.add(0)
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	if dt := now.Sub(f.since); dt >= 200*time.Millisecond {
		if !f.since.IsZero() {
			f.p = f.area / dt.Seconds() / f.cores / f.target
		}
		f.area, f.since = 0, now
	}
	return f.p
}

// A minimal route (sheddable, the default window) on a few cores with a
// CPU-bound 5 ms handler, a backlog far above capacity and a CPU target of
// 80% of the cores: the resource cap holds the process around the target,
// within a few points, without giving away much more than the target
// asks. With only a few messages in flight, an integer cap halved at each
// cut swung between 2 and 1 on 2 cores (100% and 50% of them) and held
// 62%. The start-up transient (the first cuts) stays above 45% of the
// cores. (On one core the cap's floor, one message at a time, is above an
// 80% target.)
func TestResourceCapHoldsNearTheTarget(t *testing.T) {
	for _, c := range []struct {
		cores   float64
		workers int
		rtt     time.Duration
	}{{2, 4, time.Millisecond}, {2, 8, 0}, {4, 8, time.Millisecond}} {
		t.Run(fmt.Sprintf("%g_cores_%d_workers_rtt_%v", c.cores, c.workers, c.rtt), func(t *testing.T) {
			holdNearTarget(t, c.cores, c.workers, c.rtt)
		})
	}
}

func holdNearTarget(t *testing.T, cores float64, workers int, rtt time.Duration) {
	synctest.Test(t, func(t *testing.T) {
		cpu := &coresCPU{cores: cores, target: 0.8}
		h := func(ctx context.Context, m *consumer.Message) error {
			cpu.add(1)
			defer cpu.add(-1)
			time.Sleep(5 * time.Millisecond)
			return nil
		}
		src := sluicetest.NewSource()
		for j := range 30000 {
			src.Publish(fmt.Sprint(j), nil, nil, time.Now())
		}
		var source consumer.Source = src
		if rtt > 0 {
			source = slowSource{src, rtt}
		}
		c, err := consumer.New(consumer.Options{Resource: cpu}, consumer.Route{Name: "r", Source: source, Handler: h, Workers: workers})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- c.Run(ctx) }()
		// The first 3 s, in 250 ms steps: the start-up transient.
		var done []uint64
		for range 12 {
			time.Sleep(250 * time.Millisecond)
			done = append(done, c.Stats()[0].Settled[consumer.OutcomeSucceeded])
		}
		low := 1.0
		for i := 3; i < len(done); i += 2 {
			// Each 500 ms from 0.5 s on; each core does 200 runs/s.
			low = min(low, float64(done[i]-done[i-2])/0.5*0.005/cores)
		}
		d0 := done[len(done)-1]
		time.Sleep(4 * time.Second)
		st := c.Stats()[0]
		cancel()
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		rate := float64(st.Settled[consumer.OutcomeSucceeded]-d0) / 4
		// At 5 ms a run, each core does 200/s.
		use := min(rate*0.005, cores) / cores
		t.Logf("%.0f/s, CPU %.0f%% of the cores (target 80%%), cap %d, %d cuts; lowest 500 ms of the first 3 s: %.0f%%",
			rate, 100*use, st.Overload.ResourceCap, st.Overload.ResourceCuts, 100*low)
		// The cap acts on the pressure's mean over about a second, so the
		// mean use sits around the target, a few points either side (72%
		// to 83% over repeated runs, goroutine order varying under -race).
		// The first cut starts from the messages running and steps toward
		// the aim: the start-up transient does not drop far below the
		// target (a cut from the window's in-use count, by up to half at
		// once, fell to 31-42% here).
		if low < 0.45 {
			t.Errorf("CPU fell to %.0f%% of the cores over 500 ms in the first 3 s: the first cuts overshoot", 100*low)
		}
		if use > 0.85 || use < 0.68 {
			t.Errorf("CPU %.0f%% of the cores: want 68%% to 85%% for a target of 80%%", 100*use)
		}
	})
}
