package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

// The ledger under the overload policies, stopped mid-run so shutdown meets
// a full local queue, waiters on shared Slots and a shrunken adaptive
// window: every delivery is settled exactly once (memsource reports double
// settlement and redelivery while pending), every message is either
// settled for good or back in the broker, the window ends empty and
// Fetched equals the sum of outcomes.
func TestOverloadLedgerProperty(t *testing.T) {
	seeds := uint64(12)
	if testing.Short() {
		seeds = 3
	}
	for seed := range seeds {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 7))
			// Every third seed has handlers that ignore ctx and a grace too
			// short for them, so Run returns them (ErrStuckHandlers) while
			// they still run; their late results must not settle again.
			stuck := seed%3 == 2
			grace := time.Second
			if stuck {
				grace = time.Microsecond
			}
			var mu sync.Mutex
			intn := func(n int) int { mu.Lock(); defer mu.Unlock(); return rng.IntN(n) }

			slots, _ := backpressure.NewSlots(1 + intn(4))
			budget, _ := backpressure.NewRetryBudget(backpressure.RetryBudgetOptions{})
			srcs := []*sluicetest.Source{sluicetest.NewSource(), sluicetest.NewSource()}
			const n = 400
			now := time.Now()
			for ri, src := range srcs {
				for i := range n {
					var h consumer.Headers
					if intn(2) == 0 {
						h = consumer.Headers{consumer.CriticalityHeader: {backpressure.Criticality(intn(4)).String()}}
					}
					pub := time.Time{}
					if intn(3) == 0 {
						pub = now.Add(-time.Duration(intn(400)) * time.Millisecond)
					}
					src.Publish(fmt.Sprintf("r%d-%d", ri, i), make([]byte, intn(100)), h, pub)
				}
			}
			h := func(ctx context.Context, m *consumer.Message) error {
				x := intn(100)
				switch {
				case x < 3:
					panic("random panic")
				case x < 13:
					return errors.New("retryable")
				case x < 16:
					return consumer.Permanent(errors.New("poison"))
				case x < 22:
					return backpressure.Overloaded(nil)
				case x < 30:
					d := time.Duration(intn(3000)) * time.Microsecond
					if stuck {
						time.Sleep(d) // ignores ctx: shutdown gives up on it
						break
					}
					select {
					case <-time.After(d):
					case <-ctx.Done():
					}
				}
				return nil
			}
			var routes []consumer.Route
			for ri, src := range srcs {
				r := route("r"+strconv.Itoa(ri), src, h)
				r.Workers, r.Window.Messages, r.Window.Bytes, r.Window.MinFetch = 1+intn(4), 8+intn(24), 1500, 1+intn(4)
				r.Overload.Criticality = backpressure.Criticality(intn(4))
				r.Retry.MaxAttempts = 1 + intn(5)
				if intn(2) == 0 {
					r.DeadLetter.Sink = dlq.SinkFunc(func(context.Context, *dlq.Letter) error {
						if intn(10) == 0 {
							return errors.New("dlq down")
						}
						return nil
					})
				}
				r.Overload.Queue.Order = consumer.QueueOrder(intn(2))
				r.Overload.Queue.DropWhenFull = consumer.DropPolicy(intn(4))
				r.Overload.Queue.MaxLength = intn(6)
				r.Overload.OnShed = consumer.ShedAction(intn(2))
				r.DeadLetter.OnOverloaded = consumer.OverloadedAction(intn(2))
				r.DeadLetter.OnExpired = consumer.ExpiredAction(intn(3))
				r.Expiry = expiry.Policy{MaxAge: 300 * time.Millisecond}
				if intn(2) == 0 {
					r.Overload.ShedNearDeadline = time.Duration(intn(100)) * time.Millisecond
				}
				if intn(2) == 0 {
					r.Overload.Slots = slots
				}
				if intn(2) == 0 {
					r.Overload.RetryBudget = budget
				}
				if intn(2) == 0 {
					r.Overload.AdaptiveLimit, _ = backpressure.NewAdaptiveLimit(backpressure.AdaptiveLimitOptions{
						Max: r.Window.Messages, Interval: time.Millisecond, MinSamples: 2, Target: time.Millisecond})
				}
				if intn(2) == 0 {
					r.Overload.Throttle, _ = backpressure.NewThrottle(backpressure.ThrottleOptions{Window: 100 * time.Millisecond, Buckets: 10})
					r.Overload.ThrottleWait = time.Millisecond
				}
				routes = append(routes, r)
			}
			c, err := consumer.New(consumer.Options{ShutdownGrace: grace}, routes...)
			if err != nil {
				t.Fatal(err)
			}
			stop := start(t, c)
			// 12.7: while it runs, no counter ever goes backwards or wraps.
			sampled := make(chan struct{})
			sampling := make(chan struct{})
			go func() {
				defer close(sampled)
				prev := c.Stats()
				for {
					select {
					case <-sampling:
						return
					case <-time.After(200 * time.Microsecond):
					}
					cur := c.Stats()
					for i := range cur {
						if msg := backwards(prev[i], cur[i]); msg != "" {
							t.Errorf("route %d: %s", i, msg)
							return
						}
					}
					prev = cur
				}
			}()
			time.Sleep(time.Duration(50+intn(150)) * time.Millisecond)
			err = stop()
			close(sampling)
			<-sampled
			if err != nil && !(stuck && errors.Is(err, consumer.ErrStuckHandlers)) {
				t.Fatal(err)
			}
			if stuck {
				time.Sleep(50 * time.Millisecond) // the stuck handlers finish
			}
			if u := slots.InUse(); u != 0 {
				t.Fatalf("slots in use after Run: %d", u)
			}
			for ri, src := range srcs {
				s := c.Stats()[ri]
				if s.Held != 0 || s.Window.InUseBytes != 0 || s.Fetched != settledTotal(s) {
					t.Fatalf("route %d: in flight %d/%d, fetched %d, settled %v", ri, s.Held, s.Window.InUseBytes, s.Fetched, s.Settled)
				}
				ledger, violations := src.Ledger()
				if len(violations) > 0 {
					t.Fatalf("route %d: %v", ri, violations[:min(5, len(violations))])
				}
				final, pending := 0, 0
				for id, rec := range ledger {
					if rec.Pending {
						pending++ // abandoned to the broker at shutdown
						if rec.Deliveries != rec.Acks+rec.Terms+rec.Naks+1 {
							t.Fatalf("%s: %+v", id, rec)
						}
					} else if rec.Deliveries != rec.Acks+rec.Terms+rec.Naks {
						t.Fatalf("%s: %+v", id, rec)
					}
					if rec.Acks+rec.Terms > 1 {
						t.Fatalf("%s: %+v", id, rec)
					}
					final += rec.Acks + rec.Terms
				}
				if uint64(pending) != s.Settled[consumer.OutcomeAbandoned] {
					t.Fatalf("route %d: %d left pending, %d counted abandoned", ri, pending, s.Settled[consumer.OutcomeAbandoned])
				}
				if final+src.Queued()+pending != n {
					t.Fatalf("route %d: %d settled for good + %d back in the broker != %d produced", ri, final, src.Queued(), n)
				}
			}
		})
	}
}

