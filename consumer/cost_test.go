package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

type costMixResult struct {
	cheapP99 time.Duration
	units    float64 // on-time handler-seconds per second
	capacity float64 // handler-seconds per second
}

// runCostMix offers 3× capacity of a mix of 1 ms (90%) and 100 ms (10%)
// messages, each declaring its cost in milliseconds in the Sluice-Cost
// header, with a 1 s deadline, to 4 workers shaped by route, in virtual
// time, and measures the last 2 of 4 seconds.
func runCostMix(t *testing.T, route func(*consumer.Route)) costMixResult {
	var res costMixResult
	synctest.Test(t, func(t *testing.T) {
		const workers = 4
		src := sluicetest.NewSource()
		var mu sync.Mutex
		var cheap []time.Duration
		var onTime time.Duration
		t0 := time.Now()
		from, until := t0.Add(2*time.Second), t0.Add(4*time.Second)
		h := func(ctx context.Context, m *consumer.Message) error {
			ms, _ := strconv.Atoi(m.Headers.Get(consumer.CostHeader))
			cost := time.Duration(ms) * time.Millisecond
			tm := time.NewTimer(cost)
			defer tm.Stop()
			select {
			case <-tm.C:
			case <-ctx.Done():
				return ctx.Err()
			}
			end := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if end.Before(from) || !end.Before(until) {
				return nil
			}
			onTime += cost
			if ms == 1 {
				cheap = append(cheap, end.Sub(m.PublishedAt))
			}
			return nil
		}
		r := consumer.Route{Name: "mix", Source: src, Handler: h, Workers: workers, Retry: consumer.RetryPolicy{MaxAttempts: 1}}
		route(&r)
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- c.Run(ctx) }()
		res.capacity = workers  // handler-seconds per second
		mean := 0.9*1 + 0.1*100 // ms
		rate := 3 * res.capacity / (mean / 1000)
		rnd := rand.New(rand.NewPCG(1, 2))
		sent := 0
		for now := t0; now.Before(until); now = time.Now() {
			for due := int(now.Sub(t0).Seconds() * rate); sent < due; sent++ {
				ms := 1
				if rnd.Float64() < 0.1 {
					ms = 100
				}
				h := consumer.Headers{expiry.DefaultHeader: {expiry.FormatDeadline(now.Add(time.Second))}, consumer.CostHeader: {strconv.Itoa(ms)}}
				src.Publish(fmt.Sprint(sent), nil, h, now)
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		slices.Sort(cheap)
		if len(cheap) > 0 {
			res.cheapP99 = cheap[(len(cheap)*99+99)/100-1]
		}
		res.units = onTime.Seconds() / until.Sub(from).Seconds()
	})
	return res
}

// Count against cost (issue 11 section 4): a mix of 1 ms and 100 ms
// messages at 3× capacity. Bounded by count (a queue of 50 messages, the
// plain bounded queue's rule), cheap messages wait behind up to 50 × 10.9 ms
// of work and behind dear runs on every worker. Bounded by declared cost
// (a queue of 160 units, at most 310 units running on 4 workers) a worker
// is always free for the cheap class: its p99 stays under 50 ms while the
// workers stay busy (goodput in cost units ≥ 95% of capacity).
func TestCostWeightedAdmission(t *testing.T) {
	count := runCostMix(t, func(r *consumer.Route) {
		r.Window.Messages = 64
		r.Overload.Queue = consumer.QueuePolicy{MaxLength: 50}
		r.Overload.OnShed = consumer.ShedAck
	})
	cost := runCostMix(t, func(r *consumer.Route) {
		// At most 3 dear messages run at once (310 units of 4 × 100):
		// a worker is always there for the cheap ones. The queue holds
		// 160 ms of work; the window (units) has room for both, so the
		// pull goes on and the queue bound decides what is shed.
		r.Window.Cost = consumer.CostPolicy{Header: consumer.CostHeader, Max: 100, MaxRunning: 310}
		r.Window.Messages = 1000
		r.Overload.Queue = consumer.QueuePolicy{MaxCost: 160}
		r.Overload.OnShed = consumer.ShedAck
	})
	t.Logf("by count: cheap p99 %v, goodput %.2f of %.0f handler-s/s; by cost: cheap p99 %v, goodput %.2f",
		count.cheapP99, count.units, count.capacity, cost.cheapP99, cost.units)
	if cost.cheapP99 >= 50*time.Millisecond || cost.units < 0.95*cost.capacity {
		t.Errorf("by cost: cheap p99 %v (want < 50 ms), goodput %.2f (want ≥ 95%% of %.0f)", cost.cheapP99, cost.units, cost.capacity)
	}
	if count.cheapP99 < 50*time.Millisecond {
		t.Errorf("by count: cheap p99 %v: the mix does not show the difference", count.cheapP99)
	}
}
