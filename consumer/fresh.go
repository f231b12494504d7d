package consumer

import (
	"math"
	"sync/atomic"
	"time"
)

// Short queues under overload (the package doc states the rule).
// Predictive expiry alone admits everything that can still make its
// deadline, so under a sustained overload the broker's backlog settles
// where each message starts just in time. freshness keeps the standing
// queue short instead, the way CoDel does: workers report how late (after
// its latest fresh start, Message.freshAt) each message with a deadline
// starts, the fetch loop counts what it settles at once, and once per
// interval decide reads both: every start late, or a quarter dropped,
// means a standing queue. In that state admission (fetch.go) and the
// reaper hold each message with a deadline to its fresh bound (freshBy)
// and settle the rest as stale; it ends when nothing is dropped and some
// message starts half its allowance early.
type freshness struct {
	on bool
	// target is the fixed sojourn target (QueuePolicy.Target), 0 for the
	// automatic one: freshRounds handler p99s plus freshFloor.
	target time.Duration
	// minNs is the least lateness (start minus the latest fresh start,
	// Message.freshAt) of the messages with a deadline started since the
	// last decision; math.MaxInt64 when none did. Workers lower it.
	minNs    atomic.Int64
	standing atomic.Bool
	since    time.Time     // fetch loop only: the last decision
	allow    time.Duration // fetch loop only: the last message's allowance
	// fetched and dropped count, since the last decision, the messages
	// with a deadline the fetch loop fetched and those it settled at once
	// (fetch loop only).
	fetched, dropped int
}

const (
	// freshInterval is how often the route looks at the minimum sojourn,
	// at the least; with a slower handler, every other target.
	freshInterval = 100 * time.Millisecond
	// The automatic target: freshRounds handler p99s (a fetch round trip
	// and the queue ahead of a fresh message) plus freshFloor (the broker's
	// and the scheduler's own jitter).
	freshRounds = 2
	freshFloor  = 20 * time.Millisecond
	// freshShare is the part of a message's time (publish to deadline) it
	// may take in the standing state, so a success keeps a margin before
	// its deadline whatever the target.
	freshShare = 0.6
	// freshDropped: when at least this share of the messages fetched in an
	// interval was settled at once (predicted late, or stale), arrivals
	// exceed what the route runs in time whatever the sojourns show: the
	// queue is standing. With a deadline short next to the backlog's
	// spread, predictive expiry keeps the queue within the deadline but
	// some message still starts fresh in every interval.
	freshDropped    = 0.25
	freshMinFetched = 8
)

func (f *freshness) init(target time.Duration) {
	f.on = target >= 0
	f.target = target
	f.minNs.Store(math.MaxInt64)
}

// started records that a message whose latest fresh start is freshAt (unix
// nanos, route clock) started at now.
func (f *freshness) started(freshAt int64, now time.Time) {
	s := now.UnixNano() - freshAt
	for {
		old := f.minNs.Load()
		if s >= old || f.minNs.CompareAndSwap(old, s) {
			return
		}
	}
}

// targetFor is the sojourn target for a route whose handler's p99 per unit
// is high.
func (f *freshness) targetFor(high time.Duration) time.Duration {
	if f.target > 0 {
		return f.target
	}
	return freshRounds*high + freshFloor
}

// counted records a fetched batch's messages with a deadline: n fetched,
// dropped of them settled at once. Only the fetch loop calls it.
func (f *freshness) counted(n, dropped int) {
	f.fetched += n
	f.dropped += dropped
}

// decide looks at the interval once it has passed, and reports whether the
// queue is standing: every message started in the interval started after
// its latest fresh start, or a quarter of what was fetched was settled at
// once. It ends when neither holds and some message started half its
// allowance before its latest fresh start. Only the fetch loop calls it.
func (f *freshness) decide(now time.Time, target time.Duration) bool {
	if f.since.IsZero() {
		f.since = now
	}
	if now.Sub(f.since) < max(freshInterval, 2*target) {
		return f.standing.Load()
	}
	f.since = now
	m := f.minNs.Swap(math.MaxInt64)
	dropping := f.fetched >= freshMinFetched && float64(f.dropped) >= freshDropped*float64(f.fetched)
	f.fetched, f.dropped = 0, 0
	switch {
	case dropping:
		f.standing.Store(true)
	case m == math.MaxInt64:
		// Nothing with a deadline started: nothing to judge by.
	case m > 0:
		f.standing.Store(true)
	case time.Duration(-m) > f.allow/2:
		f.standing.Store(false)
	}
	return f.standing.Load()
}

// freshBy is when m, born at born, must finish to be fresh: within
// freshShare of its time before its deadline, and, with a fixed target
// (QueuePolicy.Target > 0; 0 here: none), within target (plus its run of
// run) of its birth. Without a fixed target the bound is relative to the
// deadline only, so a backlog whose deadlines leave ample time (a burst
// after a restart, a replay) is never settled as stale: it drains in full.
func freshBy(born int64, deadline time.Time, target, run time.Duration) time.Time {
	b := time.Unix(0, born)
	by := b.Add(time.Duration(freshShare * float64(deadline.Sub(b))))
	if target > 0 {
		if t := b.Add(target + run); t.Before(by) {
			by = t
		}
	}
	return by
}

// birth is when m's sojourn began: its publish time when the broker gave
// one not after now, else now.
func birth(m *Message, now time.Time) int64 {
	if p := m.PublishedAt; !p.IsZero() && !p.After(now) {
		return p.UnixNano()
	}
	return now.UnixNano()
}

// freshRun is the run time the rule plans with: a message's high-quantile
// run with its margin (pl), or on a batch route, whose workers run
// batches, a full batch's predicted time (batch.go's model): a message
// there waits for its batch and runs as long as it does. It reports false
// before the route has learned either.
func (r *route) freshRun(pl plan) (time.Duration, bool) {
	if pl.ok {
		return runTime(pl.mean, pl.high, 1), true
	}
	if r.batch != nil && r.batch.model.ok.Load() {
		return r.batch.model.high(r.batch.max), true
	}
	return 0, false
}
