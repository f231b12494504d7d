package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
)

// work is worker w: it takes queued messages until the queue is closed and
// empty.
func (r *route) work(w int) {
	if r.batch != nil {
		r.workBatches() // batch.go
		return
	}
	bounded := r.queue.maxRunning > 0
	for {
		var m *Message
		var ok bool
		if bounded {
			m, ok = r.queue.popFit()
		} else {
			m, ok = r.queue.pop()
		}
		if !ok {
			return
		}
		if bounded {
			r.processDone(m, w)
			continue
		}
		if revoked(m) || r.stopping.Load() && !r.runsAtShutdown(m) {
			r.giveBack(m)
		} else {
			r.process(m, w)
		}
		r.queue.finished()
		if r.queue.runCap.Load() > 0 {
			// A resource cap is in force: the handlers are likely CPU-bound
			// and the cores busy. Let the goroutines waiting for a core (the
			// broker client, the fetch loop) run before the next message,
			// instead of until the runtime preempts this one (10 ms): in the
			// overload lab (two 5 ms busy loops on 2 cores) the scheduler's
			// p99 was 20-24 ms without this, and the default 10 ms
			// scheduler-latency target held the process at 57-62% of the
			// cores for an 80% CPU target; with it 72-74%.
			runtime.Gosched()
		}
	}
}

// processDone is process for a route whose running cost is bounded: the
// message's units are given back to the queue when it is done.
func (r *route) processDone(m *Message, w int) {
	defer r.queue.done(m.units)
	if r.stopping.Load() && !r.runsAtShutdown(m) {
		r.giveBack(m)
		return
	}
	r.process(m, w)
}

// process runs one message through its last checks and the handler on
// worker w, and settles it from the result.
func (r *route) process(m *Message, w int) {
	if msgState(m.state.Load()) != stateHeld {
		// Another party claimed it (settled, or settling it) after it was
		// queued: it is theirs, and never run.
		return
	}
	if f, ok := r.awaitingLetter(m); ok {
		// Out of attempts before, and its dead-letter write failed: it is
		// not run again, only written again.
		r.toSink(m, f.class, errors.New(f.cause), r.clock.Now(), OutcomeDeadLettered)
		return
	}
	ctx := r.classCtx[m.crit&3]
	if m.hctx != nil {
		ctx = m.hctx // the Hook's, derived from it
	}
	if !m.deadline.IsZero() {
		now := r.clock.Now()
		if expiry.Expired(m.deadline, now) {
			r.expire(m, now)
			return
		}
		if d := r.cfg.Overload.ShedNearDeadline; d > 0 && r.cfg.Overload.Slots == nil && m.deadline.Sub(now) < d {
			r.shed(m, ShedNearDeadline)
			return
		}
		if r.pred != nil && r.cfg.Overload.Slots == nil && r.pred.tooLate(now, m.deadline, int(m.units)) {
			r.expireEarly(m, now)
			return
		}
		if m.freshAt != 0 {
			r.fresh.started(m.freshAt, now)
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, m.deadline)
		defer cancel()
	}
	if s := r.cfg.Overload.Slots; s != nil {
		if !r.takeSlot(ctx, m) {
			return
		}
		defer s.Release()
	}
	learn := r.pred != nil && !m.deadline.IsZero()
	learnCost := r.cfg.Window.Cost.Class != nil
	if !r.timed && !learn && !learnCost {
		// Nobody reads the handler's latency: skip the two clock reads.
		if r.pred != nil {
			r.pred.busy[w].Store(busyUntimed)
			defer r.pred.busy[w].Store(0)
		}
		r.finish(ctx, m, r.call(ctx, m))
		return
	}
	start := time.Now()
	if b := r.cfg.Overload.RetryBudget; b != nil && m.Attempt <= 1 {
		b.AttemptAt(start)
	}
	if r.pred != nil {
		r.pred.busyUnits[w].Store(m.units)
		r.pred.busy[w].Store(start.UnixNano())
	}
	if r.hook != nil {
		r.hook.Event(m.hctx, m, Event{Kind: EventStart, Elapsed: start.Sub(m.fetchedAt)})
	}
	err := r.call(ctx, m)
	latency := time.Since(start)
	if r.hook != nil && msgState(m.state.Load()) == stateHeld {
		r.hook.Event(m.hctx, m, Event{Kind: EventEnd, Err: err, Elapsed: latency})
	}
	if r.pred != nil {
		r.pred.busy[w].Store(0)
		if learn {
			// Per unit: on a route with Window.Cost, what one unit takes.
			r.pred.lat.observe(start.Add(latency), latency/time.Duration(max(m.units, 1)))
		}
	}
	if learnCost {
		r.costs.observe(m.costClass, latency)
	}
	if r.cfg.Overload.Throttle != nil || r.cfg.Overload.AdaptiveLimit != nil {
		r.feedback(start.Add(latency), latency, err)
	}
	outcome := r.finish(ctx, m, err)
	if r.obs != nil {
		r.obs.HandlerDone(outcome, latency)
	}
}

