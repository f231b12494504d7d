package backpressure

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// PressureLevel is how pressed a route is, as its handler sees it. At
// PressureNormal a handler does its full work; above, it may serve a
// cheaper answer where one exists (Google SRE, "Handling Overload": a
// degraded answer beats none, and beats a late one).
type PressureLevel int8

const (
	// PressureNormal: no sign of overload.
	PressureNormal PressureLevel = iota
	// PressureElevated: the route runs at its limit (its window is full,
	// or messages wait a fair part of the time they have left). A cheaper
	// path keeps it from tipping over.
	PressureElevated
	// PressureHigh: the route is overloaded: messages expire or are shed
	// instead of running, wait most of the time they have left, or the
	// downstream refuses work.
	PressureHigh
)

var levelNames = [...]string{"normal", "elevated", "high"}

// String returns "normal", "elevated" or "high".
func (l PressureLevel) String() string {
	if l < PressureNormal || l > PressureHigh {
		return fmt.Sprintf("PressureLevel(%d)", int8(l))
	}
	return levelNames[l]
}

// PressureCause is a set of reasons for a pressure level.
type PressureCause uint8

const (
	// CauseSaturated: the route's window is (nearly) full.
	CauseSaturated PressureCause = 1 << iota
	// CauseQueueWait: messages wait a large share of the time they have
	// left before their deadline.
	CauseQueueWait
	// CauseDropping: messages expire or are shed instead of running.
	CauseDropping
	// CauseThrottled: the route's Throttle rejects pulls because the
	// downstream refuses work.
	CauseThrottled
	// CauseResource: the process is over its CPU, GC, scheduler or memory
	// target (ResourceMonitor).
	CauseResource
	numCauses = 5
)

var causeNames = [...]string{"saturated", "queue_wait", "dropping", "throttled", "resource"}

// PressureCauses lists every single cause, in order.
func PressureCauses() []PressureCause {
	out := make([]PressureCause, numCauses)
	for i := range out {
		out[i] = 1 << i
	}
	return out
}

// String lists the causes, for example "saturated,dropping"; "" for none.
func (c PressureCause) String() string {
	var parts []string
	for i := range numCauses {
		if c&(1<<i) != 0 {
			parts = append(parts, causeNames[i])
		}
	}
	return strings.Join(parts, ",")
}

// Pressure is how pressed a route is, and why.
type Pressure struct {
	Level  PressureLevel
	Causes PressureCause
}

// String returns the level and causes, for example "high (saturated,dropping)".
func (p Pressure) String() string {
	if p.Causes == 0 {
		return p.Level.String()
	}
	return p.Level.String() + " (" + p.Causes.String() + ")"
}

// PressureSignals are a route's raw overload signals at one moment. The
// counters are cumulative: the gauge looks at their growth between two
// evaluations.
type PressureSignals struct {
	// InUse and Limit are the messages the window holds and its limit.
	InUse, Limit int
	// QueueWait is how long a message queued now is expected to wait for a
	// worker; Slack is how long recently fetched messages had left before
	// their deadline (0 when they have none).
	QueueWait, Slack time.Duration
	// Fetched counts messages fetched; Dropped those that expired or were
	// shed instead of running.
	Fetched, Dropped uint64
	// Throttle is the route Throttle's local reject probability.
	Throttle float64
	// Resource is the process's resource use against its target (1: at
	// the target; see ResourceMonitor.Pressure), 0 without a monitor.
	Resource float64
}

// Thresholds of ComputePressure.
const (
	// A route is High when more than dropHigh of what it fetched since the
	// last evaluation was dropped, when its Throttle rejects at least
	// throttleHigh, when messages wait at least waitHigh of their slack,
	// or when the process is at its resource target; Elevated when its
	// window is at least satElevated full, anything was dropped or
	// throttled, messages wait at least waitElevated of their slack, or
	// the process is at resourceElevated of its target.
	dropHigh         = 0.05
	throttleHigh     = 0.1
	waitHigh         = 0.75
	waitElevated     = 0.25
	satElevated      = 0.9
	resourceElevated = 0.9
)

// ComputePressure is the pressure signals s show, given the signals prev
// of the previous evaluation (for the counters' growth), without
// hysteresis: a route is High when more than 5% of what it fetched since
// prev was dropped, when its Throttle rejects 10% or more, when messages
// wait 75% or more of the time they have left, or when the process is at
// its resource target; Elevated when its window is 90% full or more,
// anything was dropped or throttled, messages wait 25% or more of the time
// they have left, or the process is at 90% of its resource target.
func ComputePressure(prev, s PressureSignals) Pressure {
	var p Pressure
	raise := func(l PressureLevel, c PressureCause) {
		p.Causes |= c
		p.Level = max(p.Level, l)
	}
	if s.Limit > 0 && float64(s.InUse) >= satElevated*float64(s.Limit) {
		raise(PressureElevated, CauseSaturated)
	}
	if s.Slack > 0 && s.QueueWait > 0 {
		switch r := float64(s.QueueWait) / float64(s.Slack); {
		case r >= waitHigh:
			raise(PressureHigh, CauseQueueWait)
		case r >= waitElevated:
			raise(PressureElevated, CauseQueueWait)
		}
	}
	if s.Dropped > prev.Dropped && s.Fetched >= prev.Fetched {
		if d, f := s.Dropped-prev.Dropped, s.Fetched-prev.Fetched; float64(d) > dropHigh*float64(max(f, 1)) {
			raise(PressureHigh, CauseDropping)
		} else {
			raise(PressureElevated, CauseDropping)
		}
	}
	switch {
	case s.Throttle >= throttleHigh:
		raise(PressureHigh, CauseThrottled)
	case s.Throttle > 0:
		raise(PressureElevated, CauseThrottled)
	}
	switch {
	case s.Resource >= 1:
		raise(PressureHigh, CauseResource)
	case s.Resource >= resourceElevated:
		raise(PressureElevated, CauseResource)
	}
	return p
}

