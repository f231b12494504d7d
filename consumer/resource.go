package consumer

import (
	"context"
	"math"
	"time"

	"github.com/sluice-go/sluice/backpressure"
)

// The resource cap. With Options.Resource, every resourceEvery each route
// compares the process's resource pressure with its target: above it
// (pressure 1 or more) the route lowers the cap on its window's message
// limit, multiplicatively, the more the further over the target and the
// lower its class (capShrink), so sheddable routes give way first; below
// resourceResume of the target it raises the cap by a tenth (at least a
// quarter of a message) per interval until the cap no longer binds. The
// messages a route does not take in wait in the broker (and expire there
// when they can no longer make their deadline), so a CPU-bound handler
// that competes with the broker client and the GC runs with only as much
// concurrency as the process's target allows.
//
// The cap is fractional: a route with only a few messages in flight on a
// few cores needs, say, 1.6 of them on average, which no whole number
// gives (on 2 cores an integer cap swung between 2 and 1, 100% and 50% of
// the cores, and held 62% for a target of 80%). Each interval applies the
// whole part or one more, carrying the fraction over (first-order
// sigma-delta), so the window's mean limit is the cap.

const (
	resourceEvery  = 250 * time.Millisecond
	resourceResume = 0.9
	// resourceFull is how far over the target a cut takes the whole of
	// the class's capShrink; a smaller excess takes part of it.
	resourceFull = 0.25
)

// capShrink is the cap's multiplicative decrease per interval well over
// the target, by criticality.
var capShrink = [4]float64{0.5, 0.7, 0.8, 0.9}

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
		// While a cap binds, decide on the pressure's mean over about a
		// second: the dithered limit moves it from one sample to the next.
		r.resP += (p - r.resP) / 4
		p = r.resP
	} else {
		r.resP = p
	}
	switch {
	case p >= 1:
		c := r.resCapF
		if c == 0 {
			// Start from what the route holds, not a limit far above it
			// (a drain window of 256 while 8 are in flight).
			inUse, _ := r.window.InUse()
			c = float64(max(1, min(r.window.Limit(), inUse)))
		}
		part := min(1, 0.2+(p-1)/resourceFull)
		r.resCapF = max(1, c*(1-part*(1-capShrink[r.cfg.Overload.Criticality&3])))
		r.c.resourceCuts.Add(1)
	case p < resourceResume && r.resCapF > 0:
		r.resCapF += max(0.25, r.resCapF/10)
		if r.resCapF >= float64(r.baseLimit) {
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
