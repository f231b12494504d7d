package consumer

import (
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"reflect"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
)

// Defaults a Route gets for the numbers it leaves at zero.
const (
	// DefaultWorkers is Route.Workers when it is 0.
	DefaultWorkers = 8
	// DefaultWindowBytes is WindowPolicy.Bytes when it is 0.
	DefaultWindowBytes = 8 << 20
	// MaxWorkers is the most Workers a route may have.
	MaxWorkers = 4096
	// MaxWindowMessages is the most messages a route window may hold.
	MaxWindowMessages = 1 << 20
	// DefaultDrainWindow is how many messages a route with the default
	// window may hold (at most) while it drains a backlog: of messages that
	// would not make their deadline, or one the workers would otherwise
	// wait for a pull's round trip on; see WindowPolicy.Messages. (256
	// until issue 25: the minimal route drained a NATS backlog at 0.69× the
	// raw client's defaults with it, 0.86× with 1024; Kafka 0.35× and
	// 0.74×.)
	DefaultDrainWindow = 1024
)

// Clock reads the time for deadline decisions. Tests inject one; nil means
// the system clock.
type Clock interface{ Now() time.Time }

type systemClock struct{}

func (systemClock) Now() time.Time { return time.Now() }

// Route connects one Source to one Handler with its own window, workers and
// policies. One route never takes another's workers or window: that is the
// bulkhead that keeps slow report-style work from starving critical topics.
//
// Name, Source and Handler are required; every other field's zero value is
// a documented, safe default, so the minimal route is
//
//	consumer.Route{Name: "orders", Source: src, Handler: handle}
//
// which reads deadlines from the Sluice-Deadline header, runs
// DefaultWorkers workers in a window of twice as many messages and
// DefaultWindowBytes bytes, retries 3 times, and terminates what fails for
// good (set DeadLetter.Sink to keep it).
type Route struct {
	// Name identifies the route in metrics, logs and dead letters.
	// Required, unique within a Consumer.
	Name string
	// Source is the route's subscription (see adapters/nats and
	// adapters/kafka). Required; one Source serves one route.
	Source Source
	// Handler processes each message. Required, unless BatchHandler is set
	// instead.
	Handler Handler
	// BatchHandler, set instead of Handler, processes messages in batches
	// (see Batch and BatchPolicy): one bulk write for many messages, each
	// keeping its own deadline, outcome, window slot and order.
	BatchHandler BatchHandler
	// Batch bounds the batches of a BatchHandler; its zero value needs no
	// tuning. Ignored with Handler.
	Batch BatchPolicy

	// Workers is the fixed number of goroutines running Handler: no
	// goroutine per message. 0 means DefaultWorkers; at most MaxWorkers.
	Workers int
	// Ordering says which messages may run at the same time: Unordered
	// (the default), ByKey or ByPartition. On an ordered route a message
	// that fails is retried in place, after the backoff, while its key's
	// later messages wait; see Ordering and the package documentation.
	Ordering Ordering
	// Window bounds what the route holds.
	Window WindowPolicy
	// Expiry says where deadlines come from. The zero value reads the
	// expiry.DefaultHeader header; see expiry.Policy to turn that off.
	Expiry expiry.Policy
	// Retry governs retryable handler errors.
	Retry RetryPolicy
	// DeadLetter says where messages that failed for good go, and how
	// expired, oversize and overloaded messages are settled.
	DeadLetter DeadLetterPolicy
	// Overload holds the route's overload controls; all are off at their
	// zero value.
	Overload OverloadPolicy

	// KeepAlive is how often held messages get InProgress. 0 means a third
	// of the Source's AckWait (SourceInfo), or none when it reports none.
	// Negative disables it.
	KeepAlive time.Duration
}

