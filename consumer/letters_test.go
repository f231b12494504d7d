package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

// The tests in this file pin the dead letters a route keeps retrying (a
// last delivery, or a message of an ordered route, whose write failed):
// they are retried off the workers, the reaper and the fetch loop, by the
// route's letter retrier, and never hold up a shutdown past its grace.

// stopWithin stops c (through stop) and reports Run's error and how long
// it took; when Run has not returned within limit it fails the test, then
// calls unstick (which must let Run return) and waits.
func stopWithin(t *testing.T, stop func() error, limit time.Duration, unstick func()) (error, time.Duration) {
	t.Helper()
	begin := time.Now()
	errc := make(chan error, 1)
	go func() { errc <- stop() }()
	select {
	case err := <-errc:
		return err, time.Since(begin)
	case <-time.After(limit):
		t.Errorf("Run has not returned %v after its ctx ended", limit)
		unstick()
		return <-errc, time.Since(begin)
	}
}

// Item 10 (issue 24): with the dead-letter store down, poison messages on
// the broker's last delivery are kept and their letters retried, but not
// on the workers: good messages behind them still run. Before, each
// worker retried its poison message's letter in place, and with as many
// poison messages as workers the route ran nothing else.
func TestPoisonWithSinkDownLeavesWorkersFree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.MaxDeliver = 1            // every delivery is the last
		src.AckWait = 3 * time.Second // kept alive every second
		for i := range 2 {
			src.Publish(fmt.Sprintf("poison%d", i), []byte("v"), nil, time.Time{})
		}
		const good = 20
		for i := range good {
			src.Publish(fmt.Sprintf("good%d", i), []byte("v"), nil, time.Time{})
		}
		var sink sluicetest.Sink
		sink.FailWith(func(*dlq.Letter) error { return errDown })
		r := route("r", src, func(_ context.Context, m *consumer.Message) error {
			if strings.HasPrefix(string(m.Key), "poison") {
				return errors.New("poison")
			}
			return nil
		})
		r.Workers, r.Retry.MaxAttempts, r.Window.Messages = 2, 1, 8
		r.DeadLetter.Sink = &sink
		c, err := consumer.New(consumer.Options{ShutdownGrace: time.Second}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		s := c.Stats()[0]
		if s.Settled[consumer.OutcomeSucceeded] != good || s.Held != 2 {
			t.Errorf("sink down, 2 poison messages on their last delivery, 2 workers: succeeded %d of %d, held %d (want the 2 poison)",
				s.Settled[consumer.OutcomeSucceeded], good, s.Held)
		}
		// Two writes that failed on the workers, then one probe per backoff
		// (50-100 ms, doubling to 2.5-5 s): at most 8 probes in 10 s.
		writes := sink.Writes()
		if writes < 3 || writes > 2+8 {
			t.Errorf("%d letter writes in 10 s: want one probe of the store per backoff", writes)
		}
		ledger, _ := src.Ledger()
		for i := range 2 {
			if rec := ledger[fmt.Sprintf("poison%d", i)]; rec.InProgress < 5 {
				t.Errorf("poison%d kept alive %d times in 10 s (every second)", i, rec.InProgress)
			}
		}
		sink.FailWith(nil) // the store is back: the kept letters are written
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		ledger, errs := src.Ledger()
		for i := range 2 {
			rec := ledger[fmt.Sprintf("poison%d", i)]
			if rec.Dropped || rec.Naks != 0 || rec.Terms != 1 {
				t.Errorf("poison%d: %+v: want kept (never nak'd), then terminated once its letter was written", i, rec)
			}
		}
		if s := c.Stats()[0]; len(errs) > 0 || len(sink.Letters()) != 2 || s.Settled[consumer.OutcomeDeadLettered] != 2 {
			t.Fatalf("violations %v, letters %d, settled %v", errs, len(sink.Letters()), s.Settled)
		}
	})
}

// Item 1 (issue 24): the reaper expires a queued last delivery with
// OnExpired ExpiredDeadLetter while the store is down. Before, the reaper
// retried the write on the handlers' ctx and Run waited for the reaper
// before cancelling that ctx: Run never returned, and the running handler
// was never cancelled.
func TestReaperLetterDoesNotBlockShutdown(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		t.Run(fmt.Sprintf("ordered=%v", ordered), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { reaperLetterAtShutdown(t, ordered) })
		})
	}
}

