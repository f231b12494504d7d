package consumer

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
)

// Clock reads the time for deadline decisions. Tests inject one; nil means
// the system clock.
type Clock interface{ Now() time.Time }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// ExpiredAction says how a message whose deadline passed is settled. It is
// never handed to the handler either way.
type ExpiredAction int8

const (
	// ExpiredAck acks it: nobody waits for the result any more. The default.
	ExpiredAck ExpiredAction = iota
	// ExpiredTerm terminates it with the reason "expired", which JetStream
	// reports in an advisory.
	ExpiredTerm
	// ExpiredDeadLetter writes it to the route's dead-letter sink, class
	// "expired", then settles it; without a sink it behaves as ExpiredTerm.
	ExpiredDeadLetter
)

// OversizeAction says what happens to a message larger than the route's
// whole byte window.
type OversizeAction int8

const (
	// OversizeAdmitAlone waits until the window is otherwise empty and runs
	// the message alone. The default: slow, never a deadlock, nothing lost.
	OversizeAdmitAlone OversizeAction = iota
	// OversizeDeadLetter writes it to the dead-letter sink (class
	// "oversize") without running it; without a sink it is terminated.
	OversizeDeadLetter
)

// RetryPolicy governs retryable errors. The zero value is 3 attempts with a
// 100 ms base and 30 s cap.
type RetryPolicy struct {
	// MaxAttempts is the most deliveries a message gets, counting broker
	// redeliveries: 1 means never retry. 0 means 3. Valid: 0 to 1000.
	MaxAttempts int
	// BaseDelay is the backoff before the second attempt; each further
	// attempt doubles it, and the delay actually used is drawn uniformly
	// from [0, that] ("full jitter"). 0 means 100 ms. Negative is invalid.
	BaseDelay time.Duration
	// MaxDelay caps the doubled delay. 0 means 30 s. Negative is invalid.
	MaxDelay time.Duration
}

// Backoff returns the delay before the delivery after attempt (1-based),
// with full jitter.
func (p RetryPolicy) Backoff(attempt int) time.Duration {
	d := p.ceiling(attempt)
	if d <= 0 {
		return 0
	}
	return rand.N(d + 1)
}

func (p RetryPolicy) ceiling(attempt int) time.Duration {
	if attempt < 1 {
		attempt = 1
	}
	d := p.BaseDelay
	for i := 1; i < attempt && d < p.MaxDelay; i++ {
		d *= 2
	}
	return min(d, p.MaxDelay)
}

func (p RetryPolicy) withDefaults() RetryPolicy {
	if p.MaxAttempts == 0 {
		p.MaxAttempts = 3
	}
	if p.BaseDelay == 0 {
		p.BaseDelay = 100 * time.Millisecond
	}
	if p.MaxDelay == 0 {
		p.MaxDelay = 30 * time.Second
	}
	return p
}

