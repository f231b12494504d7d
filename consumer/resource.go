package consumer

import (
	"context"
	"time"

	"github.com/sluice-go/sluice/backpressure"
)

// The resource cap. With Options.Resource, every resourceEvery each route
// compares the process's resource pressure with its target: above it
// (pressure 1 or more) the route lowers the cap on its window's message
// limit, multiplicatively and the more the lower its class (capShrink), so
// sheddable routes give way first; below resourceResume of the target it
// raises the cap by one per interval until the cap no longer binds. The
// messages a route does not take in wait in the broker (and expire there
// when they can no longer make their deadline), so a CPU-bound handler
// that competes with the broker client and the GC runs with only as much
// concurrency as the process's target allows.

const (
	resourceEvery  = 250 * time.Millisecond
	resourceResume = 0.9
)

// capShrink is the cap's multiplicative decrease per interval over the
// target, by criticality.
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
	switch {
	case p >= 1:
		c := r.resCap
		if c == 0 {
			c = r.window.Limit()
		}
		r.resCap = max(1, int(float64(c)*capShrink[r.cfg.Overload.Criticality&3]))
		r.c.resourceCuts.Add(1)
	case p < resourceResume && r.resCap > 0:
		r.resCap++
		if r.resCap >= r.baseLimit {
			r.resCap = 0
		}
	default:
		return
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
