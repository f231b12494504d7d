package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

type letterBox struct {
	mu      sync.Mutex
	classes map[string]int
}

func (b *letterBox) sink() dlq.Sink {
	return dlq.SinkFunc(func(_ context.Context, l *dlq.Letter) error {
		b.mu.Lock()
		if b.classes == nil {
			b.classes = map[string]int{}
		}
		b.classes[l.Class]++
		b.mu.Unlock()
		return nil
	})
}

func (b *letterBox) count(class string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.classes[class]
}

func idOf(m *consumer.Message) int {
	n, _ := strconv.Atoi(string(m.Key[1:]))
	return n
}

// Two routes share a byte Budget and a downstream with 4 slots × 10 ms
// (~400/s). CRITICAL is offered 300/s and SHEDDABLE 900/s: 3× capacity
// together, both with a 500 ms deadline. With class-aware Slots the critical
// route keeps ≥95% goodput and the sheddable one absorbs the shedding; the
// same load through a plain shared semaphore is shown for comparison. The
// load runs in a synctest bubble (virtual time): on a machine busy with
// other work the real-time version got too little CPU to serve 400/s and
// the critical route's goodput read 87% (a CI failure under -race -cpu 1).
func TestCriticalityGoodputUnderSharedOverload(t *testing.T) {
	run := func(aware bool) (res shareResult) {
		synctest.Test(t, func(t *testing.T) { res = overloadRun(t, aware) })
		return res
	}
	pct := func(a, b int) float64 { return 100 * float64(a) / float64(b) }
	naive := run(false)
	t.Logf("plain shared semaphore: CRITICAL goodput %d/%d = %.1f%%, SHEDDABLE %d/%d = %.1f%%",
		naive.critGood, naive.critOffered, pct(naive.critGood, naive.critOffered),
		naive.shedGood, naive.shedOffered, pct(naive.shedGood, naive.shedOffered))
	aware := run(true)
	t.Logf("criticality-aware Slots + Budget: CRITICAL goodput %d/%d = %.1f%%, SHEDDABLE %d/%d = %.1f%%",
		aware.critGood, aware.critOffered, pct(aware.critGood, aware.critOffered),
		aware.shedGood, aware.shedOffered, pct(aware.shedGood, aware.shedOffered))
	if pct(aware.critGood, aware.critOffered) < 95 {
		t.Fatalf("critical goodput %.1f%% < 95%%", pct(aware.critGood, aware.critOffered))
	}
	if pct(aware.shedGood, aware.shedOffered) > 60 {
		t.Fatalf("sheddable did not absorb the shedding: %.1f%%", pct(aware.shedGood, aware.shedOffered))
	}
	if pct(naive.critGood, naive.critOffered) >= 95 {
		t.Errorf("the plain semaphore kept critical goodput too (%.1f%%): the load shows nothing", pct(naive.critGood, naive.critOffered))
	}
}

type shareResult struct{ critOffered, critGood, shedOffered, shedGood int }

// overloadRun offers TestCriticalityGoodputUnderSharedOverload's load for 2 s
// through class-aware Slots (aware) or a plain shared semaphore.
func overloadRun(t *testing.T, aware bool) shareResult {
	bg, _ := backpressure.NewBudget(64 << 10)
	slots, _ := backpressure.NewSlots(4)
	plain := make(chan struct{}, 4)
	crit, shed := sluicetest.NewSource(), sluicetest.NewSource()
	handler := func(ctx context.Context, m *consumer.Message) error {
		if !aware {
			select {
			case plain <- struct{}{}:
			case <-ctx.Done():
				return ctx.Err()
			}
			defer func() { <-plain }()
		}
		time.Sleep(10 * time.Millisecond)
		return nil
	}
	mk := func(name string, src *sluicetest.Source, c backpressure.Criticality, reserve int64) consumer.Route {
		r := consumer.Route{
			Name:     name,
			Source:   src,
			Handler:  handler,
			Workers:  8,
			Expiry:   expiry.Policy{MaxAge: 500 * time.Millisecond},
			Window:   consumer.WindowPolicy{Messages: 32, Bytes: 32 << 10},
			Overload: consumer.OverloadPolicy{Criticality: c, ReservedBytes: reserve},
		}
		if aware {
			r.Overload.Slots = slots
		}
		return r
	}
	// The sheddable route has more workers than the critical one, as a
	// batch route often does: through a plain semaphore its waiters
	// outnumber the critical ones and take most of the downstream.
	sr := mk("sheddable", shed, backpressure.Sheddable, 0)
	sr.Workers, sr.Window.Messages = 32, 64
	c, err := consumer.New(consumer.Options{Budget: bg}, mk("critical", crit, backpressure.Critical, 16<<10), sr)
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, c)
	val := make([]byte, 100)
	var res shareResult
	tick := time.NewTicker(10 * time.Millisecond)
	end := time.Now().Add(2 * time.Second)
	for now := range tick.C {
		if now.After(end) {
			break
		}
		for range 3 {
			crit.Publish(fmt.Sprintf("c%d", res.critOffered), val, nil, time.Now())
			res.critOffered++
		}
		for range 9 {
			shed.Publish(fmt.Sprintf("s%d", res.shedOffered), val, nil, time.Now())
			res.shedOffered++
		}
	}
	tick.Stop()
	eventually(t, "drain", func() bool {
		s := c.Stats()
		return crit.Queued() == 0 && shed.Queued() == 0 && s[0].Held == 0 && s[1].Held == 0
	})
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	s := c.Stats()
	res.critGood, res.shedGood = int(s[0].Goodput()), int(s[1].Goodput())
	return res
}

