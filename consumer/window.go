package consumer

import "time"

// drainWindow is the window that finds its size (WindowPolicy.Messages
// 0): it holds twice the route's Workers, and grows while the fetch loop
// drops most of what it fetches at once. Under a sustained overload the
// broker keeps a backlog whose older part will not make its deadline; each
// of those is fetched only to be settled as expired, one window's free
// slots per round trip. With a window of twice the Workers (2 for one
// worker) that drain falls behind the arrivals, and the backlog, all of it
// stale, grows without end. A larger window drains it in fewer round trips;
// predictive expiry keeps what it admits to what can still make its
// deadline, so the extra room is not filled with work that would be late.
// Only the fetch loop uses it.
type drainWindow struct {
	on        bool
	minFetch  bool // MinFetch follows the limit in force
	lo, hi    int
	limit     int
	fetched   int
	dropped   int
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

// observe records a fetched batch of n of which dropped were settled at
// admission, and returns the limit the window should have.
func (d *drainWindow) observe(now time.Time, n, dropped int) int {
	d.fetched += n
	d.dropped += dropped
	if d.since.IsZero() {
		d.since = now
	}
	if now.Sub(d.since) < drainEvery {
		return d.limit
	}
	switch f := float64(d.dropped) / float64(max(d.fetched, 1)); {
	case f >= drainGrow:
		d.limit = min(d.hi, 2*d.limit)
	case f <= drainShrink:
		d.limit = max(d.lo, d.limit/2)
	}
	d.fetched, d.dropped, d.since = 0, 0, now
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
