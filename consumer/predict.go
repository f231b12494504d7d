package consumer

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Predictive expiry. A message with a deadline is started only if it is
// predicted to finish in time: when it is fetched, its expected wait for a
// worker plus a high quantile of the route's recent handler latency must fit
// before its deadline; when a worker picks it (and again after a shared
// slot, if any), the latency quantile alone must. A message that would miss
// is settled at once as expired (DeadLetter.OnExpired, counted in
// OverloadStats.ExpiredEarly), so it frees its window capacity and its
// broker slot instead of taking a worker to produce a late result. The
// route learns the handler's latency from its own runs on messages with a
// deadline; until the first such run it checks deadlines only.

// highQuantile is the handler latency a message must have left before its
// deadline to start: the 99th percentile of recent runs, plus a tenth of
// it and a millisecond (runMargin), so a run predicted to just make it
// does not race its own deadline.
const highQuantile = 0.99

func runMargin(high time.Duration) time.Duration { return high/10 + time.Millisecond }

// latencies learns a route's handler latency online from its last
// len(ring) runs: their mean and a high quantile, recomputed on each of the
// first warmRuns runs and then at most every recomputeEvery, by whichever
// run finds it due. Observing costs two atomic operations; reading, two
// atomic loads.
type latencies struct {
	ring [256]atomic.Int64 // nanoseconds; 0: not stored yet
	n    atomic.Uint64     // runs observed
	due  atomic.Int64      // unix nanos of the next recompute

	mu      sync.Mutex // one recompute at a time
	scratch []time.Duration

	mean, high atomic.Int64 // nanoseconds; 0 before the first run
}

const (
	recomputeEvery = 20 * time.Millisecond
	warmRuns       = 16
)

// observe records a run of d that ended at now.
func (l *latencies) observe(now time.Time, d time.Duration) {
	n := l.n.Add(1)
	l.ring[(n-1)%uint64(len(l.ring))].Store(int64(max(d, 1)))
	if n > warmRuns && now.UnixNano() < l.due.Load() {
		return
	}
	if !l.mu.TryLock() {
		return // another run is recomputing
	}
	l.due.Store(now.Add(recomputeEvery).UnixNano())
	l.recomputeLocked(min(n, uint64(len(l.ring))))
	l.mu.Unlock()
}

func (l *latencies) recomputeLocked(n uint64) {
	s := l.scratch[:0]
	var sum time.Duration
	for i := range n {
		if d := time.Duration(l.ring[i].Load()); d > 0 {
			s = append(s, d)
			sum += d
		}
	}
	if len(s) == 0 {
		return
	}
	// 256 values sorted at most every 20 ms: ~10 µs, nothing per message.
	slices.Sort(s)
	i := int(highQuantile*float64(len(s))+0.999999) - 1
	l.high.Store(int64(s[min(max(i, 0), len(s)-1)]))
	l.mean.Store(int64(sum / time.Duration(len(s))))
	l.scratch = s
}

// estimate returns the mean and the high quantile, and false before any
// run.
func (l *latencies) estimate() (mean, high time.Duration, ok bool) {
	h := l.high.Load()
	return time.Duration(l.mean.Load()), time.Duration(h), h > 0
}

// predictor is a route's predictive expiry: its learned handler latency
// and what each worker is doing.
type predictor struct {
	// lat is the handler's latency per cost unit (per message on a route
	// without Window.Cost, where every message is one unit).
	lat latencies
	// busy[i] is worker i's state: 0 idle, busyUntimed running a message
	// without a deadline (start unknown), else the unix nanos its current
	// handler run started; busyUnits[i] is that message's cost in units.
	busy      []atomic.Int64
	busyUnits []atomic.Int32
	// slots, when positive, is how many messages may run at once (the
	// resource cap), fewer than the workers.
	slots atomic.Int32
	// free is the fetch loop's scratch for plan.
	free []time.Duration
}

const busyUntimed = -1

func newPredictor(workers int) *predictor {
	return &predictor{busy: make([]atomic.Int64, workers), busyUnits: make([]atomic.Int32, workers)}
}

// plan is the prediction for one fetched batch.
type plan struct {
	ok   bool
	high time.Duration // a unit's high-quantile latency
	mean time.Duration // a unit's mean latency
	// free[i] is how long from now until the i-th worker to come free
	// takes its next message (sorted).
	free []time.Duration
}

