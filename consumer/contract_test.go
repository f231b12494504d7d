package consumer_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

// The tests in this file pin the settlement contract (package doc): each
// runs in a synctest bubble, so time is fake and "nothing happened"
// assertions follow synctest.Wait, not a sleep.

var errDown = errors.New("dead-letter store down")

// 12.1: on the broker's last delivery a failed dead-letter write is not
// answered with a Nak (the broker would drop the message): the route keeps
// the message and retries the write until it succeeds.
func TestLastDeliveryDeadLetterWriteRetriedInProcess(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.MaxDeliver = 2
		src.Publish("m", []byte("v"), nil, time.Time{})
		var sink sluicetest.Sink
		var writes atomic.Int64
		sink.FailWith(func(*dlq.Letter) error {
			if writes.Add(1) <= 3 {
				return errDown
			}
			return nil
		})
		r := route("r", src, func(context.Context, *consumer.Message) error { return errors.New("boom") })
		r.Retry.MaxAttempts = 2
		r.DeadLetter.Sink = &sink
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(time.Minute)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		ledger, errs := src.Ledger()
		rec := ledger["m"]
		if len(errs) > 0 || rec.Dropped || rec.Naks != 1 || rec.Terms != 1 || len(sink.Letters()) != 1 {
			t.Fatalf("ledger %+v %v, letters %d: want one Nak (attempt 1), then kept until the letter was written", rec, errs, len(sink.Letters()))
		}
		s := c.Stats()[0]
		if s.Settled[consumer.OutcomeDeadLettered] != 1 || s.Errors.DeadLetter != 3 || s.Errors.Last == "" {
			t.Fatalf("stats %+v", s)
		}
	})
}

// 12.1: when the write still fails at shutdown, a last delivery is left to
// the broker (abandoned), never nak'd.
func TestLastDeliveryNeverNakedAtShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.MaxDeliver = 2
		src.Publish("m", []byte("v"), nil, time.Time{})
		var sink sluicetest.Sink
		sink.FailWith(func(*dlq.Letter) error { return errDown })
		r := route("r", src, func(context.Context, *consumer.Message) error { return errors.New("boom") })
		r.Retry.MaxAttempts = 2
		r.DeadLetter.Sink = &sink
		c, err := consumer.New(consumer.Options{ShutdownGrace: time.Second}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(10 * time.Second)
		synctest.Wait()
		begin := time.Now()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(begin); d > time.Second+consumer.ShutdownSlack {
			t.Fatalf("Run took %v to return", d)
		}
		rec := ledgerOf(t, src)["m"]
		if rec.Dropped || rec.Naks != 1 || rec.Terms+rec.Acks != 0 || !rec.Pending {
			t.Fatalf("ledger %+v: want the last delivery left pending, not nak'd", rec)
		}
		if s := c.Stats()[0]; s.Settled[consumer.OutcomeAbandoned] != 1 || s.Held != 0 {
			t.Fatalf("stats %+v", s.Settled)
		}
	})
}

// 12.1: messages still queued at shutdown are returned, except a last
// delivery, which is left to the broker; a handler cancelled by the
// shutdown has its message returned too, not counted as a failure.
func TestShutdownGivesBackWithoutLosingLastDeliveries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.MaxDeliver = 1 // every delivery is the last
		for i := range 3 {
			src.Publish(strconv.Itoa(i), []byte("v"), nil, time.Time{})
		}
		r := route("r", src, func(ctx context.Context, _ *consumer.Message) error {
			<-ctx.Done() // honours cancellation
			return ctx.Err()
		})
		r.Workers, r.Retry.MaxAttempts = 1, 1
		c, err := consumer.New(consumer.Options{ShutdownGrace: time.Second}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		for id, rec := range ledgerOf(t, src) {
			if rec.Dropped || rec.Naks+rec.Acks+rec.Terms != 0 || !rec.Pending {
				t.Fatalf("%s: %+v: a last delivery must be left to the broker at shutdown", id, rec)
			}
		}
		s := c.Stats()[0]
		if s.Settled[consumer.OutcomeAbandoned] != 3 || s.LastAbandoned != 3 || s.Errors.Handler != 0 {
			t.Fatalf("settled %v, last abandoned %d, handler errors %d", s.Settled, s.LastAbandoned, s.Errors.Handler)
		}
	})
}

