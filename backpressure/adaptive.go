package backpressure

import (
	"fmt"
	"sync"
	"time"
)

// Result is what an AdaptiveLimit is told about one finished call.
type Result int8

const (
	// ResultOK is a success.
	ResultOK Result = iota
	// ResultFailed is an ordinary error.
	ResultFailed
	// ResultOverloaded is an error marked "overloaded, do not retry": the
	// downstream said it has no capacity. It always shrinks the limit.
	ResultOverloaded
)

// AdaptiveLimitOptions configure NewAdaptiveLimit. Max is required.
type AdaptiveLimitOptions struct {
	// Min and Max bound the limit. Min 0 means 1; Max must be >= Min.
	Min, Max int
	// Initial is the starting limit. 0 means Max.
	Initial int
	// Target is the mean latency the limit aims for. 0 means learned: twice
	// the lowest interval mean seen so far (the latency of an unloaded
	// downstream, with room for some queueing).
	Target time.Duration
	// Tolerance is the hysteresis band below Target, as a fraction: the
	// limit grows only while the mean stays under Target×(1−Tolerance),
	// and shrinks only when it exceeds Target. 0 means 0.1.
	Tolerance float64
	// Interval is how often the limit may change. 0 means 1 s. An interval
	// with fewer than MinSamples results makes no decision and carries its
	// results into the next one.
	Interval time.Duration
	// MinSamples is the least results an interval needs. 0 means 10.
	MinSamples int
	// Increase is added per good interval (additive increase). 0 means 1.
	Increase int
	// Backoff multiplies the limit on a bad interval (multiplicative
	// decrease). 0 means 0.8. Valid: (0, 1).
	Backoff float64
	// Cooldown is how many intervals after a decrease the limit holds
	// before it may grow again, so it does not flap. 0 means 1; negative
	// means none. A larger value for low-criticality routes makes them
	// ramp back last after an overload.
	Cooldown int
}

// AdaptiveLimit is an AIMD concurrency limit driven by latency and errors:
// each Interval it compares the mean latency of the results it observed to
// Target. Above Target, or with any overloaded result, or with half or more
// of the results failed, the limit is multiplied by Backoff; below
// Target×(1−Tolerance) it grows by Increase; in between it holds. So a route
// finds the concurrency its downstream sustains, shrinks when the
// downstream slows, and ramps back gradually (additively) when it recovers.
//
// The consumer applies it to a route's window (consumer.OverloadPolicy.AdaptiveLimit);
// it can equally limit any pool. It is safe for concurrent use; ObserveAt
// takes the time, for tests.
type AdaptiveLimit struct {
	o AdaptiveLimitOptions

	mu       sync.Mutex
	limit    int
	start    time.Time
	n        int
	sum      time.Duration
	failed   int
	overload int
	hold     int
	baseline time.Duration
	changes  uint64
}

// NewAdaptiveLimit validates o; errors wrap ErrInvalidOption.
func NewAdaptiveLimit(o AdaptiveLimitOptions) (*AdaptiveLimit, error) {
	if o.Min == 0 {
		o.Min = 1
	}
	if o.Tolerance == 0 {
		o.Tolerance = 0.1
	}
	if o.Interval == 0 {
		o.Interval = time.Second
	}
	if o.MinSamples == 0 {
		o.MinSamples = 10
	}
	if o.Increase == 0 {
		o.Increase = 1
	}
	if o.Backoff == 0 {
		o.Backoff = 0.8
	}
	switch {
	case o.Cooldown == 0:
		o.Cooldown = 1
	case o.Cooldown < 0:
		o.Cooldown = 0
	}
	if o.Initial == 0 {
		o.Initial = o.Max
	}
	switch {
	case o.Min < 1 || o.Max < o.Min:
		return nil, fmt.Errorf("%w: adaptive limit bounds %d..%d", ErrInvalidOption, o.Min, o.Max)
	case o.Initial < o.Min || o.Initial > o.Max:
		return nil, fmt.Errorf("%w: adaptive initial %d outside %d..%d", ErrInvalidOption, o.Initial, o.Min, o.Max)
	case o.Target < 0 || o.Interval < 0 || o.MinSamples < 0 || o.Increase < 0:
		return nil, fmt.Errorf("%w: adaptive limit: negative option", ErrInvalidOption)
	case !(o.Tolerance >= 0 && o.Tolerance < 1) || !(o.Backoff > 0 && o.Backoff < 1): // NaN too
		return nil, fmt.Errorf("%w: adaptive tolerance %v / backoff %v", ErrInvalidOption, o.Tolerance, o.Backoff)
	}
	return &AdaptiveLimit{o: o, limit: o.Initial}, nil
}

// Limit returns the limit in force.
func (a *AdaptiveLimit) Limit() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.limit
}

// Bounds returns Min and Max.
func (a *AdaptiveLimit) Bounds() (lo, hi int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.o.Min, a.o.Max
}

// CapMax lowers Max to n (never below Min) and the limit in force with it,
// and returns the limit in force. A larger n changes nothing. The consumer
// calls it with a route's Window.Messages, so the multiplicative decrease works
// on the window's real size: a limit left above the window would have to
// shrink for many intervals before the window saw any change.
func (a *AdaptiveLimit) CapMax(n int) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if n < a.o.Max {
		a.o.Max = max(n, a.o.Min)
		a.limit = min(a.limit, a.o.Max)
	}
	return a.limit
}

// Changes reports how often the limit has moved: a flap counter.
func (a *AdaptiveLimit) Changes() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.changes
}

// ObserveAt records one call that finished at now after latency with
// result r, and returns the limit in force afterwards.
func (a *AdaptiveLimit) ObserveAt(now time.Time, latency time.Duration, r Result) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.start.IsZero() {
		a.start = now
	}
	a.n++
	a.sum += latency
	switch r {
	case ResultFailed:
		a.failed++
	case ResultOverloaded:
		a.overload++
	}
	if now.Sub(a.start) < a.o.Interval || a.n < a.o.MinSamples {
		return a.limit
	}
	mean := a.sum / time.Duration(a.n)
	target := a.o.Target
	if target == 0 {
		if a.baseline == 0 || mean < a.baseline {
			a.baseline = mean
		}
		target = 2 * a.baseline
	}
	old := a.limit
	switch {
	case a.overload > 0 || 2*a.failed >= a.n || mean > target:
		a.limit = max(a.o.Min, int(float64(a.limit)*a.o.Backoff))
		a.hold = a.o.Cooldown
	case a.hold > 0:
		a.hold--
	case float64(mean) < float64(target)*(1-a.o.Tolerance):
		a.limit = min(a.o.Max, a.limit+a.o.Increase)
	}
	if a.limit != old {
		a.changes++
	}
	a.start, a.n, a.sum, a.failed, a.overload = now, 0, 0, 0, 0
	return a.limit
}

// Observe is ObserveAt(time.Now(), latency, r).
func (a *AdaptiveLimit) Observe(latency time.Duration, r Result) int {
	return a.ObserveAt(time.Now(), latency, r)
}
