package backpressure

import (
	"fmt"
	"sync"
	"time"
)

// RetryBudgetOptions configure NewRetryBudget. The zero value is the
// default: 10% of first attempts over 10 s, but at least 5 retries.
type RetryBudgetOptions struct {
	// Ratio is the most retries allowed per first attempt within the
	// window. 0 means 0.1 (10%, SRE "Handling Overload"). Valid: 0 to 1.
	Ratio float64
	// MinRetries is a floor on the retries allowed per window, so a quiet
	// route can still retry an occasional failure: the budget is
	// max(MinRetries, Ratio × first attempts). 0 means 5; negative means
	// none.
	MinRetries int
	// Window is how far back attempts count. 0 means 10 s. It is kept in
	// 10 buckets, so it slides in steps of a tenth.
	Window time.Duration
}

// RetryBudget caps retries to a fraction of first attempts over a sliding
// window, so that when a downstream fails for everyone, retries add at most
// Ratio (10%) to its load instead of multiplying it by the attempt count.
//
// Record every first attempt with Attempt; ask Retry before each retry. A
// refused retry is counted in Exhausted and the caller must not retry: the
// consumer dead-letters such a message (class "retry-budget") or naks it
// with its longest backoff. One budget may be shared by several routes or
// calls: pass the same *RetryBudget.
//
// A RetryBudget is safe for concurrent use. Methods ending in At take the
// time, for tests; the others read the system clock.
type RetryBudget struct {
	ratio float64
	min   float64

	mu        sync.Mutex
	r         ring // a: first attempts, b: retries
	exhausted uint64
}

// NewRetryBudget returns a budget; a bad option wraps ErrInvalidOption.
func NewRetryBudget(o RetryBudgetOptions) (*RetryBudget, error) {
	switch {
	case !(o.Ratio >= 0 && o.Ratio <= 1): // NaN too
		return nil, fmt.Errorf("%w: retry budget ratio %v not in [0,1]", ErrInvalidOption, o.Ratio)
	case o.Window < 0:
		return nil, fmt.Errorf("%w: retry budget window %v is negative", ErrInvalidOption, o.Window)
	}
	if o.Ratio == 0 {
		o.Ratio = 0.1
	}
	if o.Window == 0 {
		o.Window = 10 * time.Second
	}
	switch {
	case o.MinRetries == 0:
		o.MinRetries = 5
	case o.MinRetries < 0:
		o.MinRetries = 0
	}
	return &RetryBudget{ratio: o.Ratio, min: float64(o.MinRetries), r: newRing(o.Window, 10)}, nil
}

// AttemptAt records a first attempt (not a retry) at now.
func (b *RetryBudget) AttemptAt(now time.Time) {
	b.mu.Lock()
	b.r.at(now).a++
	b.mu.Unlock()
}

// Attempt is AttemptAt(time.Now()).
func (b *RetryBudget) Attempt() { b.AttemptAt(time.Now()) }

// RetryAt reports whether one retry fits the budget at now and, if so,
// records it. It fits while retries in the window stay within
// max(MinRetries, Ratio × first attempts).
func (b *RetryBudget) RetryAt(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	first, retries := b.r.sums(now)
	if retries+1 > max(b.ratio*first, b.min) {
		b.exhausted++
		return false
	}
	b.r.at(now).b++
	return true
}

// Retry is RetryAt(time.Now()).
func (b *RetryBudget) Retry() bool { return b.RetryAt(time.Now()) }

// Exhausted reports how many retries the budget has refused.
func (b *RetryBudget) Exhausted() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.exhausted
}

// UsageAt reports first attempts and retries inside the window at now.
func (b *RetryBudget) UsageAt(now time.Time) (firstAttempts, retries uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	f, r := b.r.sums(now)
	return uint64(f), uint64(r)
}
