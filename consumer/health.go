package consumer

import (
	"fmt"
	"sync"
	"time"

	"github.com/sluice-go/sluice/backpressure"
)

// RouteState is what a route is doing, as a platform's probes ask it: is
// it attached to its broker, and is it making progress? Consumer.Health
// reports one per route.
type RouteState int8

const (
	// StateStopped: the route does not run: Run has not started or has
	// returned.
	StateStopped RouteState = iota
	// StateFailed: the route's Source closed for good (Fetch returned
	// ErrClosed: the stream was deleted, a consumer created outside sluice
	// was deleted) while Run goes on with the other routes. Only a restart
	// brings the route back, so liveness fails (Health.Live).
	StateFailed
	// StateNotReady: the route runs, but its Source reports that it cannot
	// deliver (SourceInfo.Ready): the broker connection is down, the
	// Kafka group has not formed, the consumer was deleted.
	StateNotReady
	// StateStuck: the route holds messages and has settled none for longer
	// than HealthPolicy.StuckAfter: handlers that do not return, or a
	// broker or dead-letter sink that does not answer.
	StateStuck
	// StateShedding: the route runs and settles, but under pressure
	// (backpressure.PressureHigh): it expires or sheds messages instead of
	// running them, or its downstream refuses work.
	StateShedding
	// StateProgressing: the route holds messages and settled at least one
	// within StuckAfter.
	StateProgressing
	// StateIdle: the route is ready and holds nothing.
	StateIdle
	numStates
)

var stateNames = [...]string{"stopped", "failed", "not_ready", "stuck", "shedding", "progressing", "idle"}

// String returns the state's metric label, for example "not_ready".
func (s RouteState) String() string {
	if s < 0 || s >= numStates {
		return "unknown"
	}
	return stateNames[s]
}

// RouteStates lists every RouteState, in order.
func RouteStates() []RouteState {
	out := make([]RouteState, numStates)
	for i := range out {
		out[i] = RouteState(i)
	}
	return out
}

// Ready reports whether a route in state s can take traffic: it is
// attached to its broker and not stuck (idle, progressing or shedding).
func (s RouteState) Ready() bool {
	return s == StateIdle || s == StateProgressing || s == StateShedding
}

// HealthPolicy says when a route counts as stuck.
type HealthPolicy struct {
	// StuckAfter is how long a route may hold messages without settling
	// any before it counts as stuck (StateStuck). Set it above the longest
	// time a handler may legitimately run (a handler kept alive with
	// InProgress for minutes needs minutes here). 0 means 1 minute.
	StuckAfter time.Duration
}

// DefaultStuckAfter is HealthPolicy.StuckAfter when it is 0.
const DefaultStuckAfter = time.Minute

// RouteHealth is one route's state, with the reason in words.
type RouteHealth struct {
	Route string
	State RouteState
	// Reason says why, for an operator: "holds 3 messages and settled none
	// for 2m0s", "source not ready: nats: connection closed".
	Reason string
	// Since is when the route entered State, as far as Health calls saw
	// it (a state that came and went between two calls is not seen).
	Since time.Time
	// Held is the number of messages the route holds.
	Held int
	// LastSettled is the latest time Health saw the route's settled count
	// move (a settlement happened at or before it); zero before the first.
	LastSettled time.Time
}

// Health is every route's RouteHealth at one moment.
type Health struct {
	At     time.Time
	Routes []RouteHealth
}

// Ready reports whether every route is ready (RouteState.Ready) and the
// reason of the first that is not.
func (h Health) Ready() (bool, string) {
	for _, r := range h.Routes {
		if !r.State.Ready() {
			return false, fmt.Sprintf("route %q %s: %s", r.Route, r.State, r.Reason)
		}
	}
	return true, ""
}

// Live reports whether no route has been stuck or failed for grace or
// longer, and the reason of the first that has. A platform restarts a
// process that is not live; a route that is not ready (a broker down) is
// still live, since a restart would not bring the broker back, and so is a
// consumer whose Run has not started or has returned.
func (h Health) Live(grace time.Duration) (bool, string) {
	for _, r := range h.Routes {
		if (r.State == StateStuck || r.State == StateFailed) && h.At.Sub(r.Since) >= grace {
			return false, fmt.Sprintf("route %q %s since %s: %s", r.Route, r.State, r.Since.UTC().Format(time.RFC3339), r.Reason)
		}
	}
	return true, ""
}

