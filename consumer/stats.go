package consumer

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/backpressure"
)

// Outcome is how one delivery ended. Every fetched message ends in exactly
// one; the package documentation states what the broker is told for each.
type Outcome int8

const (
	// OutcomeSucceeded: the handler returned nil; acked. A success after
	// the message's deadline also counts in RouteStats.Late.
	OutcomeSucceeded Outcome = iota
	// OutcomeRetried: a retryable error with attempts left; nak'd with
	// backoff so the broker redelivers it.
	OutcomeRetried
	// OutcomeOverloaded: the handler said "overloaded, do not retry" with
	// attempts left; nak'd with backoff, not retried in process.
	OutcomeOverloaded
	// OutcomeDeadLettered: written to the dead-letter sink, then terminated.
	OutcomeDeadLettered
	// OutcomeDLQFailed: the dead-letter write failed; nak'd so the broker
	// redelivers it, and the redelivery goes straight to the sink again
	// without running the handler. The route knows the redelivery by its
	// Origin, topic, key and value (Sources may leave Origin empty), and
	// remembers up to 64 × Window.Messages + 16,384 such messages, the
	// oldest forgotten first.
	OutcomeDLQFailed
	// OutcomeTerminated: would have been dead-lettered, but the route has
	// no sink; terminated.
	OutcomeTerminated
	// OutcomeExpired: its deadline passed (or would before it could
	// finish) at fetch, in the queue, before the handler, or while the
	// handler ran out of time; settled by DeadLetter.OnExpired.
	OutcomeExpired
	// OutcomeShed: dropped by an overload policy before it ran; settled by
	// Overload.OnShed.
	OutcomeShed
	// OutcomeReturned: handed back on shutdown (nak'd without delay)
	// before it ran.
	OutcomeReturned
	// OutcomeAbandoned: left unsettled on purpose, for the broker to
	// redeliver after its ack deadline: a handler still running after the
	// shutdown grace (settling it would let a second consumer run it while
	// it still runs here), a last delivery whose dead-letter write never
	// succeeded before shutdown, or a settlement never confirmed. A last
	// delivery (SourceInfo.MaxDeliver) is not redelivered: those are also
	// counted in RouteStats.LastAbandoned.
	OutcomeAbandoned
	numOutcomes
)

var outcomeNames = [...]string{"succeeded", "retried", "overloaded", "dead_lettered", "dlq_failed", "terminated", "expired", "shed", "returned", "abandoned"}

// String returns the outcome's metric label, for example "dead_lettered".
func (o Outcome) String() string {
	if o < 0 || o >= numOutcomes {
		return "unknown"
	}
	return outcomeNames[o]
}

// Outcomes lists every Outcome, in order.
func Outcomes() []Outcome {
	out := make([]Outcome, numOutcomes)
	for i := range out {
		out[i] = Outcome(i)
	}
	return out
}

// RouteInfo describes a route to an Observer (defaults applied).
type RouteInfo struct {
	Name        string
	Criticality backpressure.Criticality
	Workers     int
	// WindowMessages and WindowBytes are the route window's size.
	WindowMessages int
	WindowBytes    int64
	// BatchMessages is Batch.MaxMessages on a route with a BatchHandler,
	// 0 on a route with a Handler.
	BatchMessages int
}

// RouteStats is a snapshot of one route. Every fetched message is either
// still held or counted in exactly one Outcome:
//
//	Fetched == sum(Settled) + Held
//
// Counters never go backwards.
type RouteStats struct {
	RouteInfo
	// Fetched counts messages the Source handed over.
	Fetched uint64
	// Settled counts outcomes, indexed by Outcome.
	Settled [numOutcomes]uint64
	// Held is what the route holds now: queued, running, waiting for the
	// window or awaiting a settlement's confirmation.
	Held int
	// Late counts successes that finished after the message's deadline.
	Late uint64
	// LastAbandoned counts the messages of Settled[OutcomeAbandoned] that
	// were on the broker's last delivery (SourceInfo.MaxDeliver) and whose
	// dead letter could not be written (or the route has no sink, or the
	// handler was stuck): the broker will not deliver them again. They
	// stay in the stream; an adapter's recovery (JetStream's max-deliveries
	// advisory names each one) is what can still bring them back.
	LastAbandoned uint64
	// KeepAlives counts InProgress calls made for held messages.
	KeepAlives uint64
	// OldestHeld is how long the oldest held message has been held.
	OldestHeld time.Duration

	Window   WindowStats
	Errors   ErrorStats
	Overload OverloadStats
	Order    OrderStats
	// Health is the route's state (Consumer.Health), as of this snapshot.
	Health RouteHealth
	Batch  BatchStats
}

// Goodput returns successes that finished within their deadline.
func (s RouteStats) Goodput() uint64 {
	ok := s.Settled[OutcomeSucceeded]
	if s.Late > ok {
		return 0 // a snapshot read between the two counters
	}
	return ok - s.Late
}

// WindowStats is a snapshot of a route's window.
type WindowStats struct {
	// InUse and InUseBytes are the capacity held now.
	InUse      int
	InUseBytes int64
	// Peak and PeakBytes are the most ever held at once.
	Peak      int
	PeakBytes int64
	// Limit is the message limit in force: Window.Messages, what the
	// route's AdaptiveLimit set, or what the default window found
	// (WindowPolicy.Messages).
	Limit int
	// Adaptive reports whether Limit is driven by an AdaptiveLimit.
	Adaptive bool
	// Blocked is the total time the route waited for window capacity: the
	// backpressure signal. BudgetBlocked is the part of it spent waiting
	// for the process-wide Budget while the window itself had room.
	Blocked       time.Duration
	BudgetBlocked time.Duration
}