// A downstream that always fails: the retry budget keeps total handler
// attempts within 1.1× the unique messages (without it: 3×), and the
// refused retries go to the DLQ with class "retry-budget".
func TestRetryBudgetBoundsAttemptsAgainstFailingDownstream(t *testing.T) {
	const n = 1000
	budget, _ := backpressure.NewRetryBudget(backpressure.RetryBudgetOptions{})
	src := sluicetest.NewSource()
	for i := range n {
		src.Publish(fmt.Sprintf("m%d", i), []byte("x"), nil, time.Time{})
	}
	var attempts atomic.Int64
	var box letterBox
	r := route("failing", src, func(context.Context, *consumer.Message) error {
		attempts.Add(1)
		return errors.New("downstream 503")
	})
	r.Workers, r.Window.Messages = 4, 64
	r.Overload.RetryBudget = budget
	r.DeadLetter.Sink = box.sink()
	c, err := consumer.New(consumer.Options{}, r)
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, c)
	eventually(t, "all dead-lettered", func() bool { return c.Stats()[0].Settled[consumer.OutcomeDeadLettered] == n })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	s := c.Stats()[0]
	ratio := float64(attempts.Load()) / n
	t.Logf("always-failing downstream, retry budget 10%%: %d attempts for %d messages = %.3f (no budget: 3.000); %d refused retries dead-lettered as %q, %d exhausted",
		attempts.Load(), n, ratio, box.count(consumer.ClassRetryBudget), consumer.ClassRetryBudget, box.count(dlq.ClassExhausted))
	if ratio > 1.1 {
		t.Fatalf("attempts ratio %.3f > 1.1", ratio)
	}
	if s.Overload.RetryBudgetExhausted == 0 || int(s.Overload.RetryBudgetExhausted) != box.count(consumer.ClassRetryBudget) {
		t.Fatalf("RetryBudgetExhausted %d, letters %d", s.Overload.RetryBudgetExhausted, box.count(consumer.ClassRetryBudget))
	}
	ledger, errs := src.Ledger()
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	for id, rec := range ledger {
		if rec.Terms != 1 || rec.Pending {
			t.Fatalf("%s: %+v", id, rec)
		}
	}
}