// 12.3: Run returns within ShutdownGrace + ShutdownSlack even when the fetch
// loop is inside a dead-letter write that only ends with its ctx.
func TestShutdownBoundedWhileFetchLoopWritesALetter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		past := expiry.FormatDeadline(time.Now().Add(-time.Minute))
		src.Publish("expired", []byte("v"), consumer.Headers{expiry.DefaultHeader: {past}}, time.Time{})
		entered := make(chan struct{}, 1)
		r := route("r", src, func(context.Context, *consumer.Message) error { return nil })
		r.DeadLetter = consumer.DeadLetterPolicy{OnExpired: consumer.ExpiredDeadLetter,
			Sink: dlq.SinkFunc(func(ctx context.Context, _ *dlq.Letter) error {
				entered <- struct{}{}
				<-ctx.Done() // a store that hangs until told to stop
				return ctx.Err()
			})}
		const grace = 2 * time.Second
		c, err := consumer.New(consumer.Options{ShutdownGrace: grace}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		<-entered
		begin := time.Now()
		err = stop()
		if d := time.Since(begin); d > grace+consumer.ShutdownSlack {
			t.Fatalf("Run returned %v after its ctx ended, want <= %v", d, grace+consumer.ShutdownSlack)
		}
		if err != nil {
			t.Fatal(err)
		}
		rec := ledgerOf(t, src)["expired"]
		if rec.Naks != 1 || rec.Acks+rec.Terms != 0 {
			t.Fatalf("ledger %+v: the unwritten letter's original must be handed back", rec)
		}
	})
}

// 12.4: a message waiting for window capacity (here an oversized one,
// admitted alone once the window is empty) is kept alive like any other.
func TestKeepAliveCoversMessagesWaitingForTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.AckWait = 3 * time.Second // keep-alive every second
		src.PublishSized("slow", []byte("v"), nil, time.Time{}, 10)
		src.PublishSized("big", []byte("v"), nil, time.Time{}, 500)
		r := route("r", src, func(ctx context.Context, m *consumer.Message) error {
			if string(m.Key) == "slow" {
				time.Sleep(10 * time.Second)
			}
			return nil
		})
		r.Window = consumer.WindowPolicy{Messages: 2, Bytes: 100, MinFetch: 1}
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if got := ledgerOf(t, src)["big"].InProgress; got < 3 {
			t.Fatalf("the message waiting for the window got %d keep-alives in 5 s (AckWait 3 s)", got)
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		if s := c.Stats()[0]; s.Settled[consumer.OutcomeSucceeded] != 2 {
			t.Fatalf("settled %v", s.Settled)
		}
	})
}

// 12.7: a success of a stuck handler, reported after its message was
// abandoned at shutdown, is not counted: Goodput never wraps.
func TestLateResultOfAbandonedMessageIsNotCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		soon := expiry.FormatDeadline(time.Now().Add(time.Second))
		src.Publish("m", []byte("v"), consumer.Headers{expiry.DefaultHeader: {soon}}, time.Time{})
		release := make(chan struct{})
		runs := &runObserver{done: make(chan consumer.Outcome, 1)}
		r := route("r", src, func(context.Context, *consumer.Message) error {
			<-release // ignores its ctx, and finishes after its deadline
			return nil
		})
		c, err := consumer.New(consumer.Options{ShutdownGrace: time.Second, Observer: runs}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(5 * time.Second)
		if err := stop(); !errors.Is(err, consumer.ErrStuckHandlers) {
			t.Fatalf("Run: %v", err)
		}
		close(release)
		<-runs.done
		s := c.Stats()[0]
		if s.Late != 0 || s.Goodput() != 0 || s.Settled[consumer.OutcomeAbandoned] != 1 || s.Settled[consumer.OutcomeSucceeded] != 0 {
			t.Fatalf("late %d goodput %d settled %v", s.Late, s.Goodput(), s.Settled)
		}
	})
}

