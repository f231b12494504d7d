package consumer

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/backpressure"
)

// Outcome is how one delivery ended.
type Outcome int8

const (
	OutcomeSucceeded    Outcome = iota // handler returned nil; acked
	OutcomeRetried                     // retryable error; nak'd with backoff
	OutcomeOverloaded                  // "overloaded, do not retry"; nak'd with backoff, not retried here
	OutcomeDeadLettered                // written to the DLQ, then terminated
	OutcomeDLQFailed                   // DLQ write failed; nak'd so nothing is lost
	OutcomeTerminated                  // permanent failure without a DLQ; terminated
	OutcomeExpired                     // deadline passed; settled without (further) handling
	OutcomeShed                        // dropped or nak'd by an overload policy
	OutcomeReturned                    // nak'd on shutdown without running to completion
	numOutcomes
)

var outcomeNames = [...]string{"succeeded", "retried", "overloaded", "dead_lettered", "dlq_failed", "terminated", "expired", "shed", "returned"}

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

// RouteInfo describes a route to an Observer.
type RouteInfo struct {
	Name             string
	Criticality      backpressure.Criticality
	Workers          int
	MaxInFlight      int
	MaxInFlightBytes int64
}

// RouteStats is a snapshot of one route. Every fetched message is either
// still in flight or counted in exactly one Outcome:
//
//	Fetched == sum(Settled) + InFlight
type RouteStats struct {
	RouteInfo
	Fetched uint64
	Settled [numOutcomes]uint64 // indexed by Outcome
	// Late counts successes that finished after the message's deadline:
	// goodput is Settled[OutcomeSucceeded] - Late.
	Late uint64
	// HandlerErrors counts handler runs that returned an error or panicked.
	HandlerErrors uint64
	Panics        uint64
	// MalformedDeadlines counts deadline headers that could not be parsed.
	MalformedDeadlines uint64
	// SettleErrors counts Ack/Nak/Term calls the broker refused; the
	// broker redelivers those messages.
	SettleErrors uint64
	FetchErrors  uint64
	// KeepAlives counts InProgress calls made for long-running messages.
	KeepAlives uint64

	// Shed counts shed decisions by reason and message class (indexed by
	// ShedReason, then backpressure.Criticality). Each shed message ends in
	// one outcome: Settled[OutcomeShed], except a shed on the broker's last
	// delivery (DeliveryLimiter) with a DeadLetter sink, which is
	// dead-lettered with class ClassShed and counted in
	// Settled[OutcomeDeadLettered] (or OutcomeDLQFailed). So the sum of Shed
	// is Settled[OutcomeShed] plus those.
	Shed [numShedReasons][4]uint64
	// RetryBudgetExhausted counts retryable failures the route's
	// RetryBudget refused to retry.
	RetryBudgetExhausted uint64
	// ThrottleProbability is the route Throttle's current local reject
	// probability (0 without a Throttle).
	ThrottleProbability float64
	// ThrottleRefused counts window slots the route's Throttle kept the
	// fetch loop from filling.
	ThrottleRefused uint64
	// WindowLimit is the message limit in force: MaxInFlight, or what the
	// route's AdaptiveLimit set.
	WindowLimit int
	// Adaptive reports whether WindowLimit is driven by an AdaptiveLimit.
	Adaptive bool

	InFlight, PeakInFlight           int
	InFlightBytes, PeakInFlightBytes int64
	// Blocked is the total time the route waited for window capacity.
	Blocked time.Duration
	// OldestInFlight is how long the oldest in-flight message has been held.
	OldestInFlight time.Duration
}

// Goodput returns successes that finished within their deadline.
func (s RouteStats) Goodput() uint64 { return s.Settled[OutcomeSucceeded] - s.Late }

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
	settleErrors  atomic.Uint64
	fetchErrors   atomic.Uint64
	keepAlives    atomic.Uint64
	shed          [numShedReasons][4]atomic.Uint64
	budgetOut     atomic.Uint64
	throttled     atomic.Uint64
}

// inflight tracks every held message, for the oldest-age metric, keep-alive
// and shutdown.
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

// each calls fn for every held message, outside the lock.
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
