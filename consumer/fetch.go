package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
)

// fetchLoop is a route's blocking pull: it waits until the window has room,
// asks the Source for at most what is free, and admits what arrives. It
// returns nil when ctx ends, or the Source's ErrClosed.
func (r *route) fetchLoop(ctx context.Context) error {
	errDelay := 10 * time.Millisecond
	throttle := r.cfg.Overload.Throttle
	for {
		// WaitFreeAtLeast returns at once while the window has room, and a
		// Source may hand over queued messages without looking at ctx: check
		// it here, or a shutdown with a backlog could fetch and return the
		// same messages forever.
		if ctx.Err() != nil {
			return nil
		}
		n, b, err := r.window.WaitFreeAtLeast(ctx, r.fetchMin())
		if err != nil {
			return nil
		}
		n = min(n, r.cfg.Window.MaxBatch)
		var offered, k int
		if throttle != nil {
			offered = n
			if k = throttle.DrawAt(time.Now(), n); k == 0 {
				// Nothing admitted: count the refusal at the demand the
				// last fetch showed, then wait.
				d := float64(n) * r.fill
				throttle.CountAt(time.Now(), d, d, 0)
				r.c.throttled.Add(uint64(d + 0.5))
				r.throttled += r.cfg.Overload.ThrottleWait
				if !pause(ctx, r.cfg.Overload.ThrottleWait) {
					return nil
				}
				continue
			}
			n = k
		}
		msgs, err := r.cfg.Source.Fetch(ctx, n, b)
		if throttle != nil {
			// Offered slots are not all demand: a fetch that came back
			// short shows the source had less, so scale the count by the
			// fill (a full fetch: every offered slot was a real request).
			r.fill = float64(len(msgs)) / float64(k)
			d := float64(offered) * r.fill
			throttle.CountAt(time.Now(), d, d-float64(len(msgs)), 0)
			if k < offered {
				r.c.throttled.Add(uint64(d - float64(len(msgs)) + 0.5))
				if err == nil {
					if len(msgs) > 0 {
						r.admitBatch(ctx, msgs, n)
					}
					r.throttled += r.cfg.Overload.ThrottleWait
					if !pause(ctx, r.cfg.Overload.ThrottleWait) {
						return nil
					}
					continue
				}
			}
		}
		if len(msgs) > 0 {
			r.admitBatch(ctx, msgs, n)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ErrClosed) {
				return fmt.Errorf("route %q: %w", r.cfg.Name, err)
			}
			r.c.fetchErrors.Add(1)
			r.noteError("fetch", err)
			if !pause(ctx, errDelay) {
				return nil
			}
			errDelay = min(errDelay*2, time.Second)
			continue
		}
		errDelay = 10 * time.Millisecond
	}
}

// pause waits d and reports false when ctx ended first.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// admitBatch admits msgs, fetched when asked were asked for, and lets a
// window that finds its size adjust to how many of them were dropped at
// once and whether the workers ran dry.
func (r *route) admitBatch(ctx context.Context, msgs []*Message, asked int) {
	dropped := r.admit(ctx, msgs)
	if r.drain.on {
		old := r.drain.limit
		if l := r.drain.observe(time.Now(), len(msgs), asked, dropped, r.queue.ranDry); l != old {
			r.setLimit(l)
		}
	}
}

// admit takes a fetched batch into the route: each message is counted and
// held (kept alive) at once, then charged to the window, checked against
// its deadline, and queued for a worker. Each clock is read once for the
// batch: the injectable one for deadline decisions, the real one for
// holding time (keep-alive ticks and the oldest-age stat run on real time,
// whatever clock the deadlines use).
// It returns how many it settled at once instead of queueing them.
func (r *route) admit(ctx context.Context, msgs []*Message) int {
	now := r.clock.Now()
	held := time.Now()
	r.c.fetched.Add(uint64(len(msgs)))
	if r.hook != nil {
		r.noteFetch()
	}
	for _, m := range msgs {
		r.hold(m, held)
	}
	// Predictive expiry: the first message with a deadline plans the batch
	// (when each queue position is expected to start); each message queued
	// goes behind the units queued before it (FIFO) or first (LIFO).
	var pl plan
	planned, pos := false, 0
	var target time.Duration
	standing := false
	var enqueued, shed, timed, timedDropped int
	for _, m := range msgs {
		if msgState(m.state.Load()) != stateHeld {
			continue // abandoned by a shutdown that could not wait for us
		}
		if ctx.Err() != nil {
			r.handBack(m) // shutting down: hand it straight back
			continue
		}
		size := m.cost()
		if size > r.cfg.Window.Bytes && r.cfg.DeadLetter.OnOversize == OversizeDeadLetter || !r.window.Admissible(size) {
			r.toSink(m, dlq.ClassOversize, fmt.Errorf("%w: %d bytes", ErrOversize, size), now, OutcomeDeadLettered)
			continue
		}
		units := r.unitsOf(m)
		if !r.window.TryAcquire(units, size) {
			// The source returned more than was free (or another route took
			// shared budget meanwhile): wait. An oversized message waits
			// here until the window is empty.
			if err := r.window.Acquire(ctx, units, size); err != nil {
				r.handBack(m)
				continue
			}
		}
		m.charged.Store(size)
		if r.expiryOn {
			r.computeDeadline(m)
			if expiry.Expired(m.deadline, now) {
				r.expire(m, now)
				timed++
				timedDropped++
				continue
			}
			if d := r.cfg.Overload.ShedNearDeadline; d > 0 && r.order == nil && !m.deadline.IsZero() && m.deadline.Sub(now) < d {
				r.shed(m, ShedNearDeadline)
				continue
			}
			if r.pred != nil && !m.deadline.IsZero() {
				r.slack.observe(m.deadline.Sub(now))
				if !planned {
					planned, pl = true, r.pred.plan(now)
					if r.cfg.Overload.Queue.Order == QueueFIFO {
						pos = r.queue.load()
					}
					if r.fresh.on {
						if run, ok := r.freshRun(pl); ok {
							if pl.ok {
								run = pl.high // a message's p99, as the target promises
							}
							target = r.fresh.targetFor(run)
							standing = r.fresh.decide(now, target)
						}
					}
				}
				timed++
				if pl.lateAt(now, m.deadline, pos, units) {
					r.expireEarly(m, now)
					timedDropped++
					continue
				}
				// Past this moment it could not finish in time (before the
				// route has learned its handler: past its deadline): the
				// reaper settles it if it is still queued then.
				m.startBy = m.deadline.UnixNano()
				if run, ok := r.freshRun(pl); ok {
					if pl.ok {
						run = runTime(pl.mean, pl.high, units)
						m.startBy = m.deadline.Add(-run).UnixNano()
					}
					if r.fresh.on {
						by := freshBy(birth(m, now), m.deadline, r.fresh.target, run)
						m.freshAt = by.Add(-run).UnixNano()
						r.fresh.allow = by.Sub(time.Unix(0, birth(m, now))) - run
						// A standing queue: only what can finish fresh
						// (fresh.go) is admitted, and it is reaped as
						// stale once it no longer can.
						if standing && (pl.ok && pl.lateAt(now, by, pos, units) || !pl.ok && now.Add(run).After(by)) {
							r.expireStale(m, now)
							timedDropped++
							continue
						}
						if standing && m.freshAt < m.startBy {
							m.startBy, m.stale = m.freshAt, true
						}
					}
				}
			}
		}
		if r.cfg.Overload.Queue.Order == QueueFIFO {
			pos += units
		}
		enqueued++
		shed += r.enqueue(ctx, m)
	}
	if r.fresh.on {
		r.fresh.counted(timed, timedDropped)
	}
	// What was not queued, and what the queue shed to make room, was
	// settled at once.
	return len(msgs) - enqueued + shed
}

