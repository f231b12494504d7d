package drain

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
)

// ErrInvalidOption is returned by New for an option it cannot use.
var ErrInvalidOption = backpressure.ErrInvalidOption

// DefaultBatchInterval is the batch spacing Options.Burst is sized for.
const DefaultBatchInterval = 20 * time.Millisecond

// Options configure a Source.
type Options struct {
	// Rate is the most messages per second the route takes while draining.
	// Must be > 0; math.Inf(1) means unpaced (until SetRate).
	Rate float64
	// Burst caps one fetch. 0 means Rate × DefaultBatchInterval rounded up,
	// at least 1.
	Burst int
	// Jitter is the largest random delay added to each paced batch, so
	// several drained consumers do not fetch in step. 0 means one batch
	// interval (Burst/Rate); negative means none.
	Jitter time.Duration
	// CaughtUp ends the drain: once a fetched batch's oldest message was
	// published less than CaughtUp ago, pacing stops for good (call SetRate
	// to start again). 0 means the drain never ends by itself.
	CaughtUp time.Duration
}

// Source is a consumer.Source that paces Fetch. It is safe for the one
// fetch loop of a route plus concurrent SetRate and Draining calls.
//
// Fetch first asks the wrapped source for at most one batch, then holds the
// batch until the rate allows it. The batch is never dropped: if ctx ends
// while it waits, Fetch returns it at once (the route settles it as on any
// shutdown), so pacing cannot lose or strand a message.
type Source struct {
	inner consumer.Source
	opts  Options
	batch int
	jit   time.Duration

	mu       sync.Mutex
	lim      *rate.Limiter
	draining bool
	rnd      *rand.Rand
	lastAt   time.Time
}

var _ consumer.Source = (*Source)(nil)

// New wraps inner.
func New(inner consumer.Source, opts Options) (*Source, error) {
	if inner == nil {
		return nil, fmt.Errorf("%w: nil Source", ErrInvalidOption)
	}
	if !(opts.Rate > 0) {
		return nil, fmt.Errorf("%w: drain Rate %v messages/s, want > 0", ErrInvalidOption, opts.Rate)
	}
	if opts.Burst < 0 || opts.CaughtUp < 0 {
		return nil, fmt.Errorf("%w: drain Burst %d, CaughtUp %v", ErrInvalidOption, opts.Burst, opts.CaughtUp)
	}
	s := &Source{inner: inner, opts: opts, batch: opts.Burst, draining: true,
		rnd: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
	if s.batch == 0 {
		s.batch = 1
		if !math.IsInf(opts.Rate, 1) {
			s.batch = max(1, int(math.Ceil(opts.Rate*DefaultBatchInterval.Seconds())))
		} else {
			s.batch = math.MaxInt32
		}
	}
	s.jit = opts.Jitter
	if s.jit == 0 && !math.IsInf(opts.Rate, 1) {
		s.jit = time.Duration(float64(s.batch) / opts.Rate * float64(time.Second))
	}
	s.jit = max(s.jit, 0)
	s.lim = newLimiter(opts.Rate, s.batch, time.Now())
	return s, nil
}

func newLimiter(perSecond float64, batch int, now time.Time) *rate.Limiter {
	if math.IsInf(perSecond, 1) {
		return rate.NewLimiter(rate.Inf, 0)
	}
	lim := rate.NewLimiter(rate.Limit(perSecond), 2*batch)
	lim.ReserveN(now, batch) // one batch ready at the start, not two
	return lim
}

// Draining reports whether Fetch still paces.
func (s *Source) Draining() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.draining
}

// SetRate changes the pace (messages per second) and restarts the drain
// if it had ended; math.Inf(1) lifts the limit. Rates ≤ 0 are ignored.
func (s *Source) SetRate(perSecond float64) {
	if !(perSecond > 0) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.opts.Rate = perSecond
	s.lim = newLimiter(perSecond, s.batch, time.Now())
	s.draining = true
}

// Fetch implements consumer.Source.
func (s *Source) Fetch(ctx context.Context, maxMessages int, maxBytes int64) ([]*consumer.Message, error) {
	s.mu.Lock()
	draining := s.draining
	s.mu.Unlock()
	if !draining {
		return s.inner.Fetch(ctx, maxMessages, maxBytes)
	}
	msgs, err := s.inner.Fetch(ctx, min(maxMessages, s.batch), maxBytes)
	if err != nil || len(msgs) == 0 {
		return msgs, err
	}
	at, ok := s.schedule(time.Now(), msgs)
	if !ok {
		return msgs, nil
	}
	if d := time.Until(at); d > 0 {
		t := time.NewTimer(d)
		select {
		case <-t.C:
		case <-ctx.Done(): // hand the batch over anyway: it is the route's to settle
			t.Stop()
		}
	}
	return msgs, nil
}

// schedule decides, at now, when a fetched batch may be handed over; ok is
// false when the drain just ended (the batch is fresh) and it goes at once.
func (s *Source) schedule(now time.Time, msgs []*consumer.Message) (at time.Time, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.CaughtUp > 0 {
		oldest := time.Time{}
		for _, m := range msgs {
			if !m.PublishedAt.IsZero() && (oldest.IsZero() || m.PublishedAt.Before(oldest)) {
				oldest = m.PublishedAt
			}
		}
		if !oldest.IsZero() && now.Sub(oldest) < s.opts.CaughtUp {
			s.draining = false
			return now, false
		}
	}
	at = now
	if res := s.lim.ReserveN(now, len(msgs)); res.OK() {
		if d := res.DelayFrom(now); d > 0 {
			at = now.Add(d)
			if s.jit > 0 { // jitter a slot ahead; a batch due already goes at once
				at = at.Add(time.Duration(s.rnd.Int64N(int64(s.jit))))
			}
		}
	}
	if at.Before(s.lastAt) {
		at = s.lastAt
	}
	s.lastAt = at
	return at, true
}

// Attach implements consumer.Source by attaching the wrapped source: the
// route's limits reach it, and its description (ack deadline, delivery
// limit) reaches the route as it would unwrapped.
func (s *Source) Attach(l consumer.RouteLimits) (consumer.SourceInfo, error) {
	return s.inner.Attach(l)
}
