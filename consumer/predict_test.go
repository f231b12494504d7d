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

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

// overload is one simulated overload run: an open-loop producer offers
// load × capacity of a handler of workers × cost, each message with a
// deadline after its publish time, to a route on the in-memory source, in
// a synctest bubble (virtual time: the figures do not depend on the
// machine's speed).
type overload struct {
	workers  int
	cost     time.Duration
	deadline time.Duration
	load     float64
	dur      time.Duration // offered load; goodput counts runs ending in the last half
	route    func(*consumer.Route)
	rtt      time.Duration // each Fetch takes this long (a broker round trip)
}

// slowSource is a Source whose every Fetch takes a round trip.
type slowSource struct {
	*sluicetest.Source
	rtt time.Duration
}

func (s slowSource) Fetch(ctx context.Context, n int, b int64) ([]*consumer.Message, error) {
	time.Sleep(s.rtt)
	return s.Source.Fetch(ctx, n, b)
}

type overloadResult struct {
	capacity    float64 // msg/s
	goodput     float64 // on time, msg/s, in the measured half
	wasted      int     // handler runs started at or after the deadline
	late        int     // runs that finished after the deadline or were cut off
	p99         time.Duration
	stats       consumer.RouteStats
	ledgerFault []string
	unsettled   int
}

func (o overload) run(t *testing.T) overloadResult {
	t.Helper()
	var res overloadResult
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		var mu sync.Mutex
		var lat []time.Duration
		var good int
		start := time.Now()
		from, until := start.Add(o.dur/2), start.Add(o.dur)
		h := func(ctx context.Context, m *consumer.Message) error {
			began := time.Now()
			dl, _ := m.Deadline()
			pub := m.PublishedAt
			t := time.NewTimer(o.cost)
			defer t.Stop()
			var err error
			select {
			case <-t.C:
			case <-ctx.Done():
				err = ctx.Err()
			}
			end := time.Now()
			mu.Lock()
			defer mu.Unlock()
			if !began.Before(dl) {
				res.wasted++
			}
			switch {
			case err != nil || end.After(dl):
				res.late++
			case !end.Before(from) && end.Before(until):
				good++
				lat = append(lat, end.Sub(pub))
			}
			return err
		}
		var source consumer.Source = src
		if o.rtt > 0 {
			source = slowSource{src, o.rtt}
		}
		r := consumer.Route{Name: "r", Source: source, Handler: h, Workers: o.workers, Retry: consumer.RetryPolicy{MaxAttempts: 1}}
		if o.route != nil {
			o.route(&r)
		}
		c, err := consumer.New(consumer.Options{ShutdownGrace: time.Second}, r)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- c.Run(ctx) }()

		res.capacity = float64(o.workers) / o.cost.Seconds()
		rate := o.load * res.capacity
		sent := 0
		for now := time.Now(); now.Before(until); now = time.Now() {
			for due := int(now.Sub(start).Seconds() * rate); sent < due; sent++ {
				h := consumer.Headers{expiry.DefaultHeader: {expiry.FormatDeadline(now.Add(o.deadline))}}
				src.Publish(fmt.Sprint(sent), nil, h, now)
			}
			time.Sleep(time.Millisecond)
		}
		cancel()
		if err := <-errc; err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
		res.stats = c.Stats()[0]
		res.goodput = float64(good) / until.Sub(from).Seconds()
		slices.Sort(lat)
		if len(lat) > 0 {
			res.p99 = lat[(len(lat)*99+99)/100-1]
		}
		ledger, faults := src.Ledger()
		res.ledgerFault = faults
		for _, rec := range ledger {
			if rec.Pending {
				res.unsettled++
			}
		}
	})
	return res
}