// hold makes m the route's: counted, in the held set (so it is kept alive
// whatever it waits for), with its class.
func (r *route) hold(m *Message, now time.Time) {
	if m.acker == nil {
		panic("consumer: a Source returned a Message not built with NewMessage or InitMessage")
	}
	m.route = r
	m.fetchedAt = now
	m.touched.Store(now.UnixNano())
	m.charged.Store(-1)
	if m.Attempt < 1 {
		m.Attempt = 1
	}
	m.crit = r.cfg.Overload.Criticality
	if v, ok := m.Headers.Lookup(CriticalityHeader); ok {
		if c, err := backpressure.ParseCriticality(v); err == nil {
			m.crit = c.Cap(r.cfg.Overload.Criticality)
		} else {
			r.c.badCrit.Add(1)
		}
	}
	if r.hook != nil {
		r.holdHook(m)
	}
	if !m.state.CompareAndSwap(int32(stateNew), int32(stateHeld)) {
		panic("consumer: a Source returned the same Message twice")
	}
	r.held.add(m)
}

func (r *route) computeDeadline(m *Message) {
	var hv string
	var has bool
	if r.header != "" {
		hv, has = m.Headers.Lookup(r.header)
	}
	d, err := r.cfg.Expiry.Deadline(hv, has, m.PublishedAt)
	if err != nil {
		r.c.malformed.Add(1)
	}
	m.deadline = d
}

// giveBack hands a message that has not run back to the broker on
// shutdown: a Nak without delay, except on the broker's last delivery,
// where a Nak would drop it: it is dead-lettered instead (ClassShutdown),
// or, when it cannot be (no sink, the settlement deadline passed, or the
// write fails past the grace), left unsettled.
//
// On an ordered route that is stopping it first waits until the fetch loop
// returned: a message handed back may be redelivered to a fetch still in
// flight, and the fetch loop hands that redelivery back again; had a worker
// meanwhile handed back the key's next message, the broker would hold the
// two in the wrong order. The fetch loop itself calls handBack.
func (r *route) giveBack(m *Message) {
	if r.order != nil && r.stopping.Load() {
		<-r.fetchGone
	}
	r.handBack(m)
}

// handBack is giveBack without the wait, for the fetch loop.
func (r *route) handBack(m *Message) {
	if r.order != nil && r.order.deferGiveBack(m) {
		return // handed back after the earlier messages of its key (order.go)
	}
	if r.lastDelivery(m) {
		if r.cfg.DeadLetter.Sink != nil && r.settleCtx.Err() == nil {
			r.toSink(m, ClassShutdown, errShutdown, r.clock.Now(), OutcomeDeadLettered)
			return
		}
		r.settle(m, abandon)
		return
	}
	r.settle(m, nak(OutcomeReturned, 0))
}

// runsAtShutdown reports whether a worker runs m although the route is
// stopping: a last delivery (which cannot be handed back) is run within
// the grace on an Unordered route. On an ordered route its key's earlier
// messages may have been handed back already, so it is dead-lettered.
func (r *route) runsAtShutdown(m *Message) bool {
	return r.order == nil && r.lastDelivery(m) && r.handlerCtx.Err() == nil
}

// lastDelivery reports whether the broker will not redeliver m after a Nak.
func (r *route) lastDelivery(m *Message) bool {
	return r.maxDeliver > 0 && m.Attempt-m.retries >= r.maxDeliver
}