func reaperLetterAtShutdown(t *testing.T, ordered bool) {
	src := sluicetest.NewSource()
	if !ordered {
		src.MaxDeliver = 1 // every delivery is the last
	}
	soon := expiry.FormatDeadline(time.Now().Add(time.Second))
	src.PublishMsg(sluicetest.Msg{ID: "busy", Key: []byte("k")})
	src.PublishMsg(sluicetest.Msg{ID: "late", Key: []byte("k"), Headers: consumer.Headers{expiry.DefaultHeader: {soon}}})
	// A store that refuses writes until the test repairs it (then it
	// takes them even past its ctx, so a stuck Run can still end).
	var down atomic.Bool
	var writes atomic.Int64
	down.Store(true)
	sink := dlq.SinkFunc(func(context.Context, *dlq.Letter) error {
		writes.Add(1)
		if down.Load() {
			return errDown
		}
		return nil
	})
	var cancelled atomic.Bool
	r := route("r", src, func(ctx context.Context, m *consumer.Message) error {
		<-ctx.Done() // honours its ctx
		cancelled.Store(true)
		return ctx.Err()
	})
	r.Workers, r.Retry.MaxAttempts, r.Window.Messages = 1, 1, 8
	if ordered {
		r.Ordering = consumer.ByKey
	}
	r.DeadLetter = consumer.DeadLetterPolicy{Sink: sink, OnExpired: consumer.ExpiredDeadLetter}
	const grace = 2 * time.Second
	c, err := consumer.New(consumer.Options{ShutdownGrace: grace}, r)
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, c)
	time.Sleep(5 * time.Second) // "late" expires in the queue (or behind "busy", ordered)
	synctest.Wait()
	if s := c.Stats()[0]; s.Errors.DeadLetter == 0 {
		t.Fatalf("the reaper wrote no letter: %+v", s)
	}
	err, took := stopWithin(t, stop, grace+consumer.ShutdownSlack+time.Second, func() { down.Store(false) })
	if err != nil || took > grace+consumer.ShutdownSlack {
		t.Errorf("Run returned %v after %v, want nil within %v", err, took, grace+consumer.ShutdownSlack)
	}
	if !cancelled.Load() {
		t.Error("the running handler was never cancelled")
	}
	rec := ledgerOf(t, src)["late"]
	if rec.Dropped || rec.Acks != 0 {
		t.Errorf("late: %+v: an expired message whose letter was never written must not be acked or dropped", rec)
	}
	if s := c.Stats()[0]; s.Held != 0 || settledTotal(s) != s.Fetched {
		t.Errorf("held %d, settled %v of %d", s.Held, s.Settled, s.Fetched)
	}
}

// Item 7 (issue 24): the fetch loop expires a last delivery at fetch
// (OnExpired ExpiredDeadLetter) while the store refuses writes. Before,
// the fetch loop retried the write in place until the handlers' ctx ended,
// so every shutdown took the full grace and slack and returned
// ErrStuckHandlers though no handler was stuck and the sink honoured its
// ctx (and under -race, the fetch goroutine wrote Run's error slice after
// Run had read it).
func TestFetchLoopLetterDoesNotMakeShutdownStuck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.MaxDeliver = 1
		past := expiry.FormatDeadline(time.Now().Add(-time.Minute))
		src.Publish("expired", []byte("v"), consumer.Headers{expiry.DefaultHeader: {past}}, time.Time{})
		var sink sluicetest.Sink
		sink.FailWith(func(*dlq.Letter) error { return errDown })
		var ran atomic.Int64
		r := route("r", src, func(context.Context, *consumer.Message) error { ran.Add(1); return nil })
		r.Retry.MaxAttempts = 1
		r.DeadLetter = consumer.DeadLetterPolicy{Sink: &sink, OnExpired: consumer.ExpiredDeadLetter}
		const grace = 2 * time.Second
		c, err := consumer.New(consumer.Options{ShutdownGrace: grace}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(3 * time.Second)
		synctest.Wait()
		src.Publish("next", []byte("v"), nil, time.Time{})
		time.Sleep(time.Second)
		synctest.Wait()
		if ran.Load() != 1 {
			t.Errorf("the fetch loop took nothing in while the letter was retried: %d handled", ran.Load())
		}
		err, took := stopWithin(t, stop, grace+consumer.ShutdownSlack+time.Second, func() { sink.FailWith(nil) })
		if err != nil || took > grace {
			t.Errorf("Run returned %v after %v, want nil within the grace (%v)", err, took, grace)
		}
		rec := ledgerOf(t, src)["expired"]
		if rec.Dropped || rec.Naks+rec.Acks+rec.Terms != 0 {
			t.Errorf("expired: %+v: want kept, then left to the broker", rec)
		}
		if s := c.Stats()[0]; s.Settled[consumer.OutcomeAbandoned] != 1 || s.Held != 0 {
			t.Errorf("settled %v, held %d", s.Settled, s.Held)
		}
	})
}

