package consumer

import (
	"context"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/sluice-go/sluice/dlq"
)

// Kept letters. A dead-letter write that fails is answered with a Nak
// (OutcomeDLQFailed) when the broker will redeliver the message in a useful
// order. Two kinds of message cannot be nak'd: one on the broker's last
// delivery (the broker would drop it) and one of an ordered route (its
// redelivery would come after its key's later messages). Such a message is
// kept: it stays claimed, held (so kept alive) and charged to the window,
// and its letter goes to the route's letter retrier, one goroutine Run
// owns. Whoever decided the letter (a worker, the reaper, the fetch loop,
// shutdown) hands it over and goes on at once: no worker, no fetch loop and
// no shutdown step waits for a store that is down.
//
// The retrier writes kept letters one at a time, oldest first. While the
// store refuses, it probes it with the oldest letter only, after a jittered
// exponential backoff (retryFloor to retryCeiling); the first write that
// succeeds resets the backoff and the others follow at once. A letter
// written terminates its original (the outcome decided for it); when the
// shutdown grace ends (the handlers' ctx), the messages still kept are
// abandoned to the broker (OutcomeAbandoned).
type letterRetrier struct {
	mu      sync.Mutex
	pending []*keptLetter // oldest first
	wake    chan struct{}
	// closed: Run has stopped everything that hands letters over; the
	// retrier returns once pending is empty. stopped: the retrier has
	// returned; a letter handed over now is abandoned at once.
	closed  bool
	stopped bool
}

// keptLetter is a letter whose write failed, with what its original
// settles as once it is written.
type keptLetter struct {
	m       *Message
	l       *dlq.Letter
	reason  string
	success Outcome
}

const (
	retryFloor   = 100 * time.Millisecond
	retryCeiling = 5 * time.Second
)

func (lr *letterRetrier) init() { lr.wake = make(chan struct{}, 1) }

// keep hands a claimed message whose letter could not be written to the
// route's letter retrier.
func (r *route) keep(m *Message, l *dlq.Letter, reason string, success Outcome) {
	lr := &r.letters
	lr.mu.Lock()
	if lr.stopped {
		lr.mu.Unlock()
		r.perform(m, abandon) // the grace is over: left to the broker
		return
	}
	lr.pending = append(lr.pending, &keptLetter{m: m, l: l, reason: reason, success: success})
	lr.mu.Unlock()
	select {
	case lr.wake <- struct{}{}:
	default:
	}
}

// next waits until a letter is kept and returns the oldest, taken out of
// pending (the caller puts it back with putBack if its write fails). It
// returns nil when the retrier should stop: ctx ended, or closed and
// nothing kept.
func (lr *letterRetrier) next(ctx context.Context) *keptLetter {
	for {
		lr.mu.Lock()
		if len(lr.pending) > 0 {
			k := lr.pending[0]
			lr.pending[0] = nil
			lr.pending = lr.pending[1:]
			lr.mu.Unlock()
			return k
		}
		closed := lr.closed
		lr.mu.Unlock()
		if closed || ctx.Err() != nil {
			return nil
		}
		select {
		case <-lr.wake:
		case <-ctx.Done():
			return nil
		}
	}
}

func (lr *letterRetrier) putBack(k *keptLetter) {
	lr.mu.Lock()
	lr.pending = append([]*keptLetter{k}, lr.pending...)
	lr.mu.Unlock()
}

// close tells the retrier nothing more will be handed over: it returns
// once it has written what it keeps (or the grace ends).
func (lr *letterRetrier) close() {
	lr.mu.Lock()
	lr.closed = true
	lr.mu.Unlock()
	select {
	case lr.wake <- struct{}{}:
	default:
	}
}

// retryLetters is the route's letter retrier: it runs until ctx (the
// handlers' ctx, which ends with the shutdown grace) ends or, once closed,
// until nothing is kept; then it abandons what it still keeps.
func (r *route) retryLetters(ctx context.Context) {
	lr := &r.letters
	defer r.abandonKept()
	delay := retryFloor
	failed := true // every letter handed over has just failed a write
	for {
		k := lr.next(ctx)
		if k == nil {
			return
		}
		if failed && !pause(ctx, delay/2+rand.N(delay/2+1)) {
			lr.putBack(k)
			return
		}
		err := r.cfg.DeadLetter.Sink.Write(r.settleCtx, k.l)
		if err != nil {
			r.c.dlqErrors.Add(1)
			r.noteError("dead-letter write (kept, retrying)", err)
			lr.putBack(k)
			failed, delay = true, min(2*delay, retryCeiling)
			continue
		}
		r.forget(k.m)
		r.perform(k.m, term(k.success, k.reason))
		failed, delay = false, retryFloor
	}
}

// abandonKept stops the retrier: what it still keeps, and whatever is
// handed over from now on, is abandoned to the broker.
func (r *route) abandonKept() {
	lr := &r.letters
	lr.mu.Lock()
	lr.stopped = true
	ks := lr.pending
	lr.pending = nil
	lr.mu.Unlock()
	for _, k := range ks {
		r.perform(k.m, abandon)
	}
}