// plan predicts, at now, when each queue position will start. It is called
// by the fetch loop once per batch.
func (p *predictor) plan(now time.Time) plan {
	mean, high, ok := p.lat.estimate()
	if !ok {
		return plan{}
	}
	// The busy workers' time left, soonest first; then the slots: the
	// idle ones now, the others as the busy ones finish. With a resource
	// cap of c slots, a slot frees only when fewer than c run.
	busy := p.free[:0]
	for i := range p.busy {
		var left time.Duration
		switch s := p.busy[i].Load(); s {
		case 0:
			continue
		case busyUntimed:
			left = mean / 2
		default:
			left = max(0, time.Duration(max(1, p.busyUnits[i].Load()))*mean-now.Sub(time.Unix(0, s)))
		}
		busy = append(busy, left)
	}
	slices.Sort(busy)
	c := len(p.busy)
	if s := int(p.slots.Load()); s > 0 && s < c {
		c = s
	}
	tail := busy[max(0, len(busy)-c):]
	idle := c - len(tail)
	free := slices.Grow(p.free[:0], c)[:c]
	copy(free[idle:], tail) // overlapping or from the old array: both fine
	clear(free[:idle])
	p.free = free
	return plan{ok: true, high: high, mean: mean, free: free}
}

// wait is the expected wait before a message with pos units queued ahead
// of it (0: next) starts: with every unit taking the mean, those units go
// round the workers in the order they come free, so it starts on the
// (pos mod W)-th worker to come free after pos/W more units on it. (On a
// route without Window.Cost every message is one unit: pos is its place.)
func (pl plan) wait(pos int) time.Duration {
	w := len(pl.free)
	return pl.free[pos%w] + time.Duration(pos/w)*pl.mean
}

// lateAt reports whether a message of units with deadline, with pos units
// queued ahead of it at now, is predicted to finish after its deadline.
func (pl plan) lateAt(now, deadline time.Time, pos, units int) bool {
	return pl.ok && now.Add(pl.wait(pos)+runTime(pl.mean, pl.high, units)).After(deadline)
}

// runTime is the high-quantile run time of a message of units, with its
// margin: the mean per unit times its units, plus the tail one unit shows
// above its mean (a dear message is many units of work, not many draws of
// a cheap message's jitter). For one unit it is the high quantile.
func runTime(mean, high time.Duration, units int) time.Duration {
	d := mean*time.Duration(max(units, 1)) + max(high-mean, 0)
	return d + runMargin(d)
}

// tooLate reports whether a message of units with deadline, started at
// now, is predicted to finish after it.
func (p *predictor) tooLate(now, deadline time.Time, units int) bool {
	mean, high, ok := p.lat.estimate()
	return ok && now.Add(runTime(mean, high, units)).After(deadline)
}

// reapLoop settles, as expired, queued messages that can no longer start
// in time (their start-by time, set when they were queued, has passed),
// without waiting for a worker to reach them: each frees its window
// capacity and its broker slot at once. It wakes at the earliest start-by
// time in the queue, at most every reapGap, until ctx ends.
func (r *route) reapLoop(ctx context.Context) {
	t := time.NewTimer(time.Hour)
	defer t.Stop()
	var next int64
	for {
		if next != 0 {
			t.Reset(max(reapGap, time.Duration(next-r.clock.Now().UnixNano())))
		} else {
			t.Stop()
		}
		select {
		case <-ctx.Done():
			return
		case <-r.queue.reap:
			// A push lowered the earliest start-by: take it into account.
			r.queue.mu.Lock()
			e := r.queue.earliest
			r.queue.mu.Unlock()
			if next == 0 || e != 0 && e < next {
				next = e
			}
			continue
		case <-t.C:
		}
		now := r.clock.Now()
		var late []*Message
		late, next = r.queue.takeLate(now.UnixNano())
		if r.order != nil {
			waiting, n := r.order.takeLate(now.UnixNano())
			late = append(late, waiting...)
			if n != 0 && (next == 0 || n < next) {
				next = n
			}
		}
		for _, m := range late {
			r.expireQueued(m, now)
		}
	}
}

// reapGap is the least time between two passes of the reaper over the
// queue.
const reapGap = time.Millisecond
