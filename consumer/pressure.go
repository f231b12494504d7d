package consumer

import (
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/backpressure"
)

// slack keeps, for the pressure gauge, an exponentially weighted mean of
// the time fetched messages had left before their deadline. Only the fetch
// loop writes it.
type slack struct{ ns atomic.Int64 }

// observe folds in one fetched message's time left (weight 1/16).
func (s *slack) observe(left time.Duration) {
	old := s.ns.Load()
	if old == 0 {
		s.ns.Store(int64(max(left, 1)))
		return
	}
	s.ns.Store(max(old+(int64(left)-old)/16, 1))
}

func (s *slack) load() time.Duration { return time.Duration(s.ns.Load()) }

// pressureSignals are the route's raw overload signals for its gauge.
func (r *route) pressureSignals() backpressure.PressureSignals {
	inUse, _ := r.window.InUse()
	s := backpressure.PressureSignals{
		InUse: inUse, Limit: r.window.Limit(),
		Fetched: r.c.fetched.Load(),
		Dropped: r.c.settled[OutcomeExpired].Load() + r.c.settled[OutcomeShed].Load(),
	}
	if t := r.cfg.Overload.Throttle; t != nil {
		s.Throttle = t.Probability()
	}
	if r.resource != nil {
		s.Resource = r.resource.Pressure()
	}
	if r.pred != nil {
		if mean, _, ok := r.pred.lat.estimate(); ok {
			s.QueueWait = mean * time.Duration(r.queue.len()) / time.Duration(r.cfg.Workers)
		}
		s.Slack = r.slack.load()
	}
	return s
}
