package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

// A handler with a 20 ms full path and a 4 ms degraded one, taken while
// backpressure.PressureFrom says the route is pressed: offered 5× its
// full-path capacity, the route serves at least 3× that capacity on time;
// when the load drops to 0.5× it is back on the full path within 2 s
// (issue 11 section 2, on the in-memory source in virtual time).
func TestPressureLetsAHandlerDegrade(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const workers, full, cheap, deadline = 4, 20 * time.Millisecond, 4 * time.Millisecond, 500 * time.Millisecond
		capacity := float64(workers) / full.Seconds() // 200/s
		src := sluicetest.NewSource()
		var mu sync.Mutex
		type run struct {
			start, end time.Time
			degraded   bool
			onTime     bool
		}
		var runs []run
		var causes backpressure.PressureCause
		h := func(ctx context.Context, m *consumer.Message) error {
			start := time.Now()
			p := backpressure.PressureFrom(ctx)
			cost := full
			if p.Level >= backpressure.PressureElevated {
				cost = cheap
			}
			time.Sleep(cost)
			dl, _ := m.Deadline()
			mu.Lock()
			causes |= p.Causes
			runs = append(runs, run{start, time.Now(), cost == cheap, !time.Now().After(dl)})
			mu.Unlock()
			return nil
		}
		c, err := consumer.New(consumer.Options{}, consumer.Route{Name: "r", Source: src, Handler: h, Workers: workers})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- c.Run(ctx) }()
		t0 := time.Now()
		burst, after := 6*time.Second, 4*time.Second
		sent := 0
		for now := t0; now.Sub(t0) < burst+after; now = time.Now() {
			el := now.Sub(t0)
			due := int(min(el, burst).Seconds() * 5 * capacity)
			if el > burst {
				due += int((el - burst).Seconds() * 0.5 * capacity)
			}
			for ; sent < due; sent++ {
				src.Publish(fmt.Sprint(sent), nil, consumer.Headers{expiry.DefaultHeader: {expiry.FormatDeadline(now.Add(deadline))}}, now)
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		drop := t0.Add(burst)
		slices.SortFunc(runs, func(a, b run) int { return a.start.Compare(b.start) })
		var good, inBurst, fullInBurst, flips, fullAfter int
		var lastDegraded time.Duration
		firstDegraded := time.Duration(-1)
		for i, r := range runs {
			if r.onTime && r.end.After(t0.Add(2*time.Second)) && r.end.Before(drop) {
				good++
			}
			if r.degraded && firstDegraded < 0 {
				firstDegraded = r.start.Sub(t0)
			}
			if r.start.After(t0.Add(2*time.Second)) && r.start.Before(drop) {
				inBurst++
				if !r.degraded {
					fullInBurst++
				}
				if i > 0 && r.degraded != runs[i-1].degraded {
					flips++
				}
			}
			if r.degraded && r.start.After(drop) {
				lastDegraded = max(lastDegraded, r.start.Sub(drop))
			}
			if !r.degraded && r.start.After(drop) {
				fullAfter++
			}
		}
		t.Logf("first degraded run %v into the burst; in its last 4 s %d of %d runs on the full path, %d switches",
			firstDegraded, fullInBurst, inBurst, flips)
		// The level rises within the first second of overload. 5× the
		// full path is about 1× the degraded one, so the backlog comes
		// and goes and the level with it; the gauge's hysteresis (a level
		// falls only after its signals stayed below it for Hold, 1 s) keeps
		// the handler on the degraded path for at least 95% of the burst's
		// runs, switching paths at most twice per Hold (a flapping level
		// would switch every evaluation, 100 ms).
		if firstDegraded < 0 || firstDegraded > time.Second {
			t.Errorf("first degraded run %v after the burst began, want within 1 s", firstDegraded)
		}
		if fullInBurst*20 > inBurst || flips > 8 {
			t.Errorf("in the burst's last 4 s %d of %d runs took the full path, %d switches: the level flapped", fullInBurst, inBurst, flips)
		}
		if fullAfter == 0 {
			t.Error("no run took the full path after the load dropped")
		}
		goodput := float64(good) / 4 // the burst's last 4 s
		t.Logf("burst goodput %.0f/s = %.2f× full-path capacity; last degraded run %v after the drop; causes seen: %v",
			goodput, goodput/capacity, lastDegraded, causes)
		if goodput < 3*capacity {
			t.Errorf("burst goodput %.0f/s, want at least 3× %.0f/s", goodput, capacity)
		}
		if lastDegraded > 2*time.Second {
			t.Errorf("still degraded %v after the load dropped", lastDegraded)
		}
	})
}