// Item 9 (issue 24): at shutdown a message on the broker's last delivery
// cannot be handed back (a Nak would drop it). A worker still runs it
// within the grace; what does not run (the grace ended, its handler was
// cancelled) is dead-lettered with class "shutdown". Before, the ones still
// queued were abandoned: with MaxDeliver, lost to the consumer.
func TestShutdownLastDeliveriesRunOrDeadLettered(t *testing.T) {
	for _, ordered := range []bool{false, true} {
		t.Run(fmt.Sprintf("ordered=%v", ordered), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) { shutdownLastDeliveries(t, ordered) })
		})
	}
}

// shutdownLastDeliveries: on an ordered route a last delivery is not run
// at shutdown (its key's earlier messages may have been handed back): it is
// dead-lettered at once.
func shutdownLastDeliveries(t *testing.T, ordered bool) {
	src := sluicetest.NewSource()
	src.MaxDeliver = 1 // every delivery is the last
	const n = 6
	for i := range n {
		src.Publish(fmt.Sprintf("m%d", i), []byte("v"), nil, time.Time{})
	}
	var sink sluicetest.Sink
	r := route("r", src, func(ctx context.Context, _ *consumer.Message) error {
		select {
		case <-time.After(time.Second):
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	r.Workers, r.Retry.MaxAttempts, r.Window.Messages = 1, 1, 8
	r.DeadLetter.Sink = &sink
	ran := 2 // m0 ends at 1 s, m1 at 2 s, m2 is cancelled at 2.7 s (the grace)
	if ordered {
		r.Ordering = consumer.ByKey // one key per message
		ran = 1                     // m0 ends at 1 s; the others are not run
	}
	const grace = 2200 * time.Millisecond
	c, err := consumer.New(consumer.Options{ShutdownGrace: grace}, r)
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, c)
	time.Sleep(500 * time.Millisecond) // m0 runs, m1..m5 queued
	err, took := stopWithin(t, stop, grace+consumer.ShutdownSlack+time.Second, func() {})
	if err != nil || took > grace+consumer.ShutdownSlack {
		t.Fatalf("Run returned %v after %v", err, took)
	}
	s := c.Stats()[0]
	if s.Settled[consumer.OutcomeSucceeded] != uint64(ran) || s.Settled[consumer.OutcomeDeadLettered] != uint64(n-ran) ||
		s.Settled[consumer.OutcomeAbandoned] != 0 || s.LastAbandoned != 0 || s.Errors.Handler != 0 {
		t.Errorf("settled %v, last abandoned %d, handler errors %d: want %d run within the grace, the rest dead-lettered",
			s.Settled, s.LastAbandoned, s.Errors.Handler, ran)
	}
	for _, l := range sink.Letters() {
		if l.Class != consumer.ClassShutdown {
			t.Errorf("letter %s: class %q", l.Key, l.Class)
		}
	}
	ledger, errs := src.Ledger()
	for id, rec := range ledger {
		if rec.Dropped || rec.Naks != 0 || rec.Acks+rec.Terms != 1 || len(errs) > 0 {
			t.Errorf("%s: %+v %v: want acked or terminated after its letter", id, rec, errs)
		}
	}
}

// Item 9 (issue 24): when even the shutdown letter cannot be written (the
// store is down), the last delivery is abandoned to the broker, never
// nak'd, and counted apart (RouteStats.LastAbandoned): the broker will not
// deliver it again, so only a recovery from the stream brings it back.
func TestShutdownLastDeliveriesAbandonedWhenTheStoreIsDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.MaxDeliver = 1
		const n = 4
		for i := range n {
			src.Publish(fmt.Sprintf("m%d", i), []byte("v"), nil, time.Time{})
		}
		var sink sluicetest.Sink
		sink.FailWith(func(*dlq.Letter) error { return errDown })
		r := route("r", src, func(ctx context.Context, _ *consumer.Message) error {
			<-ctx.Done() // runs until the shutdown cancels it
			return ctx.Err()
		})
		r.Workers, r.Retry.MaxAttempts, r.Window.Messages = 1, 1, 8
		r.DeadLetter.Sink = &sink
		const grace = time.Second
		c, err := consumer.New(consumer.Options{ShutdownGrace: grace}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		synctest.Wait()
		err, took := stopWithin(t, stop, grace+consumer.ShutdownSlack+time.Second, func() {})
		if err != nil || took > grace+consumer.ShutdownSlack {
			t.Fatalf("Run returned %v after %v", err, took)
		}
		s := c.Stats()[0]
		if s.Settled[consumer.OutcomeAbandoned] != n || s.LastAbandoned != n || s.Held != 0 {
			t.Errorf("settled %v, last abandoned %d, held %d", s.Settled, s.LastAbandoned, s.Held)
		}
		if sink.Writes() < n {
			t.Errorf("%d letter writes for %d last deliveries", sink.Writes(), n)
		}
		for id, rec := range ledgerOf(t, src) {
			if rec.Dropped || rec.Naks+rec.Acks+rec.Terms != 0 || !rec.Pending {
				t.Errorf("%s: %+v: want left to the broker", id, rec)
			}
		}
	})
}