// takeSlot waits for a shared handler slot at m's class. When the wait ends
// without one, m is settled (expired past its deadline, returned on
// shutdown) and takeSlot reports false. A message picked with less than
// ShedNearDeadline left after the wait is shed.
func (r *route) takeSlot(ctx context.Context, m *Message) bool {
	slots := r.cfg.Overload.Slots
	if err := slots.Acquire(ctx, m.crit); err != nil {
		now := r.clock.Now()
		if !m.deadline.IsZero() && !now.Before(m.deadline) || errors.Is(err, context.DeadlineExceeded) {
			r.expire(m, now)
		} else {
			r.giveBack(m)
		}
		return false
	}
	if r.stopping.Load() {
		// The slot came free after shutdown began: m never started, so it
		// is returned like any queued message instead of run.
		slots.Release()
		r.giveBack(m)
		return false
	}
	if !m.deadline.IsZero() {
		now := r.clock.Now()
		if d := r.cfg.Overload.ShedNearDeadline; d > 0 && m.deadline.Sub(now) < d {
			slots.Release()
			r.shed(m, ShedNearDeadline)
			return false
		}
		if r.pred != nil && r.pred.tooLate(now, m.deadline, int(m.units)) {
			slots.Release()
			r.expireEarly(m, now)
			return false
		}
	}
	return true
}

// feedback tells the route's Throttle and AdaptiveLimit how a handler run
// went.
func (r *route) feedback(now time.Time, latency time.Duration, err error) {
	over := err != nil && backpressure.IsOverloaded(err)
	if t := r.cfg.Overload.Throttle; t != nil && !over {
		t.RecordAt(now, true)
	}
	if a := r.cfg.Overload.AdaptiveLimit; a != nil {
		res := backpressure.ResultOK
		switch {
		case over:
			res = backpressure.ResultOverloaded
		case err != nil:
			res = backpressure.ResultFailed
		}
		if l := int64(a.ObserveAt(now, latency, res)); l != r.limit.Load() {
			// Workers observe concurrently: apply the limit in force now,
			// under a lock, so a worker holding an older value cannot put
			// the window back above (or below) what the limit says.
			r.limitMu.Lock()
			l = int64(a.Limit())
			r.limit.Store(l)
			r.setLimitLocked(int(l))
			r.limitMu.Unlock()
		}
	}
}

func (r *route) call(ctx context.Context, m *Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.c.panics.Add(1)
			err = fmt.Errorf("%w: %v\n%s", ErrPanic, p, debug.Stack())
		}
	}()
	return r.cfg.Handler(ctx, m)
}

// finish decides m's outcome from the handler's result, settles it, and
// returns the outcome.
func (r *route) finish(ctx context.Context, m *Message, err error) Outcome {
	now := r.clock.Now()
	if err != nil && r.stopping.Load() && r.handlerCtx.Err() != nil && errors.Is(err, context.Canceled) {
		// The shutdown cancelled the handler: the message did not fail,
		// it is handed back (and the attempt not counted against it).
		r.giveBack(m)
		return OutcomeReturned
	}
	if err == nil {
		m.late = !m.deadline.IsZero() && now.After(m.deadline)
		r.forget(m)
		r.settle(m, ack(OutcomeSucceeded))
		return OutcomeSucceeded
	}
	r.c.handlerErrors.Add(1)
	outOfAttempts := m.Attempt >= r.retry.MaxAttempts || r.lastDelivery(m)
	switch {
	case !m.deadline.IsZero() && ctx.Err() != nil && now.After(m.deadline):
		// The work ran out of time; another attempt would be late too.
		r.expire(m, now)
		return OutcomeExpired
	case backpressure.IsOverloaded(err):
		sink := r.cfg.DeadLetter.Sink != nil
		if outOfAttempts || r.cfg.DeadLetter.OnOverloaded == OverloadedDeadLetter && sink {
			return r.toSink(m, ClassOverloaded, err, now, OutcomeDeadLettered)
		}
		r.rememberFailure(m, now)
		r.settle(m, nak(OutcomeOverloaded, r.retry.Backoff(m.Attempt)))
		return OutcomeOverloaded
	case IsPermanent(err):
		return r.toSink(m, dlq.ClassPermanent, err, now, OutcomeDeadLettered)
	case outOfAttempts:
		class := dlq.ClassExhausted
		if errors.Is(err, ErrPanic) {
			class = dlq.ClassPanic
		}
		return r.toSink(m, class, err, now, OutcomeDeadLettered)
	case r.cfg.Overload.RetryBudget != nil && !r.cfg.Overload.RetryBudget.Retry():
		r.c.budgetOut.Add(1)
		if r.cfg.DeadLetter.Sink != nil {
			return r.toSink(m, ClassRetryBudget, err, now, OutcomeDeadLettered)
		}
		r.rememberFailure(m, now)
		r.settle(m, nak(OutcomeRetried, r.retry.MaxDelay))
		return OutcomeRetried
	default:
		r.rememberFailure(m, now)
		r.settle(m, nak(OutcomeRetried, r.retry.Backoff(m.Attempt)))
		return OutcomeRetried
	}
}