// With only Name, Source, Handler and Workers, a route under 2×, 5× and
// 10× its capacity keeps its goodput at capacity, never starts a handler
// on an expired message, keeps the p99 of its successes under the
// deadline, and settles every message it fetched (issue 11's target, on
// the in-memory source).
func TestPredictiveExpiryHoldsGoodputByDefault(t *testing.T) {
	for _, c := range []overload{
		{workers: 4, cost: 20 * time.Millisecond, deadline: 500 * time.Millisecond, load: 2},
		{workers: 4, cost: 20 * time.Millisecond, deadline: 500 * time.Millisecond, load: 10},
		{workers: 1, cost: 50 * time.Millisecond, deadline: 100 * time.Millisecond, load: 5},
		{workers: 32, cost: 2 * time.Millisecond, deadline: 100 * time.Millisecond, load: 2},
		{workers: 8, cost: 10 * time.Millisecond, deadline: 5 * time.Second, load: 2},
	} {
		c.dur = max(2*time.Second, 4*c.deadline)
		t.Run(fmt.Sprintf("%d×%v_deadline_%v_at_%g×", c.workers, c.cost, c.deadline, c.load), func(t *testing.T) {
			r := c.run(t)
			if r.goodput < 0.97*r.capacity {
				t.Errorf("goodput %.1f/s, %.1f%% of capacity %.0f/s", r.goodput, 100*r.goodput/r.capacity, r.capacity)
			}
			if r.wasted != 0 {
				t.Errorf("%d handler runs started on expired messages", r.wasted)
			}
			if r.p99 > c.deadline {
				t.Errorf("p99 of successes %v, deadline %v", r.p99, c.deadline)
			}
			if r.stats.Overload.ExpiredEarly+r.stats.Overload.Stale == 0 {
				t.Error("nothing expired early under overload")
			}
			if len(r.ledgerFault) > 0 || r.unsettled > 0 {
				t.Errorf("ledger faults %v, %d unsettled", r.ledgerFault, r.unsettled)
			}
			t.Logf("goodput %.0f/s of %.0f/s, p99 %v, late %d, expired %d (early %d, stale %d), learned p99 %v",
				r.goodput, r.capacity, r.p99, r.late, r.stats.Settled[consumer.OutcomeExpired], r.stats.Overload.ExpiredEarly, r.stats.Overload.Stale, r.stats.Overload.HandlerP99)
		})
	}
}

// A queued message whose deadline passes is settled, and frees its window
// capacity and its broker slot, while the worker is still busy: it does not
// wait for a worker to reach it.
func TestQueuedMessagesExpireWithoutAWorker(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		release := make(chan struct{})
		ran := make(chan string, 10)
		h := func(ctx context.Context, m *consumer.Message) error {
			ran <- string(m.Key)
			if string(m.Key) == "blocker" {
				<-release
			}
			return nil
		}
		c, err := consumer.New(consumer.Options{}, consumer.Route{Name: "r", Source: src, Handler: h, Workers: 1,
			Window: consumer.WindowPolicy{Messages: 8}})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- c.Run(ctx) }()
		src.Publish("blocker", nil, nil, time.Now())
		if k := <-ran; k != "blocker" {
			t.Fatalf("ran %s first", k)
		}
		dl := consumer.Headers{expiry.DefaultHeader: {expiry.FormatDeadline(time.Now().Add(100 * time.Millisecond))}}
		for i := range 4 {
			src.Publish(fmt.Sprint("m", i), nil, dl, time.Now())
		}
		time.Sleep(150 * time.Millisecond)
		synctest.Wait()
		s := c.Stats()[0]
		if s.Settled[consumer.OutcomeExpired] != 4 || s.Window.InUse != 1 {
			t.Errorf("with the worker busy: %d expired, window %d in use; want 4 and 1", s.Settled[consumer.OutcomeExpired], s.Window.InUse)
		}
		ledger, _ := src.Ledger()
		for i := range 4 {
			if rec := ledger[fmt.Sprint("m", i)]; rec.Acks != 1 {
				t.Errorf("m%d: %+v, want acked once (OnExpired: ack)", i, rec)
			}
		}
		close(release)
		synctest.Wait()
		cancel()
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		close(ran)
		for k := range ran {
			t.Errorf("the handler ran %s", k)
		}
	})
}

