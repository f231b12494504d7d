package consumer

import (
	"context"
	"math"
	"time"

	"github.com/sluice-go/sluice/backpressure"
)

// The resource cap. With Options.Resource, every resourceEvery each route
// compares the process's resource pressure with its target (1: at the
// target) and steers the cap on its window's message limit toward
// resourceAim of it. The work a CPU-bound handler does scales with the
// messages it runs, so the cap that would put the pressure at the aim is
// about cap × aim / pressure: over the target a route cuts toward it, a
// sheddable route the whole way, higher classes a part of it (capGive, at
// most capShrink per interval), so sheddable routes give way first; below
// resourceResume it raises the cap half way toward it (at most by
// resourceGrow per interval) until the cap no longer binds. The first cut
// starts from the messages running (at most Workers), not from a window
// far above them. The messages a route does not take in wait in the broker
// (and expire there when they can no longer make their deadline), so a
// CPU-bound handler that competes with the broker client and the GC runs
// with only as much concurrency as the process's target allows.
//
// An earlier controller cut by up to half at once and grew back by a tenth
// per interval only below 90% of the target: in the overload lab (2 cores,
// a 5 ms busy loop at 3x) the first cuts took the process from 97% to 47%
// of the cores and it held 67% for a target of 80%.
//
// The cap is fractional: a route with only a few messages in flight on a
// few cores needs, say, 1.6 of them on average, which no whole number
// gives (on 2 cores an integer cap swung between 2 and 1, 100% and 50% of
// the cores, and held 62% for a target of 80%). Each interval applies the
// whole part or one more, carrying the fraction over (first-order
// sigma-delta), so the window's mean limit is the cap.

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
// want, lowered to the resource cap while one binds. r.limitMu is held.
func (r *route) setLimitLocked(base int) {
	r.baseLimit = base
	l := base
	if c := r.resCap; c > 0 {
		l = min(l, c)
	}
	r.window.SetLimit(l)
}

// setLimit is setLimitLocked taking r.limitMu.
func (r *route) setLimit(base int) {
	r.limitMu.Lock()
	r.setLimitLocked(base)
	r.limitMu.Unlock()
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
			// Start from what the route runs, not from a limit far above
			// it (a drain window of 256 while 8 are in flight).
			inUse, _ := r.window.InUse()
			c = float64(max(1, min(r.window.Limit(), inUse, r.capBound())))
		}
		k := r.cfg.Overload.Criticality & 3
		r.resCapF = max(1, c*max(capShrink[k], 1-capGive[k]*(1-resourceAim/p)))
		r.c.resourceCuts.Add(1)
	case p < resourceResume && r.resCapF > 0:
		r.resCapF *= min(resourceGrow, 1+(resourceAim/max(p, 0.01)-1)/2)
		if r.resCapF >= float64(min(r.baseLimit, 2*r.capBound())) {
			r.resCapF, r.resCarry, r.resCap = 0, 0, 0
			r.setLimitLocked(r.baseLimit)
			return
		}
	case r.resCapF == 0:
		return
	}
	// Dither: the whole part, plus one whenever the carried fractions
	// add up to one.
	whole := math.Floor(r.resCapF)
	r.resCarry += r.resCapF - whole
	r.resCap = int(whole)
	if r.resCarry >= 1 {
		r.resCarry--
		r.resCap++
	}
	r.setLimitLocked(r.baseLimit)
}

// capBound is the most a resource cap can bind: the workers, on a route
// whose window counts messages (more in flight only wait); the window's
// limit on one that counts cost units.
func (r *route) capBound() int {
	if r.cfg.Window.Cost.Enabled() {
		return max(1, r.baseLimit)
	}
	return max(1, r.cfg.Workers)
}

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