// WindowPolicy bounds the messages a route holds, queued, running and
// awaiting settlement together. The route asks its Source only for what the
// window has free, so a slow handler shows up as broker lag, not memory.
type WindowPolicy struct {
	// Messages bounds the number of messages; at most MaxWindowMessages.
	// 0 means a window that finds its size: it holds twice the route's
	// Workers, and doubles, up to DefaultDrainWindow (or twice the Workers
	// if more), while most of what it fetches is dropped at once (expired,
	// or predicted to finish after its deadline: a stale backlog to
	// drain), or while fetches come back full (the broker has a backlog)
	// and a worker finds the queue empty (the window is too small to
	// cover a pull's round trip), so each round trip brings more; once
	// drops stop and fetches come back short (no backlog) it halves back.
	// The Source is told the upper bound.
	// With an Overload.AdaptiveLimit, 0 means twice the Workers. Leave it
	// 0 unless memory demands a bound: a fixed window never grows. In the
	// overload lab (docs/lab.md) a route with a fixed 2 × Workers (and a
	// ShedNearDeadline margin) held one 2 ms worker at 40% of capacity on
	// NATS and 1% on Kafka at 10× offered load, where the minimal route
	// (0) held 100% and 83%.
	Messages int
	// Bytes bounds their bytes (Message.Size). 0 means DefaultWindowBytes.
	Bytes int64
	// MaxBatch caps one fetch. 0 means Messages.
	MaxBatch int
	// Cost, when enabled, charges the window (Messages) and the queue
	// (Overload.Queue.MaxCost) in cost units instead of one per message,
	// and predictive expiry expects each message's run to take its units.
	Cost CostPolicy
	// MinFetch is the low-water mark of the pull: the route fetches again
	// only once at least this many message slots are free, so a broker
	// round trip carries a batch rather than one message. 0 means a quarter
	// of MaxBatch, or of the limit in force for a window that finds its
	// size (at least 1); 1 fetches as soon as any slot frees.
	MinFetch int
	// MaxPerKey bounds the messages of one key (ByKey) or partition
	// (ByPartition) that an ordered route holds: when a fetched message
	// would exceed it, the route takes nothing more in until that key has
	// room, so one hot key cannot fill the window while the others wait
	// in the broker. 0 means half of Messages (at least 1). Ignored on an
	// Unordered route.
	MaxPerKey int
}

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
// whole byte window (or than the process Budget can ever give the route).
type OversizeAction int8

const (
	// OversizeAdmitAlone waits until the window is otherwise empty and runs
	// the message alone. The default: slow, never a deadlock, nothing lost.
	// A message the Budget can never admit is dead-lettered regardless.
	OversizeAdmitAlone OversizeAction = iota
	// OversizeDeadLetter writes it to the dead-letter sink (class
	// "oversize") without running it; without a sink it is terminated.
	OversizeDeadLetter
)

// DeadLetterPolicy says where messages that failed for good go, and how the
// route settles messages it will not run.
type DeadLetterPolicy struct {
	// Sink receives permanent failures, messages out of attempts, and what
	// the actions below send to it. The original is settled only after
	// the sink confirmed the write. nil means they are terminated with the
	// reason and counted OutcomeTerminated.
	Sink dlq.Sink
	// OnExpired settles expired messages; default ExpiredAck.
	OnExpired ExpiredAction
	// OnOversize handles messages bigger than Window.Bytes; default
	// OversizeAdmitAlone.
	OnOversize OversizeAction
	// OnOverloaded settles messages whose handler returned an error marked
	// "overloaded, do not retry"; default OverloadedNak.
	OnOverloaded OverloadedAction
}

