package consumer

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluice-go/sluice/backpressure"
)

// Dead-letter classes of the overload policies, written in
// dlq.HeaderClass next to dlq's own classes.
const (
	// ClassRetryBudget: a retryable failure the route's RetryBudget had no
	// room to retry. Replay it at a safe pace once the downstream is well.
	ClassRetryBudget = "retry-budget"
	// ClassOverloaded: the handler said "overloaded, do not retry" and the
	// route's DeadLetter.OnOverloaded is OverloadedDeadLetter, the message
	// was out of attempts, or it was the broker's last delivery
	// (SourceInfo.MaxDeliver).
	ClassOverloaded = "overloaded"
	// ClassShed: shed by a queue policy on the broker's last delivery
	// (SourceInfo.MaxDeliver), where a Nak would have lost it.
	ClassShed = "shed"
	// ClassShutdown: on the broker's last delivery (SourceInfo.MaxDeliver)
	// when the route stopped, and not run within the shutdown grace: a
	// Nak would have lost it. Replay it once the consumer runs again.
	ClassShutdown = "shutdown"
)

// errShutdown is the cause written in a ClassShutdown letter.
var errShutdown = errors.New("sluice: the consumer stopped before this last delivery could run")

// OverloadedAction says how a message whose handler returned an error
// marked "overloaded, do not retry" is settled. It is never retried in
// process either way.
type OverloadedAction int8

const (
	// OverloadedNak naks it with the retry backoff, so the broker keeps it
	// and redelivers it later. The default. Each hand-back counts as an
	// attempt: out of Retry.MaxAttempts it is dead-lettered (class
	// "overloaded") like any other failure.
	OverloadedNak OverloadedAction = iota
	// OverloadedDeadLetter writes it to the dead-letter sink (class
	// "overloaded") for a paced replay, so no layer retries it: nested
	// "do not retry" layers then cost the bottom one attempt set per
	// message, not one per broker redelivery. Without a sink it behaves as
	// OverloadedNak.
	OverloadedDeadLetter
)

// QueueOrder is the order in which a route's workers take fetched messages
// that have not started yet.
type QueueOrder int8

const (
	// QueueFIFO runs the oldest fetched message first. The default.
	QueueFIFO QueueOrder = iota
	// QueueLIFO runs the newest first: under a backlog most messages are
	// handled fast (seed 002: median 28 ms against 350 ms for FIFO) while a
	// few wait long; pair it with DropOldest.
	QueueLIFO
	// QueueCheapestFirst runs the queued message of the lowest cost
	// (Window.Cost units) first, the oldest among equals: cheap messages
	// do not wait behind dear ones that arrived before them. Without
	// Window.Cost every message costs one unit and it is FIFO.
	QueueCheapestFirst
)

// DropPolicy chooses which queued message is shed when a route's queue of
// fetched-but-not-started messages would exceed Overload.Queue.MaxLength.
type DropPolicy int8

const (
	// DropNewest sheds the message that just arrived (tail drop). The default.
	DropNewest DropPolicy = iota
	// DropOldest sheds the message that has waited longest (head drop): it
	// is the nearest to its deadline.
	DropOldest
	// DropRandom sheds a uniformly chosen queued message.
	DropRandom
	// DropLowestCriticality sheds the oldest message of the lowest class
	// present, so CRITICAL work queued with SHEDDABLE work is kept (seed 002:
	// 100% of high priority succeeded against 24% of low).
	DropLowestCriticality
)

// ShedAction says how a shed message is settled.
type ShedAction int8

const (
	// ShedNak naks it with Overload.ShedDelay so the broker keeps it. The
	// default: nothing is lost, the backlog waits in the broker.
	ShedNak ShedAction = iota
	// ShedAck acks it: a counted drop, for routes whose work may be lost
	// (metrics samples, caches).
	ShedAck
)

// ShedReason says why a message was shed.
type ShedReason int8

const (
	// ShedQueueFull: the route's queue was over Overload.Queue.MaxLength.
	ShedQueueFull ShedReason = iota
	// ShedNearDeadline: when a worker picked it, less than
	// Overload.ShedNearDeadline was left before its deadline.
	ShedNearDeadline
	numShedReasons
)

var shedReasonNames = [...]string{"queue_full", "near_deadline"}

// String returns the reason's metric label, for example "queue_full".
func (r ShedReason) String() string {
	if r < 0 || r >= numShedReasons {
		return "unknown"
	}
	return shedReasonNames[r]
}

// ShedReasons lists every ShedReason, in order.
func ShedReasons() []ShedReason {
	out := make([]ShedReason, numShedReasons)
	for i := range out {
		out[i] = ShedReason(i)
	}
	return out
}

// PropagateCriticality sets CriticalityHeader on h from the class ctx
// carries, so a message a handler publishes inherits the class of the
// message it is handling (the consumer puts it on every handler ctx). It
// reports whether ctx carried a class.
func PropagateCriticality(ctx context.Context, h Headers) bool {
	v, ok := backpressure.HeaderValue(ctx)
	if ok {
		h.Set(CriticalityHeader, v)
	}
	return ok
}

// shed settles a held message by the route's ShedAction.
func (r *route) shed(m *Message, reason ShedReason) {
	r.c.shed[reason][m.crit&3].Add(1)
	r.event(m, Event{Kind: EventShed, Shed: reason})
	if r.cfg.Overload.OnShed == ShedAck {
		r.forget(m)
		r.settle(m, ack(OutcomeShed))
		return
	}
	if r.lastDelivery(m) {
		// A Nak would be the broker's cue to drop it for good.
		r.toSink(m, ClassShed, fmt.Errorf("%w: shed (%s) on the broker's last delivery", backpressure.ErrOverloaded, reason), r.clock.Now(), OutcomeDeadLettered)
		return
	}
	r.settle(m, nak(OutcomeShed, r.cfg.Overload.ShedDelay))
}