// Route connects one Source to one Handler with its own window, workers and
// policies. One route never takes another's workers or window: that is the
// bulkhead that keeps slow report-style work from starving critical topics.
type Route struct {
	// Name identifies the route in metrics and dead letters. Required,
	// unique within a Consumer.
	Name    string
	Source  Source  // required
	Handler Handler // required

	// Workers is the fixed number of goroutines running Handler. Required, > 0.
	Workers int
	// MaxInFlight bounds messages held by the route, queued and running
	// together. Required, > 0; at least Workers is sensible.
	MaxInFlight int
	// MaxInFlightBytes bounds the bytes of those messages. Required, > 0.
	MaxInFlightBytes int64
	// MaxBatch caps one fetch. 0 means MaxInFlight.
	MaxBatch int
	// MinFetch is the low-water mark of the pull: the route fetches again
	// only once at least this many message slots are free, so a broker
	// round trip carries a batch rather than one message. 0 means a quarter
	// of MaxBatch (at least 1); 1 fetches as soon as any slot frees.
	MinFetch int

	Retry  RetryPolicy
	Expiry expiry.Policy
	// OnExpired settles expired messages; default ExpiredAck.
	OnExpired ExpiredAction
	// OnOversize handles messages bigger than MaxInFlightBytes; default
	// OversizeAdmitAlone.
	OnOversize OversizeAction

	// Criticality is the route's class and the ceiling for any class a
	// producer's header asks for. The zero value is Sheddable.
	Criticality backpressure.Criticality
	// ReservedBytes is the part of Options.Budget kept for this route
	// alone. Ignored without a Budget.
	ReservedBytes int64

	// DeadLetter receives permanent failures and messages out of attempts.
	// nil means they are terminated with the reason and counted Terminated.
	DeadLetter dlq.Sink
	// Group names the consumer group or durable in dead letters.
	Group string

	// KeepAlive is how often in-flight messages get InProgress. 0 means a
	// third of the Source's AckWait if it reports one (AckWaiter), else
	// none. Negative disables it.
	KeepAlive time.Duration

	// Overload control. Every field's zero value keeps the behaviour of a
	// route without it, at no cost on the message path.

	// RetryBudget, if set, must have room for every in-process retry (a
	// retryable failure nak'd for redelivery with attempts left); the
	// route records each first delivery (Attempt 1) as a first attempt.
	// A failure the budget refuses is not retried: it is dead-lettered with
	// class ClassRetryBudget (replay it later at a safe pace) or, without a
	// DeadLetter sink, nak'd with Retry.MaxDelay; either way it counts in
	// RouteStats.RetryBudgetExhausted. Routes may share one budget. nil
	// means attempts are capped by Retry.MaxAttempts only.
	RetryBudget *backpressure.RetryBudget
	// OnOverloaded settles messages whose handler returned an error marked
	// "overloaded, do not retry"; default OverloadedNak.
	OnOverloaded OverloadedAction

	// Throttle, if set, is client-side adaptive throttling of the route's
	// pull. Each free window slot the fetch loop would fill counts as a
	// request; the throttle lets through a share of them (the rest are
	// "rejected locally", counted, and left in the broker), and each
	// handler result that is not marked overloaded counts as accepted. So
	// when the handler's downstream refuses work (the handler returns
	// Overloaded(err), or ErrThrottled from its own Throttle), the route
	// fetches about K times what the downstream accepts and the backlog
	// waits in the broker; when the downstream recovers the pull ramps back
	// as the window forgets. Do not also call Do/Allow on the same Throttle
	// from the handler. nil means no throttling.
	Throttle *backpressure.Throttle
	// ThrottleWait is how long the fetch loop pauses after the Throttle
	// rejected some of the slots it offered. 0 means 20 ms.
	ThrottleWait time.Duration

	// AdaptiveLimit, if set, drives the route window's message limit from
	// handler latency and results (AIMD between its bounds; New lowers its
	// Max to MaxInFlight with CapMax when it is larger), so the route finds
	// the concurrency its downstream sustains. Each route needs its own
	// AdaptiveLimit: New refuses one shared by two routes. nil means the
	// window stays at MaxInFlight.
	AdaptiveLimit *backpressure.AdaptiveLimit
	// Slots, if set, is a pool of handler slots shared with other routes
	// that use the same scarce capacity (one downstream): a worker takes a
	// slot at the message's criticality before running the handler and
	// gives it back after, so under contention the lowest class waits
	// (and its messages expire or queue-shed) while critical routes keep
	// their throughput. A message whose deadline passes while it waits is
	// expired. nil means workers run unhindered.
	Slots *backpressure.Slots

	// QueueOrder is the order workers take fetched messages; default
	// QueueFIFO.
	QueueOrder QueueOrder
	// ShedQueueLength sheds a message (chosen by Drop, settled by OnShed,
	// counted as OutcomeShed with reason ShedQueueFull) whenever more than
	// this many fetched messages wait for a worker. It only matters below
	// MaxInFlight − Workers: the window already bounds the queue. 0 means
	// never shed (the window alone pushes back on the broker).
	ShedQueueLength int
	// Drop chooses the message shed by ShedQueueLength; default DropNewest.
	Drop DropPolicy
	// ShedNearDeadline sheds (reason ShedNearDeadline) a message that has
	// less than this left before its deadline when it is fetched or when a
	// worker picks it: it would most likely finish late, so it should not
	// take a window slot or a worker. Set it to about the handler's p99:
	// under a sustained backlog, an expiry check alone lets workers start
	// messages with almost no time left, which then finish late. 0 means
	// off; messages without a deadline are never shed this way.
	ShedNearDeadline time.Duration
	// OnShed settles shed messages; default ShedNak.
	OnShed ShedAction
	// ShedDelay is the Nak delay of a shed message. 0 means 1 s.
	ShedDelay time.Duration
}