// 12.8: a route whose Source closes stops; the other routes go on, and Run
// reports the closed one when it returns.
func TestClosedSourceStopsOnlyItsRoute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := sluicetest.NewSource(), sluicetest.NewSource()
		ok := func(context.Context, *consumer.Message) error { return nil }
		c, err := consumer.New(consumer.Options{}, route("a", a, ok), route("b", b, ok))
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		a.Close()
		synctest.Wait()
		b.Publish("after", []byte("v"), nil, time.Time{})
		synctest.Wait()
		if s := c.Stats()[1]; s.Settled[consumer.OutcomeSucceeded] != 1 {
			t.Fatalf("route b stopped with a: %v", s.Settled)
		}
		if err := stop(); !errors.Is(err, consumer.ErrClosed) || !strings.Contains(err.Error(), `"a"`) {
			t.Fatalf("Run: %v, want route a's ErrClosed", err)
		}
	})
}

// 12.10: "overloaded" hand-backs count as attempts: out of attempts the
// message is dead-lettered (class overloaded), not redelivered forever.
func TestOverloadedCountsTowardAttempts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.Publish("m", []byte("v"), nil, time.Time{})
		var calls atomic.Int64
		var sink sluicetest.Sink
		r := route("r", src, func(context.Context, *consumer.Message) error {
			calls.Add(1)
			return backpressure.Overloaded(errors.New("downstream full"))
		})
		r.Retry.MaxAttempts = 3
		r.DeadLetter.Sink = &sink
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(time.Minute)
		synctest.Wait()
		_ = stop()
		letters := sink.Letters()
		if calls.Load() != 3 || len(letters) != 1 || letters[0].Class != consumer.ClassOverloaded {
			t.Fatalf("%d handler calls, letters %v: want 3 and one letter of class overloaded", calls.Load(), letters)
		}
		rec := ledgerOf(t, src)["m"]
		if rec.Naks != 2 || rec.Terms != 1 || rec.NakDelays[1] > 2*time.Millisecond {
			t.Fatalf("ledger %+v", rec)
		}
	})
}

// 13.2: a message larger than the process Budget can ever give its route
// (but within the route's window) is dead-lettered as oversize instead of
// wedging the route; waits on the Budget show in the stats.
func TestMessageBeyondTheBudgetIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		budget, _ := backpressure.NewBudget(1 << 10)
		src := sluicetest.NewSource()
		src.PublishSized("big", []byte("v"), nil, time.Time{}, 4<<10)
		for i := range 5 {
			src.PublishSized(strconv.Itoa(i), []byte("v"), nil, time.Time{}, 100)
		}
		var sink sluicetest.Sink
		r := route("r", src, func(context.Context, *consumer.Message) error { return nil })
		r.Window = consumer.WindowPolicy{Messages: 8, Bytes: 64 << 10}
		r.DeadLetter.Sink = &sink
		c, err := consumer.New(consumer.Options{Budget: budget}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		synctest.Wait()
		_ = stop()
		s := c.Stats()[0]
		if s.Settled[consumer.OutcomeSucceeded] != 5 || s.Settled[consumer.OutcomeDeadLettered] != 1 ||
			len(sink.Letters()) != 1 || sink.Letters()[0].Class != dlq.ClassOversize {
			t.Fatalf("settled %v, letters %d", s.Settled, len(sink.Letters()))
		}
	})
}

// 13.4: out of attempts with the dead-letter store down, a message is
// handed back with backoff and its redeliveries are only written again,
// never run again.
func TestOutOfAttemptsIsNotRunAgainWhileTheSinkIsDown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.HonorDelay = true // naks come back after their delay, in fake time
		src.Publish("m", []byte("v"), nil, time.Time{})
		var runs atomic.Int64
		var sink sluicetest.Sink
		sink.FailWith(func(*dlq.Letter) error { return errDown })
		r := route("r", src, func(context.Context, *consumer.Message) error {
			runs.Add(1)
			return errors.New("boom")
		})
		r.Retry = consumer.RetryPolicy{MaxAttempts: 3, BaseDelay: 100 * time.Millisecond, MaxDelay: 100 * time.Millisecond}
		r.DeadLetter.Sink = &sink
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		for sink.Writes() < 10 {
			time.Sleep(time.Millisecond)
		}
		sink.FailWith(nil)
		time.Sleep(time.Second)
		synctest.Wait()
		_ = stop()
		if runs.Load() != 3 {
			t.Fatalf("handler ran %d times, want MaxAttempts = 3", runs.Load())
		}
		if s := c.Stats()[0]; s.Settled[consumer.OutcomeDeadLettered] != 1 || s.Settled[consumer.OutcomeDLQFailed] < 9 {
			t.Fatalf("settled %v", s.Settled)
		}
	})
}