// A message settled as expired frees its window capacity when the
// settlement is sent, not when the broker confirms it: a route draining a
// stale backlog is not paced by confirmations. It stays held until then.
func TestDroppedMessagesFreeTheWindowBeforeConfirmation(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.Confirm = sluicetest.ConfirmManual
		c, err := consumer.New(consumer.Options{}, consumer.Route{Name: "r", Source: src, Workers: 1,
			Handler: func(context.Context, *consumer.Message) error { return nil },
			Window:  consumer.WindowPolicy{Messages: 4}})
		if err != nil {
			t.Fatal(err)
		}
		past := consumer.Headers{expiry.DefaultHeader: {expiry.FormatDeadline(time.Now().Add(-time.Second))}}
		for i := range 10 {
			src.Publish(fmt.Sprint(i), nil, past, time.Now())
		}
		ctx, cancel := context.WithCancel(context.Background())
		errc := make(chan error, 1)
		go func() { errc <- c.Run(ctx) }()
		synctest.Wait()
		s := c.Stats()[0]
		if s.Fetched != 10 || s.Window.InUse != 0 || s.Held != 10 || src.Awaiting() != 10 {
			t.Errorf("unconfirmed: fetched %d, window %d in use, held %d, %d awaiting confirmation; want 10, 0, 10, 10",
				s.Fetched, s.Window.InUse, s.Held, src.Awaiting())
		}
		src.ConfirmPending(nil)
		synctest.Wait()
		if s := c.Stats()[0]; s.Held != 0 || s.Settled[consumer.OutcomeExpired] != 10 {
			t.Errorf("confirmed: held %d, expired %d", s.Held, s.Settled[consumer.OutcomeExpired])
		}
		cancel()
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
	})
}

// One worker of 2 ms offered 10× with a 100 ms deadline, on a source whose
// fetch takes a 1 ms round trip: 90% of what arrives must be fetched only to
// be dropped. A window of twice the workers (2) drains 2 per round trip and
// falls behind; the default window grows while it drains and keeps goodput
// at capacity.
func TestDefaultWindowGrowsToDrainAStaleBacklog(t *testing.T) {
	o := overload{workers: 1, cost: 2 * time.Millisecond, deadline: 100 * time.Millisecond, load: 10, dur: 2 * time.Second, rtt: time.Millisecond}
	r := o.run(t)
	t.Logf("default window: goodput %.0f/s of %.0f/s, window limit now %d of %d, peak %d", r.goodput, r.capacity, r.stats.Window.Limit, r.stats.WindowMessages, r.stats.Window.Peak)
	if r.goodput < 0.97*r.capacity || r.wasted > 0 {
		t.Errorf("default window: goodput %.0f/s (%.0f%%), %d wasted", r.goodput, 100*r.goodput/r.capacity, r.wasted)
	}
	if r.stats.WindowMessages != consumer.DefaultDrainWindow || r.stats.Window.Peak <= 2 {
		t.Errorf("window bound %d, peak %d: want %d and more than 2", r.stats.WindowMessages, r.stats.Window.Peak, consumer.DefaultDrainWindow)
	}
	o.route = func(r *consumer.Route) { r.Window.Messages = 2 }
	fixed := o.run(t)
	t.Logf("window of 2: goodput %.0f/s of %.0f/s", fixed.goodput, fixed.capacity)
	if fixed.goodput > 0.5*fixed.capacity {
		t.Errorf("a window of 2 kept %.0f/s: the test does not exercise the drain", fixed.goodput)
	}
}

// Without drops the default window stays at twice the workers, and it
// comes back there after an overload.
func TestDefaultWindowStaysSmallWithoutDrops(t *testing.T) {
	o := overload{workers: 4, cost: 20 * time.Millisecond, deadline: 500 * time.Millisecond, load: 0.8, dur: 2 * time.Second, rtt: time.Millisecond}
	r := o.run(t)
	if r.stats.Window.Peak > 8 || r.stats.Window.Limit != 8 {
		t.Errorf("at 0.8×: window peak %d, limit %d; want at most 8", r.stats.Window.Peak, r.stats.Window.Limit)
	}
}
