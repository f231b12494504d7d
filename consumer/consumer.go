package consumer

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
)

// CriticalityHeader is the header through which a producer may lower a
// message's class below its route's (never raise it).
const CriticalityHeader = backpressure.CriticalityHeader

// Consumer runs routes. Create it with New, then call Run once.
type Consumer struct {
	routes  []*route
	grace   time.Duration
	running atomic.Bool
}

type route struct {
	cfg   Route
	retry RetryPolicy
	// maxDeliver is the broker's delivery limit (DeliveryLimiter), 0 if none.
	maxDeliver int
	// timed: something reads handler latency (an Observer or a policy).
	timed     bool
	window    *backpressure.Window
	clock     Clock
	queue     chan *Message
	lq        *localQueue // instead of queue for LIFO or queue shedding
	held      inflight
	c         counters
	obs       RouteObserver
	maxBatch  int
	minFetch  int
	keepAlive time.Duration
	expiryOn  bool
	header    string
	stopping  atomic.Bool

	handlerCtx context.Context
	settleCtx  context.Context
	// classCtx[c] is handlerCtx carrying criticality c, built once per Run
	// so a handler inherits its message's class without an allocation.
	classCtx [4]context.Context
	limit    atomic.Int64 // cfg.AdaptiveLimit's value last applied to the window
	limitMu  sync.Mutex   // serializes applying cfg.AdaptiveLimit to the window
	fill     float64      // fetched / asked of the last throttled fetch (fetch loop only)

	failMu   sync.Mutex
	failures map[dlq.Origin]time.Time // first failure of messages being retried
}

// New validates opts and routes once and returns a Consumer. Every error
// wraps ErrInvalidOption.
func New(opts Options, routes ...Route) (*Consumer, error) {
	if len(routes) == 0 {
		return nil, fmt.Errorf("%w: no routes", ErrInvalidOption)
	}
	if opts.ShutdownGrace < 0 {
		return nil, fmt.Errorf("%w: ShutdownGrace %v is negative", ErrInvalidOption, opts.ShutdownGrace)
	}
	c := &Consumer{grace: opts.ShutdownGrace}
	if c.grace == 0 {
		c.grace = 10 * time.Second
	}
	clock := opts.Clock
	if clock == nil {
		clock = systemClock{}
	}
	seen := map[string]bool{}
	adaptive := map[*backpressure.AdaptiveLimit]string{}
	for i := range routes {
		cfg := routes[i]
		if err := cfg.validate(); err != nil {
			return nil, err
		}
		if seen[cfg.Name] {
			return nil, fmt.Errorf("%w: route name %q used twice", ErrInvalidOption, cfg.Name)
		}
		seen[cfg.Name] = true
		if al := cfg.AdaptiveLimit; al != nil {
			// One limit fed by two routes would size each window from the
			// other's latency, and CapMax below would cap it to the smaller.
			if other, ok := adaptive[al]; ok {
				return nil, fmt.Errorf("%w: routes %q and %q share one AdaptiveLimit; give each route its own", ErrInvalidOption, other, cfg.Name)
			}
			adaptive[al] = cfg.Name
		}
		w, err := backpressure.NewWindow(cfg.MaxInFlight, cfg.MaxInFlightBytes)
		if err != nil {
			return nil, err
		}
		if opts.Budget != nil {
			if err := opts.Budget.Attach(w, cfg.ReservedBytes, cfg.Criticality); err != nil {
				return nil, fmt.Errorf("route %q: %w", cfg.Name, err)
			}
		}
		retry := cfg.Retry.withDefaults()
		var maxDeliver int
		if dl, ok := cfg.Source.(DeliveryLimiter); ok && dl.MaxDeliver() > 0 {
			maxDeliver = dl.MaxDeliver()
			if retry.MaxAttempts > maxDeliver {
				return nil, fmt.Errorf("%w: route %q: Retry.MaxAttempts %d is above the broker's MaxDeliver %d: the last attempts would be dropped by the broker before they are dead-lettered",
					ErrInvalidOption, cfg.Name, retry.MaxAttempts, maxDeliver)
			}
		}
		r := &route{
			cfg: cfg, retry: retry, window: w, clock: clock, maxDeliver: maxDeliver,
			maxBatch: cfg.MaxBatch, expiryOn: cfg.Expiry.Enabled(), header: cfg.Expiry.HeaderName(),
			failures: map[dlq.Origin]time.Time{},
		}
		if cfg.QueueOrder != QueueFIFO || cfg.ShedQueueLength > 0 {
			r.lq = newLocalQueue(cfg.QueueOrder, cfg.Drop, cfg.ShedQueueLength, cfg.MaxInFlight)
		} else {
			r.queue = make(chan *Message, cfg.MaxInFlight)
		}
		r.fill = 1
		if cfg.AdaptiveLimit != nil {
			l := cfg.AdaptiveLimit.CapMax(cfg.MaxInFlight)
			w.SetLimit(l)
			r.limit.Store(int64(l))
		}
		if r.maxBatch == 0 || r.maxBatch > cfg.MaxInFlight {
			r.maxBatch = cfg.MaxInFlight
		}
		r.minFetch = cfg.MinFetch
		if r.minFetch == 0 {
			r.minFetch = max(1, r.maxBatch/4)
		}
		r.minFetch = min(r.minFetch, r.maxBatch)
		r.keepAlive = cfg.KeepAlive
		if r.keepAlive == 0 {
			if aw, ok := cfg.Source.(AckWaiter); ok && aw.AckWait() > 0 {
				r.keepAlive = aw.AckWait() / 3
			}
		}
		if opts.Observer != nil {
			r.obs = opts.Observer.ObserveRoute(r.info(), r.stats)
		}
		r.timed = r.obs != nil || cfg.RetryBudget != nil || cfg.Throttle != nil || cfg.AdaptiveLimit != nil
		c.routes = append(c.routes, r)
	}
	return c, nil
}

