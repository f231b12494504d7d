package dlq

import (
	"context"
	"math"
	"math/rand/v2"
	"time"

	"golang.org/x/time/rate"
)

// pacer spaces batches: a token bucket (x/time/rate) sets each batch's slot
// on the rate's grid, and a uniform random delay in [0, jitter) is added to
// a slot still ahead. The bucket holds 50 ms of letters (at least two
// batches), so a batch delayed by jitter, a slow publish or a short stall
// of the process does not push later slots back (the rate holds), while a
// catch-up burst stays below half of any 100 ms bucket. Not safe for
// concurrent use.
type pacer struct {
	lim    *rate.Limiter
	jit    time.Duration
	rnd    *rand.Rand
	paced  bool
	lastAt time.Time
}

// catchUp is how much lag the bucket absorbs.
const catchUp = 50 * time.Millisecond

func newPacer(perSecond float64, batch int, jitter time.Duration, rnd *rand.Rand, now time.Time) *pacer {
	p := &pacer{jit: jitter, rnd: rnd, paced: !math.IsInf(perSecond, 1)}
	if p.paced {
		burst := max(2*batch, int(math.Ceil(perSecond*catchUp.Seconds())))
		p.lim = rate.NewLimiter(rate.Limit(perSecond), burst)
		p.lim.ReserveN(now, burst-batch) // start with one batch ready, not a burst
	}
	return p
}

func (p *pacer) jitter() time.Duration {
	if p.jit <= 0 {
		return 0
	}
	return time.Duration(p.rnd.Int64N(int64(p.jit)))
}

// next reserves n letters at now and returns when their batch may go.
// Batches never go out of order.
func (p *pacer) next(now time.Time, n int) time.Time {
	at := now
	if p.paced {
		res := p.lim.ReserveN(now, n)
		if d := res.DelayFrom(now); res.OK() && d > 0 {
			// On the grid: the slot is ahead, jitter it. A batch that is
			// due already (the run is behind) goes at once: jitter there
			// would only add to the lag.
			at = now.Add(d).Add(p.jitter())
		}
	} else {
		at = at.Add(p.jitter())
	}
	if at.Before(p.lastAt) {
		at = p.lastAt
	}
	p.lastAt = at
	return at
}

func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
