package consumer

import (
	"errors"
	"time"
)

// The settlement state machine. Every message a route holds moves through
//
//	held ──claim──► claimed ──Settle──► done
//	                   │  └──ErrPending──► pending ──Confirm──► done
//	                   └── Confirm before Settle returned ──► confirmed ──► done
//
// and only complete, reached once per message, counts its outcome, removes
// it from the held set and returns its window capacity (releaseWindow: a
// message dropped without running, expired or shed, returns it earlier,
// when its settlement is sent; releaseWindow does it once). Whoever claims a
// message (a worker with its handler's result, the fetch loop expiring it,
// shutdown returning it) is the only party that settles it; a party that
// loses the claim does nothing. So "a message settles exactly once and its
// capacity comes back exactly once" is checkable here alone. A claimed
// message whose dead letter could not be written and must not be nak'd
// stays claimed while the route's letter retrier (letters.go) writes it;
// the retrier then performs its verdict (or abandons it at the grace).

type msgState int32

const (
	stateNew       msgState = iota // built by an adapter, not admitted yet
	stateHeld                      // admitted: counted in Fetched, in the held set
	stateClaimed                   // one party is settling it
	statePending                   // the Acker returned ErrPending: awaiting Confirm
	stateConfirmed                 // Confirm arrived before Settle returned
	stateDone                      // complete ran
)

// verdict is what the route decided for a message: the outcome it counts
// and what the broker is told. A zero op tells the broker nothing (the
// message is abandoned to its redelivery).
type verdict struct {
	outcome Outcome
	op      Settlement
}

func ack(o Outcome) verdict { return verdict{outcome: o, op: Settlement{Op: SettleAck}} }
func nak(o Outcome, d time.Duration) verdict {
	return verdict{outcome: o, op: Settlement{Op: SettleNak, Delay: d}}
}
func term(o Outcome, reason string) verdict {
	return verdict{outcome: o, op: Settlement{Op: SettleTerm, Reason: reason}}
}

var abandon = verdict{outcome: OutcomeAbandoned}

// claim makes the caller the one party that settles m, or reports false
// when another party has. A settlement that must do work first (a
// dead-letter write) claims m before that work.
func (r *route) claim(m *Message) bool {
	return m.state.CompareAndSwap(int32(stateHeld), int32(stateClaimed))
}

// settle claims m and performs v; it reports whether this call settled m.
func (r *route) settle(m *Message, v verdict) bool {
	if r.order != nil && r.order.holdBack(m, v) {
		return true // an ordered route retries in place (order.go)
	}
	if !r.claim(m) {
		return false
	}
	r.perform(m, v)
	return true
}

// perform carries out v for a claimed message: it tells the broker, and
// completes m when the broker's answer is in (now, or through Confirm).
func (r *route) perform(m *Message, v verdict) {
	m.verdict = v
	if r.order != nil {
		defer r.order.release(m) // the next message of its key may go
	}
	if v.op.Op == 0 {
		r.complete(m, nil)
		return
	}
	err := m.acker.Settle(r.settleCtx, v.op)
	if errors.Is(err, ErrPending) {
		if m.state.CompareAndSwap(int32(stateClaimed), int32(statePending)) {
			if v.outcome == OutcomeExpired || v.outcome == OutcomeShed {
				// A message dropped instead of run gives its window
				// capacity back as soon as its settlement is sent, so a
				// route draining a stale backlog is not paced by the
				// broker's confirmations; it stays held (and counted in
				// flight) until Confirm.
				r.releaseWindow(m)
			}
			return // Confirm completes it
		}
		// Confirm came first (stateConfirmed) and left its result.
		err = m.confirm
	}
	r.complete(m, err)
}

// Confirm reports the broker's answer to a settlement for which the
// message's Acker returned ErrPending: nil when the broker confirmed it, an
// error when it refused it or the confirmation was lost (the broker then
// redelivers the message). Adapters call it exactly once per pending
// settlement, from any goroutine; a call for a message that has no pending
// settlement does nothing.
func Confirm(m *Message, err error) {
	for {
		switch msgState(m.state.Load()) {
		case statePending:
			if m.state.CompareAndSwap(int32(statePending), int32(stateDone)) {
				m.route.complete(m, err)
				return
			}
		case stateClaimed:
			m.confirm = err
			if m.state.CompareAndSwap(int32(stateClaimed), int32(stateConfirmed)) {
				return // perform completes it when Settle returns
			}
		default:
			return
		}
	}
}

// complete ends m's life in the route, exactly once: the outcome is
// counted, m leaves the held set and its window capacity comes back.
func (r *route) complete(m *Message, settleErr error) {
	m.state.Store(int32(stateDone))
	o := m.verdict.outcome
	if r.hook != nil {
		r.hook.Event(m.hctx, m, Event{Kind: EventSettled, Outcome: o, Settlement: m.verdict.op, Err: settleErr})
	}
	if settleErr != nil {
		r.c.settleErrors.Add(1)
		r.noteError("settle ("+m.verdict.op.Op.String()+")", settleErr)
	}
	if o == OutcomeSucceeded && m.late {
		r.c.late.Add(1)
	}
	r.releaseWindow(m)
	r.c.settled[o].Add(1)
	if o == OutcomeAbandoned && m.verdict.op.Op == 0 && r.lastDelivery(m) {
		// The broker will not deliver it again. Counted after its outcome
		// (and read before it): LastAbandoned <= Settled[OutcomeAbandoned].
		r.c.lastAbandoned.Add(1)
	}
	// Last: while m is held in stateDone its completion is under way, and
	// Run waits for it (pendingConfirmations), so the ledger is whole when
	// Run returns.
	r.held.remove(m)
}

// releaseWindow returns m's window capacity, once: whoever swaps charged
// from a charge to -1 releases it.
func (r *route) releaseWindow(m *Message) {
	if b := m.charged.Swap(-1); b >= 0 {
		r.window.Release(int(max(m.units, 1)), b)
	}
}

// abandonUnconfirmed completes every message of r still awaiting a
// confirmation, as abandoned: the broker did not confirm in time, so it may
// redeliver. Run calls it when the shutdown deadline has passed.
func (r *route) abandonUnconfirmed() int {
	n := 0
	for _, m := range r.held.snapshot() {
		if m.state.CompareAndSwap(int32(statePending), int32(stateDone)) {
			m.verdict.outcome = OutcomeAbandoned
			r.complete(m, ErrUnconfirmed)
			n++
		}
	}
	return n
}

// pendingConfirmations counts r's messages awaiting a confirmation, or
// being completed by one.
func (r *route) pendingConfirmations() int {
	n := 0
	for _, m := range r.held.snapshot() {
		if s := msgState(m.state.Load()); s == statePending || s == stateDone {
			n++
		}
	}
	return n
}