// RetryPolicy governs retryable errors. The zero value is 3 attempts with a
// 100 ms base and 30 s cap.
type RetryPolicy struct {
	// MaxAttempts is the most deliveries a message gets, counting broker
	// redeliveries and "overloaded" hand-backs: 1 means never retry. When
	// the last attempt fails the message is dead-lettered. 0 means 3.
	// Valid: 0 to 1000.
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

// OverloadPolicy holds a route's overload controls (Google SRE, "Handling
// Overload"). Every field's zero value keeps the behaviour of a route
// without it, at no cost on the message path.
type OverloadPolicy struct {
	// Criticality is the route's class and the ceiling for any class a
	// producer's header asks for. The zero value is Sheddable.
	Criticality backpressure.Criticality
	// ReservedBytes is the part of Options.Budget kept for this route
	// alone. Ignored without a Budget.
	ReservedBytes int64

	// RetryBudget, if set, must have room for every in-process retry (a
	// retryable failure nak'd for redelivery with attempts left); the
	// route records each first delivery (Attempt 1) as a first attempt.
	// A failure the budget refuses is not retried: it is dead-lettered with
	// class ClassRetryBudget (replay it later at a safe pace) or, without a
	// dead-letter sink, nak'd with Retry.MaxDelay; either way it counts in
	// RouteStats.Overload.RetryBudgetExhausted. Routes may share one budget.
	RetryBudget *backpressure.RetryBudget

	// Throttle, if set, is client-side adaptive throttling of the route's
	// pull. Each free window slot the fetch loop would fill counts as a
	// request; the throttle lets through a share of them (the rest are
	// "rejected locally", counted, and left in the broker), and each
	// handler result that is not marked overloaded counts as accepted. So
	// when the handler's downstream refuses work (the handler returns
	// backpressure.Overloaded(err), or ErrThrottled from its own Throttle),
	// the route fetches about K times what the downstream accepts and the
	// backlog waits in the broker. Do not also call Do/Allow on the same
	// Throttle from the handler.
	Throttle *backpressure.Throttle
	// ThrottleWait is how long the fetch loop pauses after the Throttle
	// rejected some of the slots it offered. 0 means 20 ms.
	ThrottleWait time.Duration

	// AdaptiveLimit, if set, drives the window's message limit from handler
	// latency and results (AIMD between its bounds; New lowers its Max to
	// Window.Messages with CapMax when it is larger). Each route needs its
	// own AdaptiveLimit: New refuses one shared by two routes.
	AdaptiveLimit *backpressure.AdaptiveLimit
	// Slots, if set, is a pool of handler slots shared with other routes
	// that use the same scarce downstream: a worker takes a slot at the
	// message's criticality before running the handler, so under
	// contention the lowest class waits (and its messages expire or are
	// shed) while critical routes keep their throughput.
	Slots *backpressure.Slots

	// Queue orders and bounds the fetched messages waiting for a worker.
	Queue QueuePolicy
	// ShedNearDeadline sheds (reason ShedNearDeadline) a message that has
	// less than this left before its deadline when it is fetched or when a
	// worker picks it. Predictive expiry (see the package documentation)
	// already keeps messages that would finish late from starting, from
	// the latency the route learns; this is an explicit floor on top, for
	// a handler whose latency the route cannot learn well (rare, bursty
	// runs). 0 means off; messages without a deadline are never shed this
	// way.
	ShedNearDeadline time.Duration
	// OnShed settles shed messages; default ShedNak.
	OnShed ShedAction
	// ShedDelay is the Nak delay of a shed message. 0 means 1 s.
	ShedDelay time.Duration
}

// QueuePolicy orders and bounds a route's queue of fetched messages that
// wait for a worker. The window already bounds it; these shed earlier.
type QueuePolicy struct {
	// Order is the order workers take queued messages; default QueueFIFO.
	Order QueueOrder
	// MaxLength sheds a message (chosen by DropWhenFull, settled by
	// OnShed, counted as OutcomeShed with reason ShedQueueFull) whenever
	// more than this many messages wait for a worker. It only matters
	// below Window.Messages − Workers. 0 means never shed.
	MaxLength int
	// MaxCost sheds messages (chosen by DropWhenFull, settled by OnShed,
	// counted as OutcomeShed with reason ShedQueueFull) whenever the
	// messages waiting for a worker would cost more than this many units
	// together (Window.Cost; one per message without it). It bounds the
	// queue in work rather than in messages: one dear message costs as
	// much as a hundred cheap ones, so cheap messages do not wait behind
	// a queue of dear ones. 0 means no cost bound.
	MaxCost int
	// DropWhenFull chooses the message shed when the queue is over
	// MaxLength or MaxCost; default DropNewest.
	DropWhenFull DropPolicy
	// Target is the sojourn target of the short-queue rule (see the
	// package documentation, "Short queues under overload"): when every
	// message with a deadline that started in an interval had waited
	// longer than this since its publish (or a quarter of those fetched
	// were settled at once), the queue is standing, and a
	// message with a deadline is admitted only if it is predicted to
	// finish within 60 % of the time to its deadline and, when Target is
	// set (> 0), within Target (plus its run) of its publish; the others
	// are settled as expired (OverloadStats.Stale). 0 means automatic: two
	// of the handler's learned p99 latencies plus 20 ms detect the state,
	// and only the deadline-relative bound settles messages, so a backlog
	// whose deadlines leave ample time drains in full. Negative turns the
	// rule off (then
	// only the deadline bounds the wait). Messages without a deadline are
	// never settled by it.
	Target time.Duration
}

// CostHeader is the header through which a producer may declare a
// message's cost in units (CostPolicy.Header's usual name), capped by the
// route (CostPolicy.Max).
const CostHeader = "Sluice-Cost"

// CostPolicy says what a message costs, in units, against its route's
// window and queue (seed 000's "count vs cost": a message that takes 1 ms
// and one that takes 500 ms are not the same load). A message's cost is
// the first of Func, Header and the cost learned for its Class that gives
// a positive number; else one unit. The zero value is off: every message
// costs one unit.
type CostPolicy struct {
	// Func returns a message's cost (<= 0: not known).
	Func func(*Message) int
	// Header names a header declaring the cost as a decimal number of
	// units, usually CostHeader. A producer's header is capped at Max.
	Header string
	// Class, when set, learns the cost of each message class (the key it
	// returns, at most 1024 classes): an exponentially weighted mean of
	// its handler time, in Units.
	Class func(*Message) string
	// Unit is the handler time one unit stands for, for learned costs.
	// 0 means 1 ms.
	Unit time.Duration
	// Max caps a message's cost. 0 means a quarter of the window
	// (Window.Messages), so four of the dearest messages fit at once.
	Max int
	// MaxRunning bounds the cost of the messages running at once: a
	// worker takes the next queued message that fits (in the queue's
	// order; QueueCheapestFirst takes the cheapest that fits), or any
	// message when nothing runs. Set it below Workers × the dearest cost
	// so dear messages can never take every worker and cheap ones always
	// find one: with 4 workers and messages of 1 and 100 units, 310 keeps
	// a worker for the cheap ones. 0 means no bound.
	MaxRunning int
}

// Enabled reports whether messages cost anything but one unit.
func (p CostPolicy) Enabled() bool { return p.Func != nil || p.Header != "" || p.Class != nil }

// Options configure a Consumer. The zero value is usable.
type Options struct {
	// Clock reads time for deadline decisions. nil means the system clock.
	Clock Clock
	// Observer receives per-route stats and handler timings (see package
	// metrics for Prometheus). nil means none.
	Observer Observer
	// Hook follows each message through its route (see package otelsluice
	// for OpenTelemetry tracing). nil means none, at no cost.
	Hook Hook
	// Logger receives errors the routes cannot return (fetch, settlement
	// and dead-letter failures), each distinct error at most once per
	// LogInterval per route, with the route's name. nil means none; the
	// last error is in RouteStats either way.
	Logger *slog.Logger
	// LogInterval is the least time between two log lines for the same
	// error text on one route. 0 means 10 s.
	LogInterval time.Duration
	// ShutdownGrace is how long running handlers and settlements get after
	// Run's ctx is done. Run returns within ShutdownGrace plus
	// ShutdownSlack, whatever a handler, sink or broker does. 0 means 10 s.
	// Negative is invalid.
	ShutdownGrace time.Duration
	// Health says when a route counts as stuck (Consumer.Health).
	Health HealthPolicy
	// Budget is an optional process-wide byte budget above route windows.
	Budget *backpressure.Budget
	// Resource, if set, is the process's resource pressure (typically a
	// backpressure.ResourceMonitor: CPU against a target share of the
	// cores, GC, scheduler latency, heap against GOMEMLIMIT). While it is
	// at or over its target every route lowers a cap on the messages its
	// handlers run at once each 250 ms, starting from those running,
	// toward what would put the pressure at 95% of the target (cap × 0.95
	// / pressure: the whole step for Sheddable, 60% of it for
	// SheddablePlus, 40% for Critical, 25% for CriticalPlus, and at most
	// ×0.5, ×0.7, ×0.8, ×0.9 per interval), so a CPU-bound handler runs
	// with only as much concurrency as the target allows and sheddable
	// routes give way first; below 92% of the target the cap grows back
	// half way toward that point (at most ×1.25 per interval) until it
	// reaches Workers. While a cap binds the route decides on the
	// pressure's mean over about half a second, and the cap is fractional:
	// it alternates between its whole part and one more so that its mean
	// is the fraction (1.6 handlers on 2 cores, not 2 or 1). It never goes
	// below one. The window is not lowered: fetched messages wait in the
	// queue, and predictive expiry counts the cap, not Workers, when it
	// predicts their wait. It also raises the routes' pressure
	// (backpressure.CauseResource). nil means none.
	Resource backpressure.ResourceSignal
}

// ShutdownSlack is what Run may take past Options.ShutdownGrace: handlers
// whose ctx was cancelled at the end of the grace get this long to return,
// and settlements still under way get this long to finish.
const ShutdownSlack = time.Second

// isNil reports whether v is nil or an interface holding a nil pointer,
// map, slice, func or channel (a "typed nil" that would panic later).
func isNil(v any) bool {
	if v == nil {
		return true
	}
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Pointer, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan, reflect.Interface:
		return rv.IsNil()
	}
	return false
}