// Seed 003's nested retries: consumer (3 deliveries) → service layer (3) →
// client (3) → a dependency that always fails costs 27 calls per message.
// With backpressure.Retrier in both layers the bottom sees 3 per delivery:
// 9 per message with the route's default OnOverloaded (OverloadedNak: the
// broker redelivers the "overloaded" message until Retry.MaxAttempts), and
// 3 with OverloadedDeadLetter, the setting the README names (issue 24 item
// 11).
func TestNestedDoNotRetryLayers(t *testing.T) {
	const n = 20
	down := errors.New("dependency failure")
	run := func(sluice bool, on consumer.OverloadedAction) int64 {
		src := sluicetest.NewSource()
		for i := range n {
			src.Publish(fmt.Sprintf("m%d", i), []byte("x"), nil, time.Time{})
		}
		var bottom atomic.Int64
		dep := func(context.Context) error { bottom.Add(1); return down }
		naive := func(f func(context.Context) error) func(context.Context) error {
			return func(ctx context.Context) error {
				var err error
				for range 3 {
					if err = f(ctx); err == nil {
						return nil
					}
				}
				return err
			}
		}
		rt := &backpressure.Retrier{BaseDelay: -1}
		layered := func(f func(context.Context) error) func(context.Context) error {
			return func(ctx context.Context) error { return rt.Do(ctx, f) }
		}
		call := naive(naive(dep))
		if sluice {
			call = layered(layered(dep))
		}
		var box letterBox
		r := route("nested", src, func(ctx context.Context, m *consumer.Message) error { return call(ctx) })
		r.DeadLetter.Sink = box.sink()
		r.DeadLetter.OnOverloaded = on
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		eventually(t, "all dead-lettered", func() bool { return c.Stats()[0].Settled[consumer.OutcomeDeadLettered] == n })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if sluice && box.count(consumer.ClassOverloaded) != n {
			t.Fatalf("overloaded letters %d", box.count(consumer.ClassOverloaded))
		}
		return bottom.Load()
	}
	naive := run(false, consumer.OverloadedNak)
	byDefault := run(true, consumer.OverloadedNak)
	deadLetter := run(true, consumer.OverloadedDeadLetter)
	t.Logf("bottom calls per message: naive nested retries %d, Retrier %d (default OnOverloaded), Retrier + OverloadedDeadLetter %d",
		naive/n, byDefault/n, deadLetter/n)
	if naive != 27*n || byDefault != 9*n || deadLetter != 3*n {
		t.Fatalf("bottom calls %d, %d, %d: want 27, 9 and 3 per message", naive, byDefault, deadLetter)
	}
}

// A downstream with capacity 100/s, offered 300/s. With a route Throttle the
// consumer pulls about K× what the downstream accepts, the rest of the
// backlog waits in the broker, and when capacity returns the pull recovers
// with no reset.
func TestThrottleSlowsThePull(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		th, _ := backpressure.NewThrottle(backpressure.ThrottleOptions{Window: time.Second, Buckets: 10})
		backend := rate.NewLimiter(100, 10)
		var calls, accepted atomic.Int64
		src := sluicetest.NewSource()
		src.HonorDelay = true
		r := route("throttled", src, func(ctx context.Context, m *consumer.Message) error {
			calls.Add(1)
			if !backend.Allow() {
				return backpressure.Overloaded(errors.New("429"))
			}
			accepted.Add(1)
			return nil
		})
		r.Workers, r.Window.Messages = 4, 64
		r.Retry = consumer.RetryPolicy{BaseDelay: 200 * time.Millisecond, MaxDelay: 200 * time.Millisecond}
		r.Overload.Throttle = th
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		start(t, c)
		var published atomic.Int64
		produce := func(d time.Duration) {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			end := time.Now().Add(d)
			for now := range tick.C {
				if now.After(end) {
					return
				}
				for range 3 {
					src.Publish(fmt.Sprintf("m%d", published.Add(1)), []byte("x"), nil, time.Time{})
				}
			}
		}
		measure := func(d time.Duration) (fetched, sent, acc float64) {
			f0, c0, a0 := c.Stats()[0].Fetched, calls.Load(), accepted.Load()
			produce(d)
			sec := d.Seconds()
			return float64(c.Stats()[0].Fetched-f0) / sec, float64(calls.Load()-c0) / sec, float64(accepted.Load()-a0) / sec
		}
		measure(time.Second) // warm up: the window fills with the overload
		f, s, a := measure(2 * time.Second)
		p := c.Stats()[0].Overload.ThrottleProbability
		t.Logf("overload (capacity 100/s, offered 300/s): pulled %.0f/s, backend sees %.0f/s, accepts %.0f/s (%.2f×), p=%.2f, backlog in broker %d",
			f, s, a, s/a, p, src.Queued())
		if s > 2.5*a || s > 290 {
			t.Fatalf("backend sees %.0f/s for %.0f/s accepted", s, a)
		}
		backend.SetLimit(2000)
		backend.SetBurst(100)
		measure(2 * time.Second) // recovering: p decays with the window
		f, s, a = measure(time.Second)
		p = c.Stats()[0].Overload.ThrottleProbability
		t.Logf("capacity back (2000/s): pulled %.0f/s, backend sees %.0f/s, accepts %.0f/s, p=%.2f, backlog %d, refused slots %d",
			f, s, a, p, src.Queued(), c.Stats()[0].Overload.ThrottleRefused)
		if a < 250 || p > 0.05 {
			t.Fatalf("did not recover: accepts %.0f/s, p=%.2f", a, p)
		}
	})
}