// Stats returns a snapshot of every route, in the order given to New.
func (c *Consumer) Stats() []RouteStats {
	out := make([]RouteStats, len(c.routes))
	for i, r := range c.routes {
		out[i] = r.stats()
	}
	return out
}

// Window returns the named route's window, for inspection, or nil.
func (c *Consumer) Window(route string) *backpressure.Window {
	for _, r := range c.routes {
		if r.cfg.Name == route {
			return r.window
		}
	}
	return nil
}

func (r *route) info() RouteInfo {
	return RouteInfo{Name: r.cfg.Name, Criticality: r.cfg.Criticality, Workers: r.cfg.Workers,
		MaxInFlight: r.cfg.MaxInFlight, MaxInFlightBytes: r.cfg.MaxInFlightBytes}
}

func (r *route) stats() RouteStats {
	s := RouteStats{RouteInfo: r.info()}
	s.Fetched = r.c.fetched.Load()
	for i := range s.Settled {
		s.Settled[i] = r.c.settled[i].Load()
	}
	s.Late = r.c.late.Load()
	s.HandlerErrors = r.c.handlerErrors.Load()
	s.Panics = r.c.panics.Load()
	s.MalformedDeadlines = r.c.malformed.Load()
	s.SettleErrors = r.c.settleErrors.Load()
	s.FetchErrors = r.c.fetchErrors.Load()
	s.KeepAlives = r.c.keepAlives.Load()
	s.InFlight, s.InFlightBytes = r.window.InUse()
	s.PeakInFlight, s.PeakInFlightBytes = r.window.Peak()
	s.Blocked = r.window.Blocked()
	s.OldestInFlight = r.held.oldest(time.Now())
	for i := range s.Shed {
		for j := range s.Shed[i] {
			s.Shed[i][j] = r.c.shed[i][j].Load()
		}
	}
	s.RetryBudgetExhausted = r.c.budgetOut.Load()
	if r.cfg.Throttle != nil {
		s.ThrottleProbability = r.cfg.Throttle.Probability()
	}
	s.ThrottleRefused = r.c.throttled.Load()
	s.WindowLimit = r.window.Limit()
	s.Adaptive = r.cfg.AdaptiveLimit != nil
	return s
}

