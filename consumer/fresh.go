package consumer

import (
	"math"
	"sync/atomic"
	"time"
)

// Short queues under overload. Predictive expiry alone admits everything
// that can still make its deadline, so under a sustained overload the
// broker's backlog settles where each message starts just in time: the
// successes finish at their deadline, with no margin. freshness keeps the
// standing queue short instead, the way CoDel does: it watches the minimum
// sojourn (publish, or fetch when the broker does not say, to the start of
// the handler) of the messages with a deadline that start in each interval.
// A burst leaves some message that waited little; only a standing queue
// keeps every one of them waiting. When an interval's minimum is above the
// target, the queue is standing and a message with a deadline is admitted
// only if it is predicted to finish within the target (plus its run) of
// its publish, and within freshShare of the time its deadline gave it;
// the others are settled as expired (OverloadStats.Stale) at fetch, or by
// the reaper once queued, so the fetch loop drains the stale part of the
// backlog to its fresh end. The state ends when an interval's minimum
// falls below half the target. Messages without a deadline are never
// settled by it.
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
}

const (
	// freshInterval is how often the route looks at the minimum sojourn,
	// at the least; with a slower handler, every other target.
	freshInterval = 100 * time.Millisecond
	// The automatic target: freshRounds handler p99s (a fetch round trip
	// and the queue ahead of a fresh message) plus freshFloor (the broker's
	// and the scheduler's own jitter).
	freshRounds = 4
	freshFloor  = 20 * time.Millisecond
	// freshShare is the part of a message's time (publish to deadline) it
	// may take in the standing state, so a success keeps a margin before
	// its deadline whatever the target.
	freshShare = 0.6
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

// decide looks at the least lateness once an interval has passed, and
// reports whether the queue is standing: every message started in the
// interval started after its latest fresh start. It ends when one started
// half its allowance before it. Only the fetch loop calls it.
func (f *freshness) decide(now time.Time, target time.Duration) bool {
	if f.since.IsZero() {
		f.since = now
	}
	if now.Sub(f.since) < max(freshInterval, 2*target) {
		return f.standing.Load()
	}
	f.since = now
	m := f.minNs.Swap(math.MaxInt64)
	switch {
	case m == math.MaxInt64:
		// Nothing with a deadline started: nothing to judge by.
	case m > 0:
		f.standing.Store(true)
	case time.Duration(-m) > f.allow/2:
		f.standing.Store(false)
	}
	return f.standing.Load()
}

// freshBy is when m, born at born, must finish to be fresh: within target
// (plus its run of run) of its birth, and within freshShare of its time
// before its deadline.
func freshBy(born int64, deadline time.Time, target, run time.Duration) time.Time {
	b := time.Unix(0, born)
	by := b.Add(target + run)
	if share := b.Add(time.Duration(freshShare * float64(deadline.Sub(b)))); share.Before(by) {
		by = share
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
