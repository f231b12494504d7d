package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/sluicetest"
)

// An AdaptiveLimit whose Max is above the route's MaxInFlight is capped to
// it, so the first bad interval shrinks the window itself rather than an
// invisible limit far above it (1000 → 800 → … would take ~20 intervals to
// reach a window of 8).
func TestAdaptiveLimitCappedToWindow(t *testing.T) {
	al, err := backpressure.NewAdaptiveLimit(backpressure.AdaptiveLimitOptions{Max: 1000,
		Interval: time.Nanosecond, MinSamples: 1, Cooldown: -1, Target: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	src := sluicetest.NewSource()
	r := route("capped", src, func(ctx context.Context, m *consumer.Message) error {
		return backpressure.Overloaded(errors.New("downstream full"))
	})
	r.Workers, r.Window.Messages, r.Window.MinFetch = 1, 8, 1
	r.Overload.AdaptiveLimit = al
	c, err := consumer.New(consumer.Options{}, r)
	if err != nil {
		t.Fatal(err)
	}
	if _, hi := al.Bounds(); hi != 8 || al.Limit() != 8 || c.Stats()[0].Window.Limit != 8 {
		t.Fatalf("bounds hi %d, limit %d, window %d: want all 8", hi, al.Limit(), c.Stats()[0].Window.Limit)
	}
	stop := start(t, c)
	src.Publish("m0", []byte("x"), nil, time.Time{})
	src.Publish("m1", []byte("x"), nil, time.Time{})
	eventually(t, "window shrinks", func() bool { return c.Stats()[0].Window.Limit < 8 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if got, want := c.Stats()[0].Window.Limit, al.Limit(); got != want {
		t.Fatalf("window limit %d, adaptive limit %d", got, want)
	}
}

// Workers report results concurrently; whenever the route is idle the
// window's limit must be the AdaptiveLimit's. Before the fix a worker that
// had observed an older value could re-apply it after another worker
// applied a newer one, leaving the window off until the next change.
func TestAdaptiveLimitWindowAgreesWhenIdle(t *testing.T) {
	al, err := backpressure.NewAdaptiveLimit(backpressure.AdaptiveLimitOptions{Min: 1, Max: 64,
		Interval: time.Nanosecond, MinSamples: 1, Cooldown: -1, Target: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	src := sluicetest.NewSource()
	var n atomic.Int64
	r := route("agree", src, func(ctx context.Context, m *consumer.Message) error {
		if n.Add(1)%3 == 0 {
			return backpressure.Overloaded(nil) // shrink
		}
		return nil // grow
	})
	r.Workers, r.Window.Messages, r.Window.MinFetch = 8, 64, 1
	r.DeadLetter.OnOverloaded = consumer.OverloadedNak
	r.Retry.MaxAttempts = 1000 // "overloaded" counts as an attempt; this test only hands back
	r.Overload.AdaptiveLimit = al
	c, err := consumer.New(consumer.Options{}, r)
	if err != nil {
		t.Fatal(err)
	}
	start(t, c)
	rounds := 400
	if testing.Short() {
		rounds = 40
	}
	for round := range rounds {
		for i := range 64 {
			src.Publish(fmt.Sprintf("r%d-%d", round, i), []byte("x"), nil, time.Time{})
		}
		// Overloaded results are nak'd and come back until each message
		// succeeds. A success is counted after its handler's feedback, so
		// once every message has succeeded no feedback is pending.
		deadline := time.Now().Add(10 * time.Second)
		for {
			s := c.Stats()[0]
			if s.Settled[consumer.OutcomeSucceeded] == uint64(64*(round+1)) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: not drained: %+v", round, s)
			}
			time.Sleep(100 * time.Microsecond)
		}
		if got, want := c.Stats()[0].Window.Limit, al.Limit(); got != want {
			t.Fatalf("round %d: idle window limit %d, adaptive limit %d", round, got, want)
		}
	}
}

// A handler that ignores cancellation is given up on at shutdown: its
// message is abandoned (left to the broker). When the handler finally
// returns a permanent error, the message must not also be written to the
// DLQ and terminated: it already ended in "abandoned".
func TestStuckHandlerNotDeadLetteredAfterReturn(t *testing.T) {
	src := sluicetest.NewSource()
	var box letterBox
	release := make(chan struct{})
	finished := make(chan struct{})
	r := route("stuck", src, func(ctx context.Context, m *consumer.Message) error {
		defer close(finished)
		<-release // ignores ctx
		return consumer.Permanent(errors.New("poison"))
	})
	r.Workers = 1
	r.DeadLetter.Sink = box.sink()
	runs := &runObserver{done: make(chan consumer.Outcome, 1)}
	c, err := consumer.New(consumer.Options{ShutdownGrace: time.Millisecond, Observer: runs}, r)
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, c)
	src.Publish("m0", []byte("x"), nil, time.Time{})
	eventually(t, "running", func() bool { return c.Stats()[0].Fetched == 1 && src.Queued() == 0 })
	if err := stop(); !errors.Is(err, consumer.ErrStuckHandlers) {
		t.Fatalf("Run: %v", err)
	}
	s := c.Stats()[0]
	if s.Settled[consumer.OutcomeAbandoned] != 1 || settledTotal(s) != 1 || s.Held != 0 {
		t.Fatalf("settled %v in flight %d", s.Settled, s.Held)
	}
	close(release)
	<-finished
	// The Observer hears of the run once finish has dealt with its result,
	// which must lose the claim to the shutdown.
	<-runs.done
	if n := box.count(dlq.ClassPermanent); n != 0 {
		t.Fatalf("%d dead letters for a message already abandoned", n)
	}
	if after := c.Stats()[0]; after.Settled != s.Settled {
		t.Fatalf("late result counted: %v then %v", s.Settled, after.Settled)
	}
	ledger, errs := src.Ledger()
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	if rec := ledger["m0"]; rec.Naks != 0 || rec.Terms != 0 || rec.Acks != 0 || !rec.Pending {
		t.Fatalf("m0 %+v: want left pending for the broker", rec)
	}
}

// Routes share Slots(1). A message of route "b" waits for the slot while
// route "a"'s handler holds it; shutdown begins, then a's handler finishes
// within the grace. The slot freed after shutdown began must not start b's
// message: it never started, so it is returned like a queued one.
func TestSlotFreedAfterShutdownDoesNotStartWork(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		slots, err := backpressure.NewSlots(1)
		if err != nil {
			t.Fatal(err)
		}
		srcA, srcB := sluicetest.NewSource(), sluicetest.NewSource()
		release := make(chan struct{})
		var ranB atomic.Int64
		ra := route("a", srcA, func(ctx context.Context, m *consumer.Message) error {
			<-release
			return nil
		})
		rb := route("b", srcB, func(ctx context.Context, m *consumer.Message) error {
			ranB.Add(1)
			return nil
		})
		ra.Workers, rb.Workers = 1, 1
		ra.Overload.Criticality, rb.Overload.Criticality = backpressure.Critical, backpressure.Critical
		ra.Overload.Slots, rb.Overload.Slots = slots, slots
		c, err := consumer.New(consumer.Options{ShutdownGrace: 5 * time.Second}, ra, rb)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		srcA.Publish("a0", []byte("x"), nil, time.Time{})
		synctest.Wait()
		if slots.InUse() != 1 {
			t.Fatal("a does not hold the slot")
		}
		srcB.Publish("b0", []byte("x"), nil, time.Time{})
		synctest.Wait()
		if slots.Waited()[backpressure.Critical] != 1 {
			t.Fatal("b does not wait for the slot")
		}
		errc := make(chan error, 1)
		go func() { errc <- stop() }()
		synctest.Wait() // shutdown under way: Run waits for a within the grace
		close(release)
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if n := ranB.Load(); n != 0 {
			t.Fatalf("b's handler ran %d times after shutdown began", n)
		}
		sb := c.Stats()[1]
		if sb.Settled[consumer.OutcomeReturned] != 1 || sb.Held != 0 || slots.InUse() != 0 {
			t.Fatalf("b settled %v in flight %d, slots in use %d", sb.Settled, sb.Held, slots.InUse())
		}
	})
}

// Shutdown with a full local queue (LIFO order, queue shedding): the
// running message finishes within the grace, every queued one is returned
// exactly once, none runs after shutdown began, the window ends empty and
// the workers exit (goleak in TestMain).
func TestShutdownReturnsLocalQueue(t *testing.T) {
	for _, drop := range []consumer.DropPolicy{consumer.DropNewest, consumer.DropOldest, consumer.DropRandom, consumer.DropLowestCriticality} {
		t.Run(fmt.Sprint(drop), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				src := sluicetest.NewSource()
				release := make(chan struct{})
				var ran atomic.Int64
				r := route("lq", src, func(ctx context.Context, m *consumer.Message) error {
					if string(m.Key) == "m0" {
						<-release
						return nil
					}
					ran.Add(1)
					return nil
				})
				r.Workers, r.Window.Messages, r.Window.MinFetch = 1, 32, 1
				r.Overload.Queue.Order, r.Overload.Queue.DropWhenFull, r.Overload.Queue.MaxLength = consumer.QueueLIFO, drop, 10
				r.Overload.OnShed = consumer.ShedAck
				c, err := consumer.New(consumer.Options{ShutdownGrace: 5 * time.Second}, r)
				if err != nil {
					t.Fatal(err)
				}
				stop := start(t, c)
				src.Publish("m0", []byte("x"), nil, time.Time{})
				synctest.Wait() // m0 runs (and waits for release)
				for i := 1; i <= 20; i++ {
					src.Publish(fmt.Sprintf("m%d", i), []byte("x"), nil, time.Time{})
				}
				synctest.Wait() // all fetched: 10 queued, 10 shed
				if f := c.Stats()[0].Fetched; f != 21 {
					t.Fatalf("fetched %d", f)
				}
				errc := make(chan error, 1)
				go func() { errc <- stop() }()
				synctest.Wait() // shutdown began: Run waits for m0 within the grace
				close(release)
				if err := <-errc; err != nil {
					t.Fatal(err)
				}
				s := c.Stats()[0]
				if ran.Load() != 0 {
					t.Fatalf("%d queued messages ran after shutdown began", ran.Load())
				}
				if s.Settled[consumer.OutcomeSucceeded] != 1 || s.Settled[consumer.OutcomeShed] != 10 ||
					s.Settled[consumer.OutcomeReturned] != 10 || settledTotal(s) != 21 || s.Held != 0 || s.Window.InUseBytes != 0 {
					t.Fatalf("settled %v in flight %d/%d", s.Settled, s.Held, s.Window.InUseBytes)
				}
				ledger, errs := src.Ledger()
				if len(errs) > 0 {
					t.Fatal(errs)
				}
				for id, rec := range ledger {
					if rec.Acks+rec.Naks+rec.Terms != 1 || rec.Pending {
						t.Fatalf("%s %+v", id, rec)
					}
				}
			})
		})
	}
}

// One AdaptiveLimit shared by two routes would size each window from the
// other's results (and be capped to the smaller window): New refuses it.
func TestSharedAdaptiveLimitRefused(t *testing.T) {
	al, _ := backpressure.NewAdaptiveLimit(backpressure.AdaptiveLimitOptions{Max: 8})
	noop := func(context.Context, *consumer.Message) error { return nil }
	a, b := route("a", sluicetest.NewSource(), noop), route("b", sluicetest.NewSource(), noop)
	a.Overload.AdaptiveLimit, b.Overload.AdaptiveLimit = al, al
	if _, err := consumer.New(consumer.Options{}, a, b); !errors.Is(err, consumer.ErrInvalidOption) {
		t.Fatalf("shared AdaptiveLimit: %v", err)
	}
	b.Overload.AdaptiveLimit, _ = backpressure.NewAdaptiveLimit(backpressure.AdaptiveLimitOptions{Max: 8})
	if _, err := consumer.New(consumer.Options{}, a, b); err != nil {
		t.Fatal(err)
	}
}