// backwards reports a counter of cur below prev, or goodput above
// successes (a wrapped subtraction), as a message; "" when none.
func backwards(prev, cur consumer.RouteStats) string {
	for o := range cur.Settled {
		if cur.Settled[o] < prev.Settled[o] {
			return fmt.Sprintf("settled[%v] went from %d to %d", consumer.Outcome(o), prev.Settled[o], cur.Settled[o])
		}
	}
	pairs := [][2]uint64{{prev.Fetched, cur.Fetched}, {prev.Late, cur.Late}, {prev.Errors.Handler, cur.Errors.Handler},
		{prev.Errors.Settle, cur.Errors.Settle}, {prev.KeepAlives, cur.KeepAlives}, {prev.Overload.ThrottleRefused, cur.Overload.ThrottleRefused}}
	for i, p := range pairs {
		if p[1] < p[0] {
			return fmt.Sprintf("counter %d went from %d to %d", i, p[0], p[1])
		}
	}
	if cur.Goodput() > cur.Settled[consumer.OutcomeSucceeded] || cur.Fetched < settledTotal(cur) {
		return fmt.Sprintf("goodput %d, succeeded %d, fetched %d, settled %d", cur.Goodput(), cur.Settled[consumer.OutcomeSucceeded], cur.Fetched, settledTotal(cur))
	}
	return ""
}