// PressureOptions configure a PressureGauge. The zero value is usable.
type PressureOptions struct {
	// Interval is the least time between two evaluations of the signals.
	// 0 means 100 ms.
	Interval time.Duration
	// Hold is how long the signals must stay below the level in force
	// before the gauge lowers it: pressure rises at once and falls only
	// after Hold, so a handler switching paths on it does not flap. 0
	// means 1 s.
	Hold time.Duration
}

// PressureGauge turns a route's signals into a Pressure with hysteresis
// (ComputePressure, then PressureOptions.Hold). It evaluates lazily: Load
// reads the signals again when Interval has passed since the last
// evaluation, on the caller's goroutine, so it needs no goroutine of its
// own. The consumer keeps one per route and puts it on every handler ctx
// (PressureFrom). Safe for concurrent use.
type PressureGauge struct {
	o       PressureOptions
	signals func() PressureSignals

	cur     atomic.Uint32 // packed Pressure
	next    atomic.Int64  // unix nanos of the next evaluation
	changes atomic.Uint64

	mu      sync.Mutex
	last    PressureSignals
	started bool
	below   time.Time // since when the signals have stayed below the level in force
}

// NewPressureGauge returns a gauge that reads signals (at most once per
// Interval). Errors wrap ErrInvalidOption.
func NewPressureGauge(o PressureOptions, signals func() PressureSignals) (*PressureGauge, error) {
	if o.Interval < 0 || o.Hold < 0 || signals == nil {
		return nil, fmt.Errorf("%w: pressure gauge: negative Interval or Hold, or no signals", ErrInvalidOption)
	}
	if o.Interval == 0 {
		o.Interval = 100 * time.Millisecond
	}
	if o.Hold == 0 {
		o.Hold = time.Second
	}
	return &PressureGauge{o: o, signals: signals}, nil
}

func packPressure(p Pressure) uint32 { return uint32(uint8(p.Level))<<8 | uint32(p.Causes) }
func unpackPressure(v uint32) Pressure {
	return Pressure{Level: PressureLevel(v >> 8), Causes: PressureCause(v)}
}

// Load returns the pressure in force, evaluating the signals first if
// Interval has passed since the last evaluation.
func (g *PressureGauge) Load() Pressure { return g.LoadAt(time.Now()) }

// LoadAt is Load at now.
func (g *PressureGauge) LoadAt(now time.Time) Pressure {
	if now.UnixNano() >= g.next.Load() && g.mu.TryLock() {
		if now.UnixNano() >= g.next.Load() {
			g.evaluateLocked(now)
		}
		g.mu.Unlock()
	}
	return unpackPressure(g.cur.Load())
}

// Changes counts the times the level changed: a flap counter.
func (g *PressureGauge) Changes() uint64 { return g.changes.Load() }

func (g *PressureGauge) evaluateLocked(now time.Time) {
	s := g.signals()
	g.next.Store(now.Add(g.o.Interval).UnixNano())
	if !g.started {
		// The first evaluation has no previous counters to compare with.
		g.started, g.last = true, s
		s.Dropped, s.Fetched = 0, 0
	}
	p := ComputePressure(g.last, s)
	g.last = s
	cur := unpackPressure(g.cur.Load())
	switch {
	case p.Level >= cur.Level:
		g.below = time.Time{}
	case g.below.IsZero():
		g.below = now
		p = cur
	case now.Sub(g.below) < g.o.Hold:
		p = cur
	default:
		g.below = time.Time{}
	}
	if p.Level != cur.Level {
		g.changes.Add(1)
	}
	g.cur.Store(packPressure(p))
}

type pressureKey struct{}

// WithPressure returns a copy of ctx from which PressureFrom reads g.
func WithPressure(ctx context.Context, g *PressureGauge) context.Context {
	return context.WithValue(ctx, pressureKey{}, g)
}

// PressureFrom returns the pressure of the route whose handler got ctx
// (the consumer puts its route's gauge on every handler ctx), and
// PressureNormal when ctx carries none. A handler with a cheaper way to
// answer calls it to choose:
//
//	if backpressure.PressureFrom(ctx).Level >= backpressure.PressureElevated {
//		return serveFromCache(ctx, m)
//	}
//
// It costs a ctx lookup and an atomic load, plus an evaluation of the
// route's signals at most once per interval.
func PressureFrom(ctx context.Context) Pressure {
	g, ok := ctx.Value(pressureKey{}).(*PressureGauge)
	if !ok {
		return Pressure{}
	}
	return g.Load()
}