// expireEarly settles, as expired, a message predicted to finish after its
// deadline.
func (r *route) expireEarly(m *Message, now time.Time) {
	r.c.expiredEarly.Add(1)
	r.expire(m, now)
}

// expireStale settles, as expired, a message a standing queue could not
// run fresh (fresh.go).
func (r *route) expireStale(m *Message, now time.Time) {
	r.c.stale.Add(1)
	r.expire(m, now)
}

// expireQueued settles a queued message the reaper found past its start-by
// time: stale when that was the standing queue's bound, else early.
func (r *route) expireQueued(m *Message, now time.Time) {
	if m.stale {
		r.expireStale(m, now)
		return
	}
	r.expireEarly(m, now)
}

// expire settles a message whose deadline passed, by DeadLetter.OnExpired.
func (r *route) expire(m *Message, now time.Time) {
	switch r.cfg.DeadLetter.OnExpired {
	case ExpiredTerm:
		r.forget(m)
		r.settle(m, term(OutcomeExpired, ErrExpired.Error()))
	case ExpiredDeadLetter:
		r.toSink(m, dlq.ClassExpired, ErrExpired, now, OutcomeExpired)
	default:
		r.forget(m)
		r.settle(m, ack(OutcomeExpired))
	}
}

// toSink writes m to the dead-letter sink and terminates the original only
// once the sink confirmed the write, counting success (OutcomeDeadLettered,
// or OutcomeExpired for expired messages). Without a sink m is terminated
// (OutcomeTerminated; expired messages stay OutcomeExpired).
//
// A failed write never loses m. With deliveries left, m is nak'd with
// backoff (OutcomeDLQFailed) and remembered, so its redelivery is written
// again without running the handler. On the broker's last delivery a Nak
// would drop it, and on an ordered route the redelivery would come after
// its key's later messages: m is kept and its letter handed to the route's
// letter retrier (letters.go); toSink then returns OutcomeDLQFailed, the
// outcome m has so far.
func (r *route) toSink(m *Message, class string, cause error, now time.Time, success Outcome) Outcome {
	reason := class + ": " + firstLine(cause.Error())
	sink := r.cfg.DeadLetter.Sink
	if sink == nil {
		r.event(m, Event{Kind: EventLetter, Class: class, Err: cause})
		o := OutcomeTerminated
		if success == OutcomeExpired {
			o = OutcomeExpired
		}
		r.forget(m)
		r.settle(m, term(o, reason))
		return o
	}
	if !r.claim(m) {
		return OutcomeAbandoned // settled by another party (shutdown)
	}
	l := r.letter(m, class, cause, now)
	r.event(m, Event{Kind: EventLetter, Class: class, Err: cause, Letter: l})
	err := sink.Write(r.settleCtx, l)
	if err != nil && (r.lastDelivery(m) || r.order != nil) {
		// On the broker's last delivery a Nak would lose m; on an ordered
		// route its redelivery would come after its key's later messages.
		// It is kept, and its letter retried off this goroutine.
		r.c.dlqErrors.Add(1)
		r.noteError("dead-letter write (kept, retrying)", err)
		r.keep(m, l, reason, success)
		return OutcomeDLQFailed
	}
	if err != nil {
		r.c.dlqErrors.Add(1)
		r.noteError("dead-letter write", err)
		r.awaitLetter(m, class, cause, now)
		r.perform(m, nak(OutcomeDLQFailed, r.retry.Backoff(m.Attempt)))
		return OutcomeDLQFailed
	}
	r.forget(m)
	r.perform(m, term(success, reason))
	return success
}

func (r *route) letter(m *Message, class string, cause error, now time.Time) *dlq.Letter {
	first := m.FirstFailure
	if first.IsZero() {
		f, _ := r.failures.get(m)
		first = f.first
	}
	if first.IsZero() {
		first = now
	}
	o := m.Origin
	if o.Topic == "" {
		o.Topic = m.Topic
	}
	return &dlq.Letter{Key: m.Key, Value: m.Value, Headers: m.Headers, Route: r.cfg.Name,
		Err: cause.Error(), Class: class, Attempts: m.Attempt, FirstFailure: first, LastFailure: now, Origin: o}
}

func firstLine(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			return s[:i]
		}
	}
	return s
}
