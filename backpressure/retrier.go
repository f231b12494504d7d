package backpressure

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"
)

// ErrRetriesExhausted is wrapped (together with ErrOverloaded) by the error
// Retrier.Do returns after its last attempt failed.
var ErrRetriesExhausted = errors.New("sluice: retries exhausted")

// ErrRetryBudget is wrapped (together with ErrOverloaded) by the error
// Retrier.Do returns when its RetryBudget refused a retry.
var ErrRetryBudget = errors.New("sluice: retry budget exhausted")

// Retrier retries a call to a downstream a bounded number of times, within
// an optional RetryBudget, and makes sure retries do not multiply across
// layers: when the call fails with an error marked "overloaded, do not
// retry", Do returns at once; and when Do gives up (attempts or budget
// spent) it returns the last error marked overloaded, so a Retrier one layer
// up does not retry again. Three nested layers of 3 attempts thus cost the
// bottom 3 attempts, not 27.
//
// The zero value retries up to 3 attempts with no budget and a full-jitter
// backoff from 10 ms doubling to at most 1 s. A Retrier is safe for
// concurrent use if its Budget is.
type Retrier struct {
	// MaxAttempts is the most calls Do makes, the first included. 0 (or
	// negative) means 3.
	MaxAttempts int
	// Budget, if set, must allow every retry (not the first attempt).
	Budget *RetryBudget
	// BaseDelay is the backoff ceiling before the second attempt, doubled
	// for each further one; the delay used is uniform in [0, ceiling].
	// 0 means 10 ms; negative means no delay.
	BaseDelay time.Duration
	// MaxDelay caps the ceiling. 0 means 1 s; negative means no delay.
	MaxDelay time.Duration
	// Retryable reports whether an error is worth another attempt. nil
	// means every error except overloaded ones and ctx errors.
	Retryable func(error) bool
	// Now reads the time for the Budget's decisions (AttemptAt, RetryAt),
	// for tests. nil means time.Now. Backoff delays are real time.
	Now func() time.Time
}

// Do calls fn until it succeeds, fails with a non-retryable error, runs out
// of attempts or budget, or ctx is done. It returns nil; fn's error as is
// when it is not retryable, already overloaded, or ctx ended before the
// next attempt; or fn's last error wrapped with ErrOverloaded and
// ErrRetriesExhausted or ErrRetryBudget.
func (r *Retrier) Do(ctx context.Context, fn func(context.Context) error) error {
	attempts := r.MaxAttempts
	if attempts <= 0 {
		attempts = 3
	}
	base, maxd := r.BaseDelay, r.MaxDelay
	if base == 0 {
		base = 10 * time.Millisecond
	}
	if maxd == 0 {
		maxd = time.Second
	}
	now := r.Now
	if now == nil {
		now = time.Now
	}
	if r.Budget != nil {
		r.Budget.AttemptAt(now())
	}
	var err error
	for i := 1; ; i++ {
		if err = fn(ctx); err == nil {
			return nil
		}
		if IsOverloaded(err) || !r.retryable(err) {
			return err
		}
		if ctx.Err() != nil {
			return err
		}
		if i >= attempts {
			return fmt.Errorf("%w: %w after %d attempts: %w", ErrOverloaded, ErrRetriesExhausted, i, err)
		}
		if r.Budget != nil && !r.Budget.RetryAt(now()) {
			return fmt.Errorf("%w: %w: %w", ErrOverloaded, ErrRetryBudget, err)
		}
		if base > 0 && maxd > 0 {
			d := base
			for j := 1; j < i && d < maxd; j++ {
				d *= 2
			}
			d = min(d, maxd)
			t := time.NewTimer(rand.N(d + 1))
			select {
			case <-ctx.Done():
				t.Stop()
				return err
			case <-t.C:
			}
		}
	}
}

func (r *Retrier) retryable(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if r.Retryable != nil {
		return r.Retryable(err)
	}
	return true
}
