package consumer

import (
	"context"
	"math"
	"time"

	"github.com/sluice-go/sluice/backpressure"
)

// The resource cap. With Options.Resource, every resourceEvery each route
// compares the process's resource pressure with its target (1: at the
// target) and steers a cap on the messages its handlers run at once toward
// resourceAim of it. The work a CPU-bound handler does scales with the
// messages it runs, so the cap that would put the pressure at the aim is
// about cap × aim / pressure: over the target a route cuts toward it, a
// sheddable route the whole way, higher classes a part of it (capGive, at
// most capShrink per interval), so sheddable routes give way first; below
// resourceResume it raises the cap half way toward it (at most by
// resourceGrow per interval) until it reaches the workers. The first cut
// starts from the messages running. The window is left as it is: fetched
// messages wait in the queue, where predictive expiry counts the cap's
// slots, not the workers, and settles those that can no longer start in
// time, so a CPU-bound handler that competes with the broker client and
// the GC runs with only as much concurrency as the process's target allows.
//
// Earlier the cap lowered the window's limit, cut by up to half at once and
// grew back by a tenth per interval only below 90% of the target: in the
// overload lab (2 cores, a 5 ms busy loop at 3x, a backlog of messages near
// their deadline in the broker) the first cuts took the process from 97%
// to 47% of the cores and it held 67% for a target of 80%. A window of two
// or three messages spent most of its slots fetching and settling stale
// messages, so the CPU did not follow the cap.
//
// The cap is fractional: a route on a few cores needs, say, 1.6 handlers
// running on average, which no whole number gives (on 2 cores an integer
// cap swung between 2 and 1, 100% and 50% of the cores, and held 62% for a
// target of 80%). Each interval applies the whole part or one more,
// carrying the fraction over (first-order sigma-delta), so the mean cap is
// the fraction.

const (
	resourceEvery  = 250 * time.Millisecond
	resourceAim    = 0.95
	resourceResume = 0.92
	resourceGrow   = 1.25
)

// capShrink is the most a cut takes per interval, by criticality; capGive
// is the share of the proportional step toward the aim a cut takes.
var (
	capShrink = [4]float64{0.5, 0.7, 0.8, 0.9}
	capGive   = [4]float64{1, 0.6, 0.4, 0.25}
)

// setLimitLocked applies base, the limit the window or its controllers
// want. r.limitMu is held.
func (r *route) setLimitLocked(base int) {
	r.baseLimit = base
	r.window.SetLimit(base)
}

// setLimit is setLimitLocked taking r.limitMu.
func (r *route) setLimit(base int) {
	r.limitMu.Lock()
	r.setLimitLocked(base)
	r.limitMu.Unlock()
}

// applyCap puts the resource cap in force (0: none) on the workers and in
// predictive expiry's plan.
func (r *route) applyCap(n int) {
	r.resCap = n
	r.queue.setRunCap(n)
	if r.pred != nil {
		r.pred.slots.Store(int32(n))
	}
}

// resourceStep moves the resource cap one interval on from the process's
// pressure p.
func (r *route) resourceStep(p float64) {
	r.limitMu.Lock()
	defer r.limitMu.Unlock()
	if r.resCapF > 0 {
		// While a cap binds, decide on the pressure's mean over about half
		// a second: the dithered limit moves it from one sample to the
		// next.
		r.resP += (p - r.resP) / 2
		p = r.resP
	} else {
		r.resP = p
	}
	switch {
	case p >= 1:
		c := r.resCapF
		if c == 0 {
			// Start from what the route runs, not from the workers.
			c = float64(min(max(1, int(r.queue.taken.Load())), r.workers()))
		}
		k := r.cfg.Overload.Criticality & 3
		r.resCapF = max(1, c*max(capShrink[k], 1-capGive[k]*(1-resourceAim/p)))
		r.c.resourceCuts.Add(1)
	case p < resourceResume && r.resCapF > 0:
		r.resCapF *= min(resourceGrow, 1+(resourceAim/max(p, 0.01)-1)/2)
		if r.resCapF >= float64(r.workers()) {
			r.resCapF, r.resCarry = 0, 0
			r.applyCap(0)
			return
		}
	case r.resCapF == 0:
		return
	}
	// Dither: the whole part, plus one whenever the carried fractions
	// add up to one.
	whole := math.Floor(r.resCapF)
	r.resCarry += r.resCapF - whole
	n := int(whole)
	if r.resCarry >= 1 {
		r.resCarry--
		n++
	}
	r.applyCap(n)
}

// workers is the route's handler concurrency, at least one.
func (r *route) workers() int { return max(1, r.cfg.Workers) }

// resourceLoop steps the resource cap every resourceEvery until ctx ends.
func (r *route) resourceLoop(ctx context.Context, sig backpressure.ResourceSignal) {
	t := time.NewTicker(resourceEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.resourceStep(sig.Pressure())
		}
	}
}
