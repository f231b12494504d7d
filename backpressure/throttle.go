package backpressure

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"
)

// ThrottleOptions configure NewThrottle. The zero value is the SRE default:
// K = 2 over a 2-minute window.
type ThrottleOptions struct {
	// K is how many requests per accepted one the client still sends: the
	// downstream sees at most about K × what it accepts. 0 means 2. Must be
	// >= 1 (1 is the most aggressive).
	K float64
	// Window is how long requests and accepts are remembered. 0 means
	// 2 minutes. It is kept in Buckets buckets.
	Window time.Duration
	// Buckets is the window's resolution. 0 means 60 (2 s each by default).
	Buckets int
	// Rand returns a uniform float in [0,1) for the reject draw. nil means
	// math/rand/v2; tests inject a seeded source.
	Rand func() float64
	// Rejected reports whether an error returned to Do means the
	// downstream refused the request (it did not accept it). nil means
	// IsOverloaded: errors marked "overloaded, do not retry".
	Rejected func(error) bool
}

// Throttle is client-side adaptive throttling (Google SRE, "Handling
// Overload"). It counts, over a sliding window, the requests the client
// wanted to send and the ones the downstream accepted, and rejects a new
// request locally with probability
//
//	max(0, (requests − K·accepts) / (requests + 1))
//
// Locally rejected requests are still counted as requests, so the longer a
// downstream refuses, the more the client holds back; because the +1 keeps
// the ratio below 1, some requests always get through and notice when the
// downstream recovers, after which the probability decays with the window
// without any reset.
//
// Wrap calls with Do, or call Allow before a request and Record after it.
// A consumer Route with a Throttle also uses it to pull less (see
// consumer.OverloadPolicy.Throttle). A Throttle is safe for concurrent use; methods
// ending in At take the time, for tests.
type Throttle struct {
	k        float64
	rnd      func() float64
	rejected func(error) bool

	mu      sync.Mutex
	r       ring // a: requests, b: accepts
	refused uint64
}

// NewThrottle returns a throttle; a bad option wraps ErrInvalidOption.
func NewThrottle(o ThrottleOptions) (*Throttle, error) {
	switch {
	case o.K != 0 && !(o.K >= 1): // NaN too: it would reject every request
		return nil, fmt.Errorf("%w: throttle K %v < 1", ErrInvalidOption, o.K)
	case o.Window < 0 || o.Buckets < 0:
		return nil, fmt.Errorf("%w: throttle window %v / buckets %d", ErrInvalidOption, o.Window, o.Buckets)
	}
	if o.K == 0 {
		o.K = 2
	}
	if o.Window == 0 {
		o.Window = 2 * time.Minute
	}
	if o.Buckets == 0 {
		o.Buckets = 60
	}
	if o.Rand == nil {
		o.Rand = rand.Float64
	}
	if o.Rejected == nil {
		o.Rejected = IsOverloaded
	}
	return &Throttle{k: o.K, rnd: o.Rand, rejected: o.Rejected, r: newRing(o.Window, o.Buckets)}, nil
}

func (t *Throttle) probLocked(now time.Time) float64 {
	req, acc := t.r.sums(now)
	p := (req - t.k*acc) / (req + 1)
	if p < 0 {
		return 0
	}
	return p
}

// ProbabilityAt returns the current local reject probability, in [0, 1).
func (t *Throttle) ProbabilityAt(now time.Time) float64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.probLocked(now)
}

// Probability is ProbabilityAt(time.Now()).
func (t *Throttle) Probability() float64 { return t.ProbabilityAt(time.Now()) }

// AllowAt counts one request at now and reports whether to send it (true)
// or reject it locally (false). A sent request must be followed by
// RecordAt with the downstream's verdict.
func (t *Throttle) AllowAt(now time.Time) bool { return t.AllowNAt(now, 1) == 1 }

// Allow is AllowAt(time.Now()).
func (t *Throttle) Allow() bool { return t.AllowAt(time.Now()) }

// AllowNAt counts n requests at now and returns how many of them to send,
// each drawn independently against the reject probability.
func (t *Throttle) AllowNAt(now time.Time, n int) int {
	if n <= 0 {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.probLocked(now)
	t.r.at(now).a += float64(n)
	if p == 0 {
		return n
	}
	ok := 0
	for range n {
		if t.rnd() >= p {
			ok++
		}
	}
	t.refused += uint64(n - ok)
	return ok
}

// DrawAt returns how many of n requests pass the current reject
// probability, drawn independently, without counting them. With CountAt it
// serves callers that admit in bulk and learn the real demand afterwards,
// like a consumer's pull (offered window slots are not all real requests).
func (t *Throttle) DrawAt(now time.Time, n int) int {
	if n <= 0 {
		return 0
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	p := t.probLocked(now)
	if p == 0 {
		return n
	}
	ok := 0
	for range n {
		if t.rnd() >= p {
			ok++
		}
	}
	return ok
}

// CountAt adds requests, of which refused were rejected locally, and
// accepts to the window at now, without a draw.
func (t *Throttle) CountAt(now time.Time, requests, refused, accepts float64) {
	t.mu.Lock()
	bk := t.r.at(now)
	bk.a += requests
	bk.b += accepts
	t.refused += uint64(refused + 0.5)
	t.mu.Unlock()
}

// RecordAt records the downstream's verdict on a request Allow let through:
// accepted is false when the downstream refused it (overloaded, throttled,
// out of quota). Only accepts change the counts.
func (t *Throttle) RecordAt(now time.Time, accepted bool) {
	if !accepted {
		return
	}
	t.mu.Lock()
	t.r.at(now).b++
	t.mu.Unlock()
}

// Record is RecordAt(time.Now(), accepted).
func (t *Throttle) Record(accepted bool) { t.RecordAt(time.Now(), accepted) }

// Do calls fn unless the throttle rejects the request locally, in which case
// it returns ErrThrottled (marked overloaded, so callers do not retry it).
// fn's error counts as a refusal when ThrottleOptions.Rejected says so.
func (t *Throttle) Do(ctx context.Context, fn func(context.Context) error) error {
	if !t.Allow() {
		return ErrThrottled
	}
	err := fn(ctx)
	t.Record(err == nil || !t.rejected(err))
	return err
}

// DoAt is Do with the request counted, and its verdict recorded, at now.
func (t *Throttle) DoAt(ctx context.Context, now time.Time, fn func(context.Context) error) error {
	if !t.AllowAt(now) {
		return ErrThrottled
	}
	err := fn(ctx)
	t.RecordAt(now, err == nil || !t.rejected(err))
	return err
}

// Refused reports how many requests were rejected locally so far.
func (t *Throttle) Refused() uint64 {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.refused
}

// CountsAt reports requests and accepts inside the window at now.
func (t *Throttle) CountsAt(now time.Time) (requests, accepts uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, a := t.r.sums(now)
	return uint64(r), uint64(a)
}