// Health returns each route's state now, in the order given to New. It is
// safe to call from any goroutine (probes and metric scrapes call it); it
// never blocks on a broker.
//
// The route's progress is sampled: each call compares the route's settled
// count with the previous call's, so a route counts as stuck StuckAfter
// after its last settlement that a call saw, or after the fetch of the
// oldest message it holds if that came later, or after Run started if it
// never settled anything. Probing every few seconds keeps it within a probe
// interval of the truth, and late, never early.
func (c *Consumer) Health() Health { return c.HealthAt(time.Now()) }

// HealthAt is Health at now.
func (c *Consumer) HealthAt(now time.Time) Health {
	h := Health{At: now, Routes: make([]RouteHealth, len(c.routes))}
	for i, r := range c.routes {
		h.Routes[i] = r.healthAt(now)
	}
	return h
}

// routeHealth is a route's health bookkeeping: what the previous Health
// call saw, and whether the route runs.
type routeHealth struct {
	stuckAfter time.Duration

	mu       sync.Mutex
	running  bool
	started  time.Time
	stopped  string // why the route stopped; "" while running
	failed   bool   // its fetch loop ended with an error (Source closed)
	settled  uint64 // the settled count the previous call saw
	lastMove time.Time
	state    RouteState
	since    time.Time
}

// begin is called by Run as the route starts.
func (h *routeHealth) begin(now time.Time) {
	h.mu.Lock()
	h.running, h.started, h.lastMove, h.stopped, h.failed = true, now, time.Time{}, "", false
	h.mu.Unlock()
}

// end is called by Run when the route's fetch loop returned (err: why; nil
// when Run's ctx ended), and with done once Run returns.
func (h *routeHealth) end(err error, done bool) {
	h.mu.Lock()
	switch {
	case done:
		h.running, h.failed = false, false
		if h.stopped == "" {
			h.stopped = "Run's context ended: shutting down"
		}
		h.stopped = "Run returned: " + h.stopped
	case err != nil:
		h.failed, h.stopped = true, err.Error()
	default:
		h.running, h.stopped = false, "Run's context ended: shutting down"
	}
	h.mu.Unlock()
}

func (r *route) healthAt(now time.Time) RouteHealth {
	var settled uint64
	for i := range r.c.settled {
		settled += r.c.settled[i].Load()
	}
	held := r.held.len()
	oldest := time.Duration(0)
	if held > 0 {
		oldest = r.held.oldest(now)
	}
	var notReady error
	if r.info.Ready != nil {
		notReady = r.info.Ready()
	}
	var pressure backpressure.Pressure
	if r.pressure != nil {
		pressure = r.pressure.LoadAt(now)
	}

	h := &r.health
	h.mu.Lock()
	defer h.mu.Unlock()
	if settled != h.settled {
		h.settled, h.lastMove = settled, now
	}
	out := RouteHealth{Route: r.cfg.Name, Held: held, LastSettled: h.lastMove}
	stuckAfter := h.stuckAfter
	if stuckAfter == 0 {
		stuckAfter = DefaultStuckAfter
	}
	// The stuck clock runs from the last settlement seen, the fetch of the
	// oldest held message, or the start, whichever is latest.
	quiet := h.lastMove
	if quiet.IsZero() {
		quiet = h.started
	}
	if held > 0 {
		if f := now.Add(-oldest); f.After(quiet) {
			quiet = f
		}
	}
	switch {
	case !h.running && h.started.IsZero():
		out.State, out.Reason = StateStopped, "Run has not started"
	case h.failed:
		out.State, out.Reason = StateFailed, "the source closed: "+h.stopped+" (only a restart brings the route back)"
	case !h.running:
		out.State, out.Reason = StateStopped, h.stopped
	case held > 0 && now.Sub(quiet) > stuckAfter:
		out.State = StateStuck
		out.Reason = fmt.Sprintf("holds %d messages and settled none for %v (StuckAfter %v): handlers do not return, or the broker or dead-letter sink does not answer",
			held, now.Sub(quiet).Round(time.Millisecond), stuckAfter)
		if notReady != nil {
			out.Reason += "; source not ready: " + notReady.Error()
		}
	case notReady != nil:
		out.State, out.Reason = StateNotReady, "source not ready: "+notReady.Error()
	case pressure.Level >= backpressure.PressureHigh:
		out.State, out.Reason = StateShedding, "pressure "+pressure.String()
	case held > 0:
		out.State = StateProgressing
		out.Reason = fmt.Sprintf("holds %d messages, oldest held %v", held, oldest.Round(time.Millisecond))
	default:
		out.State, out.Reason = StateIdle, "holds nothing"
	}
	if out.State != h.state || h.since.IsZero() {
		h.state, h.since = out.State, now
		if out.State == StateStuck {
			h.since = quiet.Add(stuckAfter) // it became stuck then, not when this call noticed
		}
	}
	out.Since = h.since
	return out
}