// Options configure a Consumer. The zero value is usable.
type Options struct {
	// Clock reads time for deadline decisions. nil means the system clock.
	Clock Clock
	// Observer receives per-route stats and handler timings (see package
	// metrics for Prometheus). nil means none.
	Observer Observer
	// ShutdownGrace is how long running handlers get to finish after Run's
	// ctx is done, before their contexts are cancelled. 0 means 10 s.
	// Negative is invalid.
	ShutdownGrace time.Duration
	// Budget is an optional process-wide byte budget above route windows.
	Budget *backpressure.Budget
}

func (r *Route) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: route %q: "+format, append([]any{ErrInvalidOption, r.Name}, args...)...)
	}
	switch {
	case r.Name == "":
		return fmt.Errorf("%w: route name is empty", ErrInvalidOption)
	case r.Source == nil:
		return bad("Source is nil")
	case r.Handler == nil:
		return bad("Handler is nil")
	case r.Workers <= 0:
		return bad("Workers must be > 0, got %d", r.Workers)
	case r.MaxInFlight <= 0:
		return bad("MaxInFlight must be > 0, got %d", r.MaxInFlight)
	case r.MaxInFlightBytes <= 0:
		return bad("MaxInFlightBytes must be > 0, got %d", r.MaxInFlightBytes)
	case r.MaxBatch < 0:
		return bad("MaxBatch must be >= 0, got %d", r.MaxBatch)
	case r.MinFetch < 0:
		return bad("MinFetch must be >= 0, got %d", r.MinFetch)
	case r.Retry.MaxAttempts < 0 || r.Retry.MaxAttempts > 1000:
		return bad("Retry.MaxAttempts must be 0..1000, got %d", r.Retry.MaxAttempts)
	case r.Retry.BaseDelay < 0 || r.Retry.MaxDelay < 0:
		return bad("Retry delays must not be negative")
	case r.Retry.MaxDelay > 0 && r.Retry.BaseDelay > r.Retry.MaxDelay:
		return bad("Retry.BaseDelay %v exceeds MaxDelay %v", r.Retry.BaseDelay, r.Retry.MaxDelay)
	case !r.Criticality.Valid():
		return bad("Criticality %d is not a class", r.Criticality)
	case r.ReservedBytes < 0:
		return bad("ReservedBytes must be >= 0")
	case r.OnExpired < ExpiredAck || r.OnExpired > ExpiredDeadLetter:
		return bad("OnExpired %d", r.OnExpired)
	case r.OnOversize < OversizeAdmitAlone || r.OnOversize > OversizeDeadLetter:
		return bad("OnOversize %d", r.OnOversize)
	case r.OnOverloaded < OverloadedNak || r.OnOverloaded > OverloadedDeadLetter:
		return bad("OnOverloaded %d", r.OnOverloaded)
	case r.QueueOrder < QueueFIFO || r.QueueOrder > QueueLIFO:
		return bad("QueueOrder %d", r.QueueOrder)
	case r.Drop < DropNewest || r.Drop > DropLowestCriticality:
		return bad("Drop %d", r.Drop)
	case r.OnShed < ShedNak || r.OnShed > ShedAck:
		return bad("OnShed %d", r.OnShed)
	case r.ShedQueueLength < 0 || r.ShedNearDeadline < 0 || r.ShedDelay < 0 || r.ThrottleWait < 0:
		return bad("ShedQueueLength, ShedNearDeadline, ShedDelay and ThrottleWait must not be negative")
	}
	if err := r.Expiry.Validate(); err != nil {
		return fmt.Errorf("route %q: %w", r.Name, err)
	}
	return nil
}
