package consumer

import "time"

// drainWindow is the window that finds its size (WindowPolicy.Messages
// 0): it starts at twice the route's Workers and doubles, up to its upper
// bound, on either of two signals, each judged once per drainEvery:
//
//   - A stale backlog: at least drainGrow of what the fetch loop fetched was
//     dropped at once. Under a sustained overload the broker keeps a
//     backlog whose older part will not make its deadline; each of those is
//     fetched only to be settled as expired, one window's free slots per
//     round trip. With a window of twice the Workers (2 for one worker)
//     that drain falls behind the arrivals, and the backlog, all of it
//     stale, grows without end. A larger window drains it in fewer round
//     trips; predictive expiry and the short-queue rule (fresh.go) keep
//     what it admits to what can still finish fresh, so the extra room is
//     not filled with work that would wait.
//   - A backlog the window starves the workers of: some fetch came back
//     with all it asked for (the broker had more) and a worker found the
//     queue empty. Throughput still rises with the window there: each
//     message pays a smaller share of a pull's round trip, and the workers
//     stop waiting for it. Once the window covers the round trip the
//     workers no longer run dry and it stops growing: in-flight ≈ rate ×
//     round trip, as BBR sizes a flow, within the window's byte bound.
//
// It halves back when at most drainShrink was dropped and no fetch came
// back full (the broker had no backlog: a larger window would hold
// nothing). Only the fetch loop uses it.
type drainWindow struct {
	on        bool
	minFetch  bool // MinFetch follows the limit in force
	lo, hi    int
	limit     int
	fetched   int
	dropped   int
	full      bool // a fetch since the last decision came back with all it asked for
	since     time.Time
	decisions int
}

const (
	// drainEvery is how often the drain window decides, at the earliest.
	drainEvery = 100 * time.Millisecond
	// A window grows when at least drainGrow of what was fetched since
	// the last decision was dropped at admission, and shrinks when at
	// most drainShrink was.
	drainGrow   = 0.25
	drainShrink = 0.05
)

// observe records a fetched batch of n (of asked) of which dropped were
// settled at admission; dry reports (and clears) whether a worker found
// the queue empty since the last decision. It returns the limit the window
// should have.
func (d *drainWindow) observe(now time.Time, n, asked, dropped int, dry func() bool) int {
	d.fetched += n
	d.dropped += dropped
	d.full = d.full || n >= asked && asked > 0
	if d.since.IsZero() {
		d.since = now
	}
	if now.Sub(d.since) < drainEvery {
		return d.limit
	}
	starved := dry() && d.full
	switch f := float64(d.dropped) / float64(max(d.fetched, 1)); {
	case f >= drainGrow || starved:
		d.limit = min(d.hi, 2*d.limit)
	case f <= drainShrink && !d.full:
		d.limit = max(d.lo, d.limit/2)
	}
	d.fetched, d.dropped, d.full, d.since = 0, 0, false, now
	d.decisions++
	return d.limit
}

// fetchMin is the low-water mark of the pull for the limit in force.
func (r *route) fetchMin() int {
	if r.drain.on && r.drain.minFetch {
		return max(1, r.drain.limit/4)
	}
	return r.cfg.Window.MinFetch
}