// Run pulls and handles messages until ctx is done, then shuts down: it
// stops pulling, returns (naks) messages still queued, gives running
// handlers ShutdownGrace to finish, then cancels their contexts. It returns
// nil after a clean shutdown, the error of a Source that returned ErrClosed,
// or ErrStuckHandlers when handlers ignored cancellation (their messages are
// nak'd and Run returns; those goroutines end when the handlers do).
//
// Run owns every goroutine it starts: a fetch loop and Workers goroutines
// per route, and one keep-alive goroutine per route that needs it. It may be
// called once.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	runCtx, cancelRun := context.WithCancelCause(ctx)
	defer cancelRun(nil)
	handlerCtx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	settleCtx := context.WithoutCancel(ctx)
	aliveCtx, stopAlive := context.WithCancel(settleCtx)

	var workers, fetchers, alive sync.WaitGroup
	for _, r := range c.routes {
		r.handlerCtx, r.settleCtx = handlerCtx, settleCtx
		for c := range r.classCtx {
			r.classCtx[c] = backpressure.WithCriticality(handlerCtx, backpressure.Criticality(c))
		}
		fetchers.Add(1)
		go func() {
			defer fetchers.Done()
			defer r.closeQueue()
			if err := r.fetchLoop(runCtx); err != nil {
				cancelRun(err)
			}
		}()
		for range r.cfg.Workers {
			workers.Add(1)
			go func() {
				defer workers.Done()
				r.work()
			}()
		}
		if r.keepAlive > 0 {
			alive.Add(1)
			go func() {
				defer alive.Done()
				r.keepAliveLoop(aliveCtx)
			}()
		}
	}

	<-runCtx.Done()
	for _, r := range c.routes {
		r.stopping.Store(true)
	}
	fetchers.Wait()
	done := make(chan struct{})
	go func() { workers.Wait(); close(done) }()

	var err error
	if cause := context.Cause(runCtx); cause != nil && !errors.Is(cause, context.Canceled) && !errors.Is(cause, context.DeadlineExceeded) {
		err = cause
	}
	grace := time.NewTimer(c.grace)
	defer grace.Stop()
	select {
	case <-done:
	case <-grace.C:
		cancelHandlers()
		// Handlers that honour ctx return promptly now; give them a moment.
		t := time.NewTimer(min(c.grace, time.Second))
		select {
		case <-done:
		case <-t.C:
			stuck := 0
			for _, r := range c.routes {
				for _, m := range r.held.snapshot() {
					if r.settle(m, OutcomeReturned, func() error { return m.Acker.Nak(settleCtx, 0) }) {
						stuck++
					}
				}
			}
			err = errors.Join(err, fmt.Errorf("%w: %d messages returned", ErrStuckHandlers, stuck))
		}
		t.Stop()
	}
	stopAlive()
	alive.Wait()
	return err
}

func (r *route) fetchLoop(ctx context.Context) error {
	errDelay := 10 * time.Millisecond
	for {
		// WaitFreeAtLeast returns at once while the window has room, and a
		// Source may hand over queued messages without looking at ctx: check
		// it here, or a shutdown with a backlog could fetch and return the
		// same messages forever.
		if ctx.Err() != nil {
			return nil
		}
		n, b, err := r.window.WaitFreeAtLeast(ctx, r.minFetch)
		if err != nil {
			return nil
		}
		n = min(n, r.maxBatch)
		var offered, k int
		if r.cfg.Throttle != nil {
			offered = n
			if k = r.cfg.Throttle.DrawAt(time.Now(), n); k == 0 {
				// Nothing admitted: count the refusal at the demand the
				// last fetch showed, then wait.
				d := float64(n) * r.fill
				r.cfg.Throttle.CountAt(time.Now(), d, d, 0)
				r.c.throttled.Add(uint64(d + 0.5))
				if !r.pause(ctx, r.throttleWait()) {
					return nil
				}
				continue
			}
			n = k
		}
		msgs, err := r.cfg.Source.Fetch(ctx, n, b)
		if r.cfg.Throttle != nil {
			// Offered slots are not all demand: a fetch that came back
			// short shows the source had less, so scale the count by the
			// fill (a full fetch: every offered slot was a real request).
			r.fill = float64(len(msgs)) / float64(k)
			d := float64(offered) * r.fill
			r.cfg.Throttle.CountAt(time.Now(), d, d-float64(len(msgs)), 0)
			if k < offered {
				r.c.throttled.Add(uint64(d - float64(len(msgs)) + 0.5))
				if err == nil {
					if len(msgs) > 0 {
						r.admit(ctx, msgs)
					}
					if !r.pause(ctx, r.throttleWait()) {
						return nil
					}
					continue
				}
			}
		}
		if len(msgs) > 0 {
			r.admit(ctx, msgs)
		}
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, ErrClosed) {
				return fmt.Errorf("route %q: %w", r.cfg.Name, err)
			}
			r.c.fetchErrors.Add(1)
			t := time.NewTimer(errDelay)
			select {
			case <-ctx.Done():
				t.Stop()
				return nil
			case <-t.C:
			}
			errDelay = min(errDelay*2, time.Second)
			continue
		}
		errDelay = 10 * time.Millisecond
	}
}