// 13.7: a criticality header that names no class is counted, and the
// message keeps its route's class.
func TestJunkCriticalityIsCounted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.Publish("m", []byte("v"), consumer.Headers{consumer.CriticalityHeader: {"URGENT!!"}}, time.Time{})
		var got backpressure.Criticality
		r := route("r", src, func(ctx context.Context, m *consumer.Message) error {
			got = m.Criticality()
			return nil
		})
		r.Overload.Criticality = backpressure.Critical
		c, _ := consumer.New(consumer.Options{}, r)
		stop := start(t, c)
		synctest.Wait()
		_ = stop()
		if s := c.Stats()[0]; s.Errors.MalformedCriticality != 1 || got != backpressure.Critical {
			t.Fatalf("malformed %d, class %v", s.Errors.MalformedCriticality, got)
		}
	})
}

// 13.8: New refuses, with ErrInvalidOption, what would panic or exhaust
// memory later.
func TestNewRefusesHostileConfiguration(t *testing.T) {
	ok := func(context.Context, *consumer.Message) error { return nil }
	var nilSource *sluicetest.Source
	var nilSink *sluicetest.Sink
	shared := sluicetest.NewSource()
	cases := map[string][]consumer.Route{
		"typed nil Source": {{Name: "r", Source: nilSource, Handler: ok}},
		"typed nil Sink":   {{Name: "r", Source: sluicetest.NewSource(), Handler: ok, DeadLetter: consumer.DeadLetterPolicy{Sink: nilSink}}},
		"window 1<<26":     {{Name: "r", Source: sluicetest.NewSource(), Handler: ok, Window: consumer.WindowPolicy{Messages: 1 << 26}}},
		"window MaxInt":    {{Name: "r", Source: sluicetest.NewSource(), Handler: ok, Window: consumer.WindowPolicy{Messages: int(^uint(0) >> 1)}}},
		"workers 1<<40":    {{Name: "r", Source: sluicetest.NewSource(), Handler: ok, Workers: 1 << 40}},
		"one Source twice": {{Name: "a", Source: shared, Handler: ok}, {Name: "b", Source: shared, Handler: ok}},
	}
	for name, routes := range cases {
		if _, err := consumer.New(consumer.Options{}, routes...); !errors.Is(err, consumer.ErrInvalidOption) {
			t.Errorf("%s: %v, want ErrInvalidOption", name, err)
		}
	}
	// A Source serving a route of one Consumer cannot serve another's.
	other := sluicetest.NewSource()
	if _, err := consumer.New(consumer.Options{}, consumer.Route{Name: "x", Source: other, Handler: ok}); err != nil {
		t.Fatal(err)
	}
	if _, err := consumer.New(consumer.Options{}, consumer.Route{Name: "y", Source: other, Handler: ok}); !errors.Is(err, consumer.ErrInvalidOption) {
		t.Errorf("a Source attached to two Consumers' routes: %v", err)
	}
}

// 13.9: errors a route cannot return are logged with the route's name, at
// most once per LogInterval for the same text, and kept as the last error.
func TestErrorsAreLoggedAtABoundedRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.FailFetches(func(int) error { return errors.New("broker unreachable") })
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, nil))
		c, _ := consumer.New(consumer.Options{Logger: log, LogInterval: 10 * time.Second},
			route("orders", src, func(context.Context, *consumer.Message) error { return nil }))
		stop := start(t, c)
		time.Sleep(25 * time.Second)
		synctest.Wait()
		_ = stop()
		lines := strings.Count(buf.String(), "broker unreachable")
		s := c.Stats()[0]
		if lines != 3 || !strings.Contains(buf.String(), "route=orders") || s.Errors.Fetch < 20 ||
			!strings.Contains(s.Errors.Last, "broker unreachable") || s.Errors.LastAt.IsZero() {
			t.Fatalf("%d log lines for %d fetch errors in 25 s (want 3); last %q\n%s", lines, s.Errors.Fetch, s.Errors.Last, buf.String())
		}
	})
}

