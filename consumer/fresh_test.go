package consumer_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

// Under a sustained overload the minimal route keeps its queue short: the
// p99 of its successes stays at or under 0.7 × the deadline (where the
// deadline alone let it reach the deadline), goodput stays at capacity, no
// run starts on an expired message or finishes late, and what it could not
// run fresh is counted as stale (package doc, "Short queues under
// overload").
func TestShortQueueUnderOverload(t *testing.T) {
	for _, c := range []overload{
		{workers: 4, cost: 20 * time.Millisecond, deadline: 500 * time.Millisecond, load: 2},
		{workers: 4, cost: 20 * time.Millisecond, deadline: 500 * time.Millisecond, load: 5},
		{workers: 4, cost: 20 * time.Millisecond, deadline: 500 * time.Millisecond, load: 10},
		{workers: 4, cost: 20 * time.Millisecond, deadline: 100 * time.Millisecond, load: 5},
		{workers: 4, cost: 20 * time.Millisecond, deadline: 5 * time.Second, load: 2},
		{workers: 32, cost: 2 * time.Millisecond, deadline: 100 * time.Millisecond, load: 2},
		{workers: 4, cost: 20 * time.Millisecond, deadline: 500 * time.Millisecond, load: 5, rtt: 5 * time.Millisecond},
	} {
		c.dur = max(2*time.Second, 4*c.deadline)
		t.Run(fmt.Sprintf("%d×%v_deadline_%v_at_%g×_rtt_%v", c.workers, c.cost, c.deadline, c.load, c.rtt), func(t *testing.T) {
			r := c.run(t)
			if r.goodput < 0.97*r.capacity {
				t.Errorf("goodput %.1f/s, %.1f%% of capacity %.0f/s", r.goodput, 100*r.goodput/r.capacity, r.capacity)
			}
			if r.wasted != 0 || r.late != 0 {
				t.Errorf("%d runs started on expired messages, %d finished late", r.wasted, r.late)
			}
			if lim := time.Duration(0.7 * float64(c.deadline)); r.p99 > lim {
				t.Errorf("p99 of successes %v, above 0.7 × the deadline %v", r.p99, lim)
			}
			if r.stats.Overload.Stale == 0 || !r.stats.Overload.StandingQueue {
				t.Errorf("stale %d, standing %v: the rule never acted", r.stats.Overload.Stale, r.stats.Overload.StandingQueue)
			}
			if len(r.ledgerFault) > 0 || r.unsettled > 0 {
				t.Errorf("ledger faults %v, %d unsettled", r.ledgerFault, r.unsettled)
			}
			// The same run with the rule off: the queue stands as long as
			// the deadline lets it.
			off := c
			off.route = func(r *consumer.Route) { r.Overload.Queue.Target = -1 }
			o := off.run(t)
			if o.stats.Overload.Stale != 0 {
				t.Errorf("rule off: %d stale", o.stats.Overload.Stale)
			}
			t.Logf("goodput %.0f/s of %.0f/s, p99 %v (rule off: %v), expired %d (early %d, stale %d), learned p99 %v",
				r.goodput, r.capacity, r.p99, o.p99, r.stats.Settled[consumer.OutcomeExpired], r.stats.Overload.ExpiredEarly, r.stats.Overload.Stale, r.stats.Overload.HandlerP99)
		})
	}
}

// At or under capacity the rule sheds nothing: no message is settled as
// stale or expired, and the queue is never standing.
func TestShortQueueShedsNothingAtCapacity(t *testing.T) {
	for _, c := range []overload{
		{workers: 4, cost: 20 * time.Millisecond, deadline: 500 * time.Millisecond, load: 0.5},
		{workers: 4, cost: 20 * time.Millisecond, deadline: 500 * time.Millisecond, load: 0.9},
		{workers: 4, cost: 20 * time.Millisecond, deadline: 100 * time.Millisecond, load: 0.9},
		{workers: 32, cost: 2 * time.Millisecond, deadline: 100 * time.Millisecond, load: 0.9, rtt: time.Millisecond},
	} {
		c.dur = 4 * time.Second
		t.Run(fmt.Sprintf("%d×%v_deadline_%v_at_%g×", c.workers, c.cost, c.deadline, c.load), func(t *testing.T) {
			r := c.run(t)
			if n := r.stats.Settled[consumer.OutcomeExpired]; n != 0 || r.stats.Overload.Stale != 0 || r.stats.Overload.StandingQueue {
				t.Errorf("expired %d, stale %d, standing %v", n, r.stats.Overload.Stale, r.stats.Overload.StandingQueue)
			}
			if r.goodput < 0.97*c.load*r.capacity {
				t.Errorf("goodput %.1f/s of %.1f/s offered", r.goodput, c.load*r.capacity)
			}
			t.Logf("goodput %.0f/s, p99 %v", r.goodput, r.p99)
		})
	}
}