// admit charges a fetched batch to the window and queues it. Each clock is
// read once for the batch: the injectable one for deadline decisions, the
// real one for holding time (keep-alive ticks and the oldest-age stat run on
// real time, whatever clock the deadlines use).
func (r *route) admit(ctx context.Context, msgs []*Message) {
	now := r.clock.Now()
	held := time.Now()
	r.c.fetched.Add(uint64(len(msgs)))
	for _, m := range msgs {
		m.route = r
		m.fetchedAt = held
		m.touched.Store(held.UnixNano())
		if m.Attempt < 1 {
			m.Attempt = 1
		}
		m.crit = r.cfg.Criticality
		if v, ok := m.Headers.Lookup(CriticalityHeader); ok {
			if c, err := backpressure.ParseCriticality(v); err == nil {
				m.crit = c.Cap(r.cfg.Criticality)
			}
		}
		size := m.cost()
		if ctx.Err() != nil {
			// Shutting down: hand it straight back without charging.
			r.settleUncharged(m, OutcomeReturned, func() error { return m.Acker.Nak(r.settleCtx, 0) })
			continue
		}
		if size > r.cfg.MaxInFlightBytes && r.cfg.OnOversize == OversizeDeadLetter {
			r.deadLetterUncharged(m, dlq.ClassOversize, ErrOversize, now)
			continue
		}
		if !r.window.TryAcquire(1, size) {
			// The source returned more than was free (or another route took
			// shared budget meanwhile): wait. An oversized message waits
			// here until the window is empty.
			if err := r.window.Acquire(ctx, 1, size); err != nil {
				r.settleUncharged(m, OutcomeReturned, func() error { return m.Acker.Nak(r.settleCtx, 0) })
				continue
			}
		}
		m.charged = size
		r.held.add(m)
		if r.expiryOn {
			r.computeDeadline(m)
			if expiry.Expired(m.deadline, now) {
				r.expire(m, now)
				continue
			}
			if r.cfg.ShedNearDeadline > 0 && !m.deadline.IsZero() && m.deadline.Sub(now) < r.cfg.ShedNearDeadline {
				r.shed(m, ShedNearDeadline)
				continue
			}
		}
		r.enqueue(m)
	}
}

func (r *route) enqueue(m *Message) {
	if r.lq == nil {
		r.queue <- m // never blocks: the window bounds the queue
		return
	}
	if v := r.lq.push(m); v != nil {
		r.shed(v, ShedQueueFull)
	}
}

func (r *route) closeQueue() {
	if r.lq != nil {
		r.lq.close()
		return
	}
	close(r.queue)
}

func (r *route) throttleWait() time.Duration {
	if r.cfg.ThrottleWait > 0 {
		return r.cfg.ThrottleWait
	}
	return 20 * time.Millisecond
}

// pause waits d and reports false when ctx ended first.
func (r *route) pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
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

func (r *route) work() {
	if r.lq != nil {
		for {
			m, ok := r.lq.pop()
			if !ok {
				return
			}
			r.run(m)
		}
	}
	for m := range r.queue {
		r.run(m)
	}
}

func (r *route) run(m *Message) {
	if r.stopping.Load() {
		r.settle(m, OutcomeReturned, func() error { return m.Acker.Nak(r.settleCtx, 0) })
		return
	}
	r.process(m)
}