// Pipelined settlements: a message whose settlement awaits the broker's
// confirmation keeps its window slot and counts as held; its outcome is
// counted when the confirmation arrives.
func TestPendingSettlementHoldsItsSlotUntilConfirmed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.Confirm = sluicetest.ConfirmManual
		src.Publish("m", []byte("v"), nil, time.Time{})
		c, _ := consumer.New(consumer.Options{}, route("r", src, func(context.Context, *consumer.Message) error { return nil }))
		stop := start(t, c)
		synctest.Wait()
		s := c.Stats()[0]
		if s.Held != 1 || s.Window.InUse != 1 || s.Settled[consumer.OutcomeSucceeded] != 0 || src.Awaiting() != 1 {
			t.Fatalf("before the confirmation: held %d, in use %d, settled %v", s.Held, s.Window.InUse, s.Settled)
		}
		src.ConfirmPending(nil)
		synctest.Wait()
		s = c.Stats()[0]
		if s.Held != 0 || s.Window.InUse != 0 || s.Settled[consumer.OutcomeSucceeded] != 1 {
			t.Fatalf("after: held %d, in use %d, settled %v", s.Held, s.Window.InUse, s.Settled)
		}
		_ = stop()
	})
}

// A confirmation that never comes is given up at the shutdown deadline:
// the message is abandoned (the broker may redeliver it) and counted as a
// settlement error; Run still returns in time.
func TestUnconfirmedSettlementAbandonedAtShutdown(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.Confirm = sluicetest.ConfirmManual
		src.Publish("m", []byte("v"), nil, time.Time{})
		c, _ := consumer.New(consumer.Options{ShutdownGrace: time.Second},
			route("r", src, func(context.Context, *consumer.Message) error { return nil }))
		stop := start(t, c)
		synctest.Wait()
		begin := time.Now()
		_ = stop()
		if d := time.Since(begin); d > time.Second+consumer.ShutdownSlack {
			t.Fatalf("Run took %v", d)
		}
		s := c.Stats()[0]
		if s.Settled[consumer.OutcomeAbandoned] != 1 || s.Errors.Settle != 1 || s.Held != 0 {
			t.Fatalf("settled %v, settle errors %d", s.Settled, s.Errors.Settle)
		}
		// The late confirmation changes nothing.
		src.ConfirmPending(nil)
		if after := c.Stats()[0]; after.Settled != s.Settled {
			t.Fatalf("%v then %v", s.Settled, after.Settled)
		}
	})
}

// Confirmations arriving from other goroutines, even before Settle has
// returned, keep the ledger exact.
func TestAsyncConfirmationsKeepTheLedger(t *testing.T) {
	src := sluicetest.NewSource()
	src.Confirm = sluicetest.ConfirmAsync
	const n = 2000
	for i := range n {
		src.Publish(strconv.Itoa(i), []byte("v"), nil, time.Time{})
	}
	r := route("r", src, func(_ context.Context, m *consumer.Message) error {
		if m.Attempt == 1 && len(m.Key)%2 == 0 {
			return errors.New("retry me")
		}
		return nil
	})
	r.Workers, r.Window.Messages = 8, 32
	c, _ := consumer.New(consumer.Options{}, r)
	stop := start(t, c)
	eventually(t, "all settled", func() bool { return c.Stats()[0].Settled[consumer.OutcomeSucceeded] == n })
	_ = stop()
	s := c.Stats()[0]
	if s.Fetched != settledTotal(s) || s.Held != 0 || s.Window.InUse != 0 {
		t.Fatalf("fetched %d, settled %v, held %d", s.Fetched, s.Settled, s.Held)
	}
	checkLedger(t, src, n)
}

func ledgerOf(t *testing.T, src *sluicetest.Source) map[string]sluicetest.Record {
	t.Helper()
	l, errs := src.Ledger()
	if len(errs) > 0 {
		t.Fatalf("ledger violations: %v", errs)
	}
	return l
}