// withDefaults fills the zero values of r that have defaults.
func (r Route) withDefaults() Route {
	if r.Workers == 0 {
		r.Workers = DefaultWorkers
	}
	if r.BatchHandler != nil {
		r = r.batchDefaults()
	}
	if r.Window.Messages == 0 && r.Window.Cost.Enabled() {
		// In units: 100 per worker (100 ms of work each, at 1 ms a unit).
		r.Window.Messages = min(100*r.Workers, MaxWindowMessages)
	}
	if r.Window.Messages == 0 {
		r.Window.Messages = 2 * r.Workers
		if r.Overload.AdaptiveLimit == nil {
			r.Window.Messages = max(r.Window.Messages, DefaultDrainWindow)
		}
		r.Window.Messages = min(r.Window.Messages, MaxWindowMessages)
	}
	if r.Window.Bytes == 0 {
		r.Window.Bytes = DefaultWindowBytes
	}
	if r.Window.MaxBatch == 0 || r.Window.MaxBatch > r.Window.Messages {
		r.Window.MaxBatch = r.Window.Messages
	}
	if r.Window.MinFetch == 0 {
		r.Window.MinFetch = max(1, r.Window.MaxBatch/4)
	}
	r.Window.MinFetch = min(r.Window.MinFetch, r.Window.MaxBatch)
	if r.Window.MaxPerKey == 0 {
		r.Window.MaxPerKey = max(1, r.Window.Messages/2)
	}
	r.Retry = r.Retry.withDefaults()
	if r.Overload.ShedDelay == 0 {
		r.Overload.ShedDelay = time.Second
	}
	if r.Overload.ThrottleWait == 0 {
		r.Overload.ThrottleWait = 20 * time.Millisecond
	}
	return r
}