func (r *route) process(m *Message) {
	ctx := r.classCtx[m.crit&3]
	if !m.deadline.IsZero() {
		now := r.clock.Now()
		if expiry.Expired(m.deadline, now) {
			r.expire(m, now)
			return
		}
		if r.cfg.ShedNearDeadline > 0 && r.cfg.Slots == nil && m.deadline.Sub(now) < r.cfg.ShedNearDeadline {
			r.shed(m, ShedNearDeadline)
			return
		}
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, m.deadline)
		defer cancel()
	}
	if r.cfg.Slots != nil {
		if !r.takeSlot(ctx, m) {
			return
		}
		defer r.cfg.Slots.Release()
	}
	if !r.timed {
		// Nobody reads the handler's latency: skip the two clock reads.
		r.finish(ctx, m, r.call(ctx, m))
		return
	}
	start := time.Now()
	if r.cfg.RetryBudget != nil && m.Attempt <= 1 {
		r.cfg.RetryBudget.AttemptAt(start)
	}
	err := r.call(ctx, m)
	latency := time.Since(start)
	if r.cfg.Throttle != nil || r.cfg.AdaptiveLimit != nil {
		r.feedback(start.Add(latency), latency, err)
	}
	outcome := r.finish(ctx, m, err)
	if r.obs != nil {
		r.obs.HandlerDone(outcome, latency)
	}
}

// takeSlot waits for a shared handler slot at m's class. When the wait ends
// without one, m is settled (expired past its deadline, returned on
// shutdown) and takeSlot reports false. A message picked with less than
// ShedNearDeadline left after the wait is shed.
func (r *route) takeSlot(ctx context.Context, m *Message) bool {
	if err := r.cfg.Slots.Acquire(ctx, m.crit); err != nil {
		now := r.clock.Now()
		if !m.deadline.IsZero() && !now.Before(m.deadline) || errors.Is(err, context.DeadlineExceeded) {
			r.expire(m, now)
		} else {
			r.settle(m, OutcomeReturned, func() error { return m.Acker.Nak(r.settleCtx, 0) })
		}
		return false
	}
	if r.stopping.Load() {
		// The slot came free after shutdown began: m never started, so it
		// is returned like any queued message instead of run.
		r.cfg.Slots.Release()
		r.settle(m, OutcomeReturned, func() error { return m.Acker.Nak(r.settleCtx, 0) })
		return false
	}
	if r.cfg.ShedNearDeadline > 0 && !m.deadline.IsZero() && m.deadline.Sub(r.clock.Now()) < r.cfg.ShedNearDeadline {
		r.cfg.Slots.Release()
		r.shed(m, ShedNearDeadline)
		return false
	}
	return true
}

// feedback tells the route's Throttle and AdaptiveLimit how a handler run
// went.
func (r *route) feedback(now time.Time, latency time.Duration, err error) {
	over := err != nil && IsOverloaded(err)
	if t := r.cfg.Throttle; t != nil && !over {
		t.RecordAt(now, true)
	}
	if a := r.cfg.AdaptiveLimit; a != nil {
		res := backpressure.ResultOK
		switch {
		case over:
			res = backpressure.ResultOverloaded
		case err != nil:
			res = backpressure.ResultFailed
		}
		if l := int64(a.ObserveAt(now, latency, res)); l != r.limit.Load() {
			// Workers observe concurrently: apply the limit in force now,
			// under a lock, so a worker holding an older value cannot put
			// the window back above (or below) what the limit says.
			r.limitMu.Lock()
			l = int64(a.Limit())
			r.limit.Store(l)
			r.window.SetLimit(int(l))
			r.limitMu.Unlock()
		}
	}
}

func (r *route) call(ctx context.Context, m *Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.c.panics.Add(1)
			err = fmt.Errorf("%w: %v\n%s", ErrPanic, p, debug.Stack())
		}
	}()
	return r.cfg.Handler(ctx, m)
}