// A fixed QueuePolicy.Target bounds the sojourn of what a standing queue
// runs: publish to finish within the target plus one run (with its
// margin).
func TestShortQueueFixedTarget(t *testing.T) {
	c := overload{workers: 4, cost: 20 * time.Millisecond, deadline: 500 * time.Millisecond, load: 5, dur: 2 * time.Second,
		route: func(r *consumer.Route) { r.Overload.Queue.Target = 50 * time.Millisecond }}
	r := c.run(t)
	if lim := 50*time.Millisecond + 20*time.Millisecond + 3*time.Millisecond; r.p99 > lim {
		t.Errorf("p99 %v, above the target plus a run %v", r.p99, lim)
	}
	if r.goodput < 0.97*r.capacity || r.late != 0 {
		t.Errorf("goodput %.1f/s of %.0f/s, %d late", r.goodput, r.capacity, r.late)
	}
	t.Logf("p99 %v, goodput %.0f/s", r.p99, r.goodput)
}

// Messages without a deadline are never settled by the rule, and keep
// FIFO, whatever the backlog.
func TestShortQueueLeavesMessagesWithoutDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		var got []string
		h := func(ctx context.Context, m *consumer.Message) error {
			got = append(got, string(m.Key))
			time.Sleep(10 * time.Millisecond)
			return nil
		}
		const n = 300
		for i := range n {
			src.Publish(fmt.Sprintf("%04d", i), nil, nil, time.Now())
		}
		c, err := consumer.New(consumer.Options{}, consumer.Route{Name: "r", Source: src, Handler: h, Workers: 1})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- c.Run(ctx) }()
		time.Sleep(n*10*time.Millisecond + time.Second)
		cancel()
		<-errc
		s := c.Stats()[0]
		if s.Settled[consumer.OutcomeSucceeded] != n || s.Overload.Stale != 0 || s.Settled[consumer.OutcomeExpired] != 0 {
			t.Fatalf("succeeded %d of %d, stale %d, expired %d", s.Settled[consumer.OutcomeSucceeded], n, s.Overload.Stale, s.Settled[consumer.OutcomeExpired])
		}
		for i, k := range got {
			if k != fmt.Sprintf("%04d", i) {
				t.Fatalf("run %d was %s: not FIFO", i, k)
			}
		}
	})
}

// Without deadlines, a route with the default window draining a backlog
// through a Source with a round trip grows its window past 2 × Workers
// while the workers run dry and the fetches come back full, so the drain
// runs at the handlers' capacity rather than at one window per round trip
// (a window fixed at 2 × Workers takes far longer); once the backlog is
// gone and fetches come back short, the window goes back to 2 × Workers.
func TestWindowGrowsToDrainABacklog(t *testing.T) {
	const n, workers, cost, rtt = 20000, 8, time.Millisecond, 5 * time.Millisecond
	drain := func(t *testing.T, window int) (took time.Duration, peak, after int) {
		synctest.Test(t, func(t *testing.T) {
			src := sluicetest.NewSource()
			for i := range n {
				src.Publish(fmt.Sprint(i), nil, nil, time.Now())
			}
			h := func(ctx context.Context, m *consumer.Message) error {
				time.Sleep(cost)
				return nil
			}
			c, err := consumer.New(consumer.Options{}, consumer.Route{Name: "r", Source: slowSource{src, rtt}, Handler: h, Workers: workers,
				Window: consumer.WindowPolicy{Messages: window}})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			errc := make(chan error, 1)
			go func() { errc <- c.Run(ctx) }()
			start := time.Now()
			for c.Stats()[0].Settled[consumer.OutcomeSucceeded] < n {
				time.Sleep(10 * time.Millisecond)
				peak = max(peak, c.Stats()[0].Window.Limit)
			}
			took = time.Since(start)
			// A trickle: no backlog, every fetch comes back short.
			for i := range 50 {
				src.Publish(fmt.Sprint("t", i), nil, nil, time.Now())
				time.Sleep(20 * time.Millisecond)
			}
			after = c.Stats()[0].Window.Limit
			cancel()
			<-errc
		})
		return took, peak, after
	}
	took, peak, after := drain(t, 0)
	fixed, _, _ := drain(t, 2*workers)
	ideal := time.Duration(n/workers) * cost
	if peak <= 2*workers {
		t.Errorf("window peaked at %d, never above 2 × Workers", peak)
	}
	if took > ideal*115/100 {
		t.Errorf("drained %d in %v, more than 1.15 × the handlers' %v", n, took, ideal)
	}
	if fixed < took*3/2 {
		t.Errorf("a window fixed at 2 × Workers drained in %v, the one that finds its size in %v: expected the fixed one far slower", fixed, took)
	}
	if after != 2*workers {
		t.Errorf("window %d with no backlog, want %d", after, 2*workers)
	}
	t.Logf("drained in %v (ideal %v, fixed window of %d: %v), window peak %d", took, ideal, 2*workers, fixed, peak)
}