// Item 10 (issue 24), in figures: 2,000 good messages (4 workers, 5 ms
// each: 2.5 s of virtual time) with 20 poison messages on their last
// delivery among them and the store down the whole time. The poison
// messages' letters are kept and retried; the good traffic runs at close to
// its clean pace (2.53 s against 2.5 s). Before, the first 4 poison
// messages took the 4 workers for good: 300 of 2,000 in a minute.
func TestPoisonWithSinkDownCostsGoodTrafficLittle(t *testing.T) {
	const good, poison = 2000, 20
	pace := func(withPoison bool) (time.Duration, uint64) {
		var took time.Duration
		var done uint64
		synctest.Test(t, func(t *testing.T) {
			src := sluicetest.NewSource()
			src.MaxDeliver = 1
			for i := range good {
				if withPoison && i%(good/poison) == 0 {
					src.Publish(fmt.Sprintf("poison%d", i), []byte("v"), nil, time.Time{})
				}
				src.Publish(fmt.Sprintf("good%d", i), []byte("v"), nil, time.Time{})
			}
			var sink sluicetest.Sink
			sink.FailWith(func(*dlq.Letter) error { return errDown })
			r := route("r", src, func(_ context.Context, m *consumer.Message) error {
				time.Sleep(5 * time.Millisecond)
				if strings.HasPrefix(string(m.Key), "poison") {
					return errors.New("poison")
				}
				return nil
			})
			r.Workers, r.Retry.MaxAttempts, r.Window.Messages = 4, 1, 64
			r.DeadLetter.Sink = &sink
			c, err := consumer.New(consumer.Options{ShutdownGrace: time.Millisecond}, r)
			if err != nil {
				t.Fatal(err)
			}
			stop := start(t, c)
			begin := time.Now()
			for c.Stats()[0].Settled[consumer.OutcomeSucceeded] < good && time.Since(begin) < time.Minute {
				time.Sleep(10 * time.Millisecond)
			}
			took, done = time.Since(begin), c.Stats()[0].Settled[consumer.OutcomeSucceeded]
			_ = stop()
		})
		return took, done
	}
	clean, _ := pace(false)
	dirty, done := pace(true)
	t.Logf("%d good messages: %v clean; %v with %d poison on their last delivery and the store down (%d done)", good, clean, dirty, poison, done)
	if done != good || dirty > clean+clean/4 {
		t.Fatalf("with poison and the store down: %d of %d good in %v, clean pace %v: want within 1.25× the clean time", done, good, dirty, clean)
	}
}

// Kept messages hold their window slots (and no worker): poison on its last
// delivery with the store down stops a route's intake only once it fills
// the window (package doc).
func TestKeptLettersHoldTheirWindowSlots(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.MaxDeliver = 1
		src.Publish("poison0", []byte("v"), nil, time.Time{})
		src.Publish("poison1", []byte("v"), nil, time.Time{})
		src.Publish("good", []byte("v"), nil, time.Time{})
		var sink sluicetest.Sink
		sink.FailWith(func(*dlq.Letter) error { return errDown })
		r := route("r", src, func(_ context.Context, m *consumer.Message) error {
			if strings.HasPrefix(string(m.Key), "poison") {
				return errors.New("poison")
			}
			return nil
		})
		r.Workers, r.Retry.MaxAttempts, r.Window.Messages, r.Window.MinFetch = 4, 1, 2, 1
		r.DeadLetter.Sink = &sink
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if s := c.Stats()[0]; s.Window.InUse != 2 || s.Fetched != 2 || s.Held != 2 {
			t.Errorf("window %d in use, fetched %d, held %d: want the 2 kept messages holding the whole window", s.Window.InUse, s.Fetched, s.Held)
		}
		sink.FailWith(nil)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if s := c.Stats()[0]; s.Settled[consumer.OutcomeSucceeded] != 1 || s.Settled[consumer.OutcomeDeadLettered] != 2 || s.Window.InUse != 0 {
			t.Errorf("once the store is back: settled %v, window %d in use", s.Settled, s.Window.InUse)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	})
}