// finish settles m from the handler's result and returns the outcome.
func (r *route) finish(ctx context.Context, m *Message, err error) Outcome {
	sctx := r.settleCtx
	if err == nil {
		if !m.deadline.IsZero() && r.clock.Now().After(m.deadline) {
			r.c.late.Add(1)
		}
		r.forget(m)
		r.settle(m, OutcomeSucceeded, func() error { return m.Acker.Ack(sctx) })
		return OutcomeSucceeded
	}
	r.c.handlerErrors.Add(1)
	now := r.clock.Now()
	switch {
	case !m.deadline.IsZero() && ctx.Err() != nil && now.After(m.deadline):
		// The work ran out of time; another attempt would be late too.
		r.expire(m, now)
		return OutcomeExpired
	case IsOverloaded(err):
		if (r.cfg.OnOverloaded == OverloadedDeadLetter || r.lastDelivery(m)) && r.cfg.DeadLetter != nil {
			return r.deadLetter(m, ClassOverloaded, err, now)
		}
		r.settle(m, OutcomeOverloaded, func() error { return m.Acker.Nak(sctx, r.retry.Backoff(m.Attempt)) })
		return OutcomeOverloaded
	case IsPermanent(err):
		return r.deadLetter(m, dlq.ClassPermanent, err, now)
	case m.Attempt >= r.retry.MaxAttempts:
		class := dlq.ClassExhausted
		if errors.Is(err, ErrPanic) {
			class = dlq.ClassPanic
		}
		return r.deadLetter(m, class, err, now)
	case r.cfg.RetryBudget != nil && !r.cfg.RetryBudget.Retry():
		r.c.budgetOut.Add(1)
		if r.cfg.DeadLetter != nil {
			return r.deadLetter(m, ClassRetryBudget, err, now)
		}
		r.rememberFailure(m, now)
		d := r.retry.MaxDelay
		r.settle(m, OutcomeRetried, func() error { return m.Acker.Nak(sctx, d) })
		return OutcomeRetried
	default:
		r.rememberFailure(m, now)
		r.settle(m, OutcomeRetried, func() error { return m.Acker.Nak(sctx, r.retry.Backoff(m.Attempt)) })
		return OutcomeRetried
	}
}

// lastDelivery reports whether the broker will not redeliver m after a Nak.
func (r *route) lastDelivery(m *Message) bool {
	return r.maxDeliver > 0 && m.Attempt >= r.maxDeliver
}

func (r *route) expire(m *Message, now time.Time) {
	sctx := r.settleCtx
	switch r.cfg.OnExpired {
	case ExpiredTerm:
		r.settle(m, OutcomeExpired, func() error { return m.Acker.Term(sctx, ErrExpired.Error()) })
	case ExpiredDeadLetter:
		if r.cfg.DeadLetter == nil {
			r.settle(m, OutcomeExpired, func() error { return m.Acker.Term(sctx, ErrExpired.Error()) })
			return
		}
		if !r.claim(m) {
			return // settled meanwhile (returned at shutdown)
		}
		if err := r.cfg.DeadLetter.Write(sctx, r.letter(m, "expired", ErrExpired, now)); err != nil {
			r.complete(m, OutcomeDLQFailed, func() error { return m.Acker.Nak(sctx, r.retry.Backoff(m.Attempt)) })
			return
		}
		r.complete(m, OutcomeExpired, func() error { return m.Acker.Term(sctx, ErrExpired.Error()) })
	default:
		r.settle(m, OutcomeExpired, func() error { return m.Acker.Ack(sctx) })
	}
}

// deadLetter writes m to the sink and terminates the original only once the
// sink confirmed it; a failed write naks it so nothing is lost.
func (r *route) deadLetter(m *Message, class string, cause error, now time.Time) Outcome {
	sctx := r.settleCtx
	reason := class + ": " + firstLine(cause.Error())
	if r.cfg.DeadLetter == nil {
		r.forget(m)
		r.settle(m, OutcomeTerminated, func() error { return m.Acker.Term(sctx, reason) })
		return OutcomeTerminated
	}
	if !r.claim(m) {
		return OutcomeReturned // settled meanwhile (returned at shutdown)
	}
	if err := r.cfg.DeadLetter.Write(sctx, r.letter(m, class, cause, now)); err != nil {
		r.complete(m, OutcomeDLQFailed, func() error { return m.Acker.Nak(sctx, r.retry.Backoff(m.Attempt)) })
		return OutcomeDLQFailed
	}
	r.forget(m)
	r.complete(m, OutcomeDeadLettered, func() error { return m.Acker.Term(sctx, reason) })
	return OutcomeDeadLettered
}