// validate checks r as given (before defaults).
func (r *Route) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: route %q: "+format, append([]any{ErrInvalidOption, r.Name}, args...)...)
	}
	o := &r.Overload
	switch {
	case r.Name == "":
		return fmt.Errorf("%w: route name is empty", ErrInvalidOption)
	case isNil(r.Source):
		return bad("Source is nil")
	case r.Handler == nil && r.BatchHandler == nil:
		return bad("Handler is nil")
	case r.Handler != nil && r.BatchHandler != nil:
		return bad("set Handler or BatchHandler, not both")
	case r.Workers < 0 || r.Workers > MaxWorkers:
		return bad("Workers must be 0 (default %d) to %d, got %d", DefaultWorkers, MaxWorkers, r.Workers)
	case r.Window.Messages < 0 || r.Window.Messages > MaxWindowMessages:
		return bad("Window.Messages must be 0 (default) to %d, got %d", MaxWindowMessages, r.Window.Messages)
	case r.Window.Bytes < 0:
		return bad("Window.Bytes must be >= 0, got %d", r.Window.Bytes)
	case r.Window.MaxBatch < 0:
		return bad("Window.MaxBatch must be >= 0, got %d", r.Window.MaxBatch)
	case r.Window.MinFetch < 0:
		return bad("Window.MinFetch must be >= 0, got %d", r.Window.MinFetch)
	case r.Window.MaxPerKey < 0:
		return bad("Window.MaxPerKey must be >= 0, got %d", r.Window.MaxPerKey)
	case r.Ordering < Unordered || r.Ordering > ByPartition:
		return bad("Ordering %d", r.Ordering)
	case r.Retry.MaxAttempts < 0 || r.Retry.MaxAttempts > 1000:
		return bad("Retry.MaxAttempts must be 0..1000, got %d", r.Retry.MaxAttempts)
	case r.Retry.BaseDelay < 0 || r.Retry.MaxDelay < 0:
		return bad("Retry delays must not be negative")
	case r.Retry.MaxDelay > 0 && r.Retry.BaseDelay > r.Retry.MaxDelay:
		return bad("Retry.BaseDelay %v exceeds MaxDelay %v", r.Retry.BaseDelay, r.Retry.MaxDelay)
	case r.DeadLetter.Sink != nil && isNil(r.DeadLetter.Sink):
		return bad("DeadLetter.Sink is a typed nil")
	case r.DeadLetter.OnExpired < ExpiredAck || r.DeadLetter.OnExpired > ExpiredDeadLetter:
		return bad("DeadLetter.OnExpired %d", r.DeadLetter.OnExpired)
	case r.DeadLetter.OnOversize < OversizeAdmitAlone || r.DeadLetter.OnOversize > OversizeDeadLetter:
		return bad("DeadLetter.OnOversize %d", r.DeadLetter.OnOversize)
	case r.DeadLetter.OnOverloaded < OverloadedNak || r.DeadLetter.OnOverloaded > OverloadedDeadLetter:
		return bad("DeadLetter.OnOverloaded %d", r.DeadLetter.OnOverloaded)
	case !o.Criticality.Valid():
		return bad("Overload.Criticality %d is not a class", o.Criticality)
	case o.ReservedBytes < 0:
		return bad("Overload.ReservedBytes must be >= 0")
	case o.Queue.Order < QueueFIFO || o.Queue.Order > QueueCheapestFirst:
		return bad("Overload.Queue.Order %d", o.Queue.Order)
	case o.Queue.DropWhenFull < DropNewest || o.Queue.DropWhenFull > DropLowestCriticality:
		return bad("Overload.Queue.DropWhenFull %d", o.Queue.DropWhenFull)
	case o.OnShed < ShedNak || o.OnShed > ShedAck:
		return bad("Overload.OnShed %d", o.OnShed)
	case r.Window.Cost.Unit < 0 || r.Window.Cost.Max < 0 || r.Window.Cost.MaxRunning < 0 || o.Queue.MaxCost < 0:
		return bad("Window.Cost.Unit, Max, MaxRunning and Overload.Queue.MaxCost must not be negative")
	case o.Queue.MaxLength < 0 || o.ShedNearDeadline < 0 || o.ShedDelay < 0 || o.ThrottleWait < 0:
		return bad("Overload.Queue.MaxLength, ShedNearDeadline, ShedDelay and ThrottleWait must not be negative")
	case r.Retry.MaxDelay > math.MaxInt64/4 || o.ShedDelay > math.MaxInt64/4:
		return bad("delays too large")
	}
	if err := r.Expiry.Validate(); err != nil {
		return fmt.Errorf("route %q: %w", r.Name, err)
	}
	if r.BatchHandler != nil {
		return r.validateBatch()
	}
	return nil
}