// ErrorStats counts what went wrong on a route.
type ErrorStats struct {
	// Handler counts handler runs that returned an error or panicked;
	// Panics the panics among them.
	Handler uint64
	Panics  uint64
	// MalformedDeadlines counts deadline headers that could not be parsed;
	// MalformedCriticality criticality headers that named no class.
	MalformedDeadlines   uint64
	MalformedCriticality uint64
	// Settle counts settlements the broker refused or never confirmed
	// (the broker redelivers those messages).
	Settle uint64
	// Fetch counts failed fetches; DeadLetter failed dead-letter writes.
	Fetch      uint64
	DeadLetter uint64
	// Last is the text of the last of these errors (fetch, settlement,
	// dead-letter write), and LastAt when it happened; "" if none.
	Last   string
	LastAt time.Time
}

// OverloadStats counts a route's overload decisions.
type OverloadStats struct {
	// Shed counts shed decisions by reason and message class (indexed by
	// ShedReason, then backpressure.Criticality). Each shed message ends
	// in one outcome: OutcomeShed, except a shed on the broker's last
	// delivery (SourceInfo.MaxDeliver), which is dead-lettered with class
	// ClassShed.
	Shed [numShedReasons][4]uint64
	// RetryBudgetExhausted counts retryable failures the route's
	// RetryBudget refused to retry.
	RetryBudgetExhausted uint64
	// ThrottleProbability is the route Throttle's current local reject
	// probability (0 without a Throttle).
	ThrottleProbability float64
	// ThrottleRefused counts window slots the Throttle kept the fetch loop
	// from filling.
	ThrottleRefused uint64
	// ExpiredEarly counts messages settled as expired (they are in
	// Settled[OutcomeExpired]) before their deadline, at fetch, in the
	// queue or when a worker picked them, because the route predicted they
	// would finish after it (predictive expiry).
	ExpiredEarly uint64
	// Stale counts messages settled as expired (they are in
	// Settled[OutcomeExpired], not in ExpiredEarly) before their deadline,
	// at fetch or in the queue, because a standing queue could not run
	// them fresh (QueuePolicy.Target); StandingQueue says whether the
	// route is in that state now.
	Stale         uint64
	StandingQueue bool
	// ResourceCuts counts the intervals in which the process was over its
	// resource target (Options.Resource) and the route lowered its cap on
	// the messages its handlers run at once; ResourceCap is the whole
	// number of it applied now (0: none in force; a fractional cap
	// alternates between two).
	ResourceCuts uint64
	ResourceCap  int
	// Pressure is what backpressure.PressureFrom tells the route's
	// handlers: how pressed the route is, and why.
	Pressure backpressure.Pressure
	// HandlerMean and HandlerP99 are the handler latency the route has
	// learned from its recent runs on messages with a deadline, which
	// predictive expiry uses; 0 before the first such run.
	HandlerMean, HandlerP99 time.Duration
}

// Observer receives each route once at New, with a function that snapshots
// its stats (read it at scrape time), and returns where handler timings go.
type Observer interface {
	ObserveRoute(info RouteInfo, stats func() RouteStats) RouteObserver
}

// RouteObserver receives one call per handler run. It must be cheap and safe
// for concurrent use.
type RouteObserver interface {
	HandlerDone(outcome Outcome, latency time.Duration)
}

type counters struct {
	fetched       atomic.Uint64
	settled       [numOutcomes]atomic.Uint64
	late          atomic.Uint64
	handlerErrors atomic.Uint64
	panics        atomic.Uint64
	malformed     atomic.Uint64
	badCrit       atomic.Uint64
	settleErrors  atomic.Uint64
	fetchErrors   atomic.Uint64
	dlqErrors     atomic.Uint64
	keepAlives    atomic.Uint64
	lastAbandoned atomic.Uint64
	shed          [numShedReasons][4]atomic.Uint64
	budgetOut     atomic.Uint64
	throttled     atomic.Uint64
	expiredEarly  atomic.Uint64
	stale         atomic.Uint64
	resourceCuts  atomic.Uint64
}

// inflight is the set of messages a route holds, for keep-alive, the
// oldest-age stat and shutdown.
type inflight struct {
	mu    sync.Mutex
	items []*Message
	free  []int32
	n     int
}

func (f *inflight) add(m *Message) {
	f.mu.Lock()
	if k := len(f.free); k > 0 {
		m.slot = f.free[k-1]
		f.free = f.free[:k-1]
		f.items[m.slot] = m
	} else {
		m.slot = int32(len(f.items))
		f.items = append(f.items, m)
	}
	f.n++
	f.mu.Unlock()
}

func (f *inflight) remove(m *Message) {
	f.mu.Lock()
	f.items[m.slot] = nil
	f.free = append(f.free, m.slot)
	f.n--
	f.mu.Unlock()
}

func (f *inflight) len() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.n
}

// snapshot returns the held messages, to use outside the lock.
func (f *inflight) snapshot() []*Message {
	f.mu.Lock()
	out := make([]*Message, 0, f.n)
	for _, m := range f.items {
		if m != nil {
			out = append(out, m)
		}
	}
	f.mu.Unlock()
	return out
}

func (f *inflight) oldest(now time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	var old time.Duration
	for _, m := range f.items {
		if m != nil {
			if a := now.Sub(m.fetchedAt); a > old {
				old = a
			}
		}
	}
	return old
}