// deadLetterUncharged dead-letters a message that was counted but never
// charged to the window (oversize by policy). On a failed write it is nak'd.
func (r *route) deadLetterUncharged(m *Message, class string, cause error, now time.Time) {
	sctx := r.settleCtx
	reason := class + ": " + cause.Error()
	if r.cfg.DeadLetter == nil {
		r.settleUncharged(m, OutcomeTerminated, func() error { return m.Acker.Term(sctx, reason) })
		return
	}
	if err := r.cfg.DeadLetter.Write(sctx, r.letter(m, class, cause, now)); err != nil {
		r.settleUncharged(m, OutcomeDLQFailed, func() error { return m.Acker.Nak(sctx, r.retry.Backoff(m.Attempt)) })
		return
	}
	r.settleUncharged(m, OutcomeDeadLettered, func() error { return m.Acker.Term(sctx, reason) })
}

func (r *route) letter(m *Message, class string, cause error, now time.Time) *dlq.Letter {
	first := m.FirstFailure
	if first.IsZero() {
		r.failMu.Lock()
		first = r.failures[m.Origin]
		r.failMu.Unlock()
	}
	if first.IsZero() {
		first = now
	}
	o := m.Origin
	if o.Topic == "" {
		o.Topic = m.Topic
	}
	if o.Group == "" {
		o.Group = r.cfg.Group
	}
	return &dlq.Letter{Key: m.Key, Value: m.Value, Headers: m.Headers, Route: r.cfg.Name,
		Err: cause.Error(), Class: class, Attempts: m.Attempt, FirstFailure: first, LastFailure: now, Origin: o}
}

func (r *route) rememberFailure(m *Message, now time.Time) {
	if !m.FirstFailure.IsZero() {
		return
	}
	r.failMu.Lock()
	if len(r.failures) > 4*r.cfg.MaxInFlight+1024 {
		clear(r.failures) // bounded memory beats exact first-failure times
	}
	if _, ok := r.failures[m.Origin]; !ok {
		r.failures[m.Origin] = now
	}
	r.failMu.Unlock()
}

func (r *route) forget(m *Message) {
	if m.Attempt <= 1 && m.FirstFailure.IsZero() {
		return // never failed before: nothing remembered
	}
	r.failMu.Lock()
	delete(r.failures, m.Origin)
	r.failMu.Unlock()
}

// settle moves a charged message to its terminal state exactly once: it
// calls do (the broker settlement), then returns the window capacity. It
// reports whether this call was the one that settled m.
func (r *route) settle(m *Message, o Outcome, do func() error) bool {
	if !r.claim(m) {
		return false
	}
	r.complete(m, o, do)
	return true
}

// claim makes the caller the one that settles m, or reports false when m is
// already settled (or being settled). A settlement that must do work first
// (a dead-letter write) claims m before that work, so a message returned at
// shutdown while its handler was stuck is not dead-lettered as well when the
// handler finally returns.
func (r *route) claim(m *Message) bool { return m.settled.CompareAndSwap(false, true) }

// complete finishes the settlement of a claimed message: it calls do (the
// broker settlement), then returns the window capacity.
func (r *route) complete(m *Message, o Outcome, do func() error) {
	if do != nil {
		r.settleCall(do())
	}
	r.held.remove(m)
	r.window.Release(1, m.charged)
	r.c.settled[o].Add(1)
}

// settleUncharged settles a message that holds no window capacity.
func (r *route) settleUncharged(m *Message, o Outcome, do func() error) {
	m.settled.Store(true)
	if do != nil {
		r.settleCall(do())
	}
	r.c.settled[o].Add(1)
}

func (r *route) settleCall(err error) {
	if err != nil {
		r.c.settleErrors.Add(1)
	}
}

func (r *route) keepAliveLoop(ctx context.Context) {
	t := time.NewTicker(r.keepAlive)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			cut := now.Add(-r.keepAlive).UnixNano()
			for _, m := range r.held.snapshot() {
				if m.touched.Load() <= cut && !m.settled.Load() {
					if err := m.InProgress(ctx); err != nil {
						r.c.settleErrors.Add(1)
					} else {
						r.c.keepAlives.Add(1)
					}
				}
			}
		}
	}
}

func firstLine(s string) string {
	for i := 0; i < len(s); i++ {
		if s[i] == '\n' {
			return s[:i]
		}
	}
	return s
}