// On a batch route the rule plans with the batch's learned time: under a
// sustained overload (3× what batches of 20 get through) the successes
// finish well before their deadline, where with the rule off they finish
// near it; goodput holds, and what could not run fresh is counted stale.
func TestShortQueueOnBatchRoutes(t *testing.T) {
	const deadline = time.Second
	run := func(t *testing.T, target time.Duration) (p99 time.Duration, good int, s consumer.RouteStats) {
		synctest.Test(t, func(t *testing.T) {
			src := sluicetest.NewSource()
			var mu sync.Mutex
			var lat []time.Duration
			startAt := time.Now()
			from := startAt.Add(2 * time.Second)
			r := batchRoute("r", src, func(ctx context.Context, b *consumer.Batch) error {
				time.Sleep(10*time.Millisecond + time.Duration(b.Len())*time.Millisecond)
				end := time.Now()
				mu.Lock()
				defer mu.Unlock()
				for _, m := range b.Messages {
					if dl, _ := m.Deadline(); end.Before(dl) && !end.Before(from) {
						good++
						lat = append(lat, end.Sub(m.PublishedAt))
					}
				}
				return nil
			})
			r.Workers, r.Batch.MaxMessages, r.Batch.Linger = 2, 20, 0
			r.Overload.Queue.Target = target
			c, err := consumer.New(consumer.Options{}, r)
			if err != nil {
				t.Fatal(err)
			}
			stop := start(t, c)
			// Capacity: 2 workers × 20 messages per 30 ms ≈ 1,333/s; offer 3×.
			const rate = 4000
			sent := 0
			for now := time.Now(); now.Sub(startAt) < 5*time.Second; now = time.Now() {
				for due := int(now.Sub(startAt).Seconds() * rate); sent < due; sent++ {
					src.Publish(fmt.Sprint(sent), nil, consumer.Headers{expiry.DefaultHeader: {expiry.FormatDeadline(now.Add(deadline))}}, now)
				}
				time.Sleep(time.Millisecond)
			}
			_ = stop()
			s = c.Stats()[0]
			slices.Sort(lat)
			if len(lat) > 0 {
				p99 = lat[(len(lat)*99+99)/100-1]
			}
		})
		return p99, good, s
	}
	p99, good, s := run(t, 0)
	offP99, offGood, off := run(t, -1)
	if s.Overload.Stale == 0 || off.Overload.Stale != 0 {
		t.Errorf("stale %d with the rule, %d without", s.Overload.Stale, off.Overload.Stale)
	}
	if p99 > deadline*7/10 || p99 >= offP99 {
		t.Errorf("p99 %v with the rule, %v without: want ≤ 0.7 × the deadline and below", p99, offP99)
	}
	if good < offGood*97/100 || s.Late != 0 {
		t.Errorf("on time %d with the rule, %d without; %d late", good, offGood, s.Late)
	}
	t.Logf("p99 %v (off %v), on time %d (off %d), stale %d, batches %d of %d messages", p99, offP99, good, offGood, s.Overload.Stale, s.Batch.Batches, s.Batch.Messages)
}

// A backlog whose deadlines leave ample time (a burst produced before the
// consumer started, a replay after an incident) drains in full: the
// short-queue rule settles nothing as stale, only what cannot make its
// deadline's margin. (The examples/kafka story found it: 2,575 of 3,000
// orders with a one-minute deadline were settled as stale while the
// backlog drained in 150 ms, when the rule measured every message's
// sojourn from publish against a target of a few handler p99s.)
func TestShortQueueDrainsABacklogThatCanMakeItsDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		h := func(ctx context.Context, m *consumer.Message) error {
			time.Sleep(2 * time.Millisecond)
			return nil
		}
		const n = 3000
		past := time.Now().Add(-2 * time.Second) // published before the consumer started
		dl := consumer.Headers{expiry.DefaultHeader: {expiry.FormatDeadline(time.Now().Add(time.Minute))}}
		for i := range n {
			src.Publish(fmt.Sprintf("%04d", i), nil, dl, past)
		}
		c, err := consumer.New(consumer.Options{}, consumer.Route{Name: "r", Source: src, Handler: h, Workers: 8})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- c.Run(ctx) }()
		time.Sleep(n*2*time.Millisecond/8 + 5*time.Second)
		cancel()
		<-errc
		s := c.Stats()[0]
		if s.Settled[consumer.OutcomeSucceeded] != n || s.Overload.Stale != 0 || s.Settled[consumer.OutcomeExpired] != 0 {
			t.Fatalf("succeeded %d of %d, stale %d, expired %d", s.Settled[consumer.OutcomeSucceeded], n, s.Overload.Stale, s.Settled[consumer.OutcomeExpired])
		}
	})
}
