package consumer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/backpressure"
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

// route is one Route at run time.
type route struct {
	cfg  Route // defaults applied
	info SourceInfo
	// retry is cfg.Retry; maxDeliver is info.MaxDeliver (0: unlimited).
	retry      RetryPolicy
	maxDeliver int
	// timed: something reads handler latency (an Observer or a policy).
	timed     bool
	window    *backpressure.Window
	clock     Clock
	queue     *queue
	order     *orderer // nil on an Unordered route
	batch     *batcher // nil on a route with a Handler
	held      inflight
	c         counters
	obs       RouteObserver
	keepAlive time.Duration
	expiryOn  bool
	header    string
	// pred is the route's predictive expiry, nil when it has no deadlines.
	pred *predictor
	// pressure is what PressureFrom tells the route's handlers; slack
	// feeds it.
	pressure *backpressure.PressureGauge
	slack    slack
	drain    drainWindow // fetch loop only
	fresh    freshness   // short queues under overload (fresh.go)
	costs    classCosts  // learned costs (Window.Cost.Class)
	stopping atomic.Bool
	// fetchGone is closed once the fetch loop returned (or Run gave up on
	// it): an ordered route's workers hand messages back only then (see
	// giveBack).
	fetchGone chan struct{}
	endFetch  func()
	log       errorLog
	health    routeHealth // health.go
	hooked                // Options.Hook for this route

	handlerCtx context.Context
	settleCtx  context.Context
	// classCtx[c] is handlerCtx carrying criticality c, built once per Run
	// so a handler inherits its message's class without an allocation.
	classCtx [4]context.Context
	limit    atomic.Int64 // the AdaptiveLimit value last applied to the window
	limitMu  sync.Mutex   // serializes setting the window's limit (see setLimit)
	// baseLimit is the limit the window or its controllers want, resCapF
	// the resource cap on the handlers running (0: none), resCap the whole
	// number of it applied this interval and resCarry the fraction carried to the next (see
	// resource.go); under limitMu.
	baseLimit int
	resCap    int
	resCapF   float64
	resCarry  float64
	resP      float64                     // the pressure's moving mean while a cap binds
	resource  backpressure.ResourceSignal // Options.Resource
	fill      float64                     // fetched / asked of the last throttled fetch (fetch loop only)

	failures failures // messages being retried or awaiting a dead letter (failures.go)

	letters letterRetrier // kept messages whose letters are retried (letters.go)
}

// New validates opts and routes once and returns a Consumer. Every error
// wraps ErrInvalidOption. New attaches each route's Source
// (Source.Attach), so a Source cannot serve two routes.
func New(opts Options, routes ...Route) (*Consumer, error) {
	if len(routes) == 0 {
		return nil, fmt.Errorf("%w: no routes", ErrInvalidOption)
	}
	// One check per option, so the message names only the one at fault.
	if opts.ShutdownGrace < 0 {
		return nil, fmt.Errorf("%w: ShutdownGrace %v is negative", ErrInvalidOption, opts.ShutdownGrace)
	}
	if opts.LogInterval < 0 {
		return nil, fmt.Errorf("%w: LogInterval %v is negative", ErrInvalidOption, opts.LogInterval)
	}
	if opts.Health.StuckAfter < 0 {
		return nil, fmt.Errorf("%w: Health.StuckAfter %v is negative", ErrInvalidOption, opts.Health.StuckAfter)
	}
	if isNil(opts.Clock) && opts.Clock != nil || isNil(opts.Observer) && opts.Observer != nil || isNil(opts.Hook) && opts.Hook != nil ||
		isNil(opts.Resource) && opts.Resource != nil {
		return nil, fmt.Errorf("%w: Clock, Observer, Hook or Resource is a typed nil", ErrInvalidOption)
	}
	c := &Consumer{grace: opts.ShutdownGrace}
	if c.grace == 0 {
		c.grace = 10 * time.Second
	}
	clock := opts.Clock
	if clock == nil {
		clock = systemClock{}
	}
	names := map[string]bool{}
	sources := map[any]string{}
	adaptive := map[*backpressure.AdaptiveLimit]string{}
	for i := range routes {
		given := routes[i]
		if err := given.validate(); err != nil {
			return nil, err
		}
		if names[given.Name] {
			return nil, fmt.Errorf("%w: route name %q used twice", ErrInvalidOption, given.Name)
		}
		names[given.Name] = true
		if reflect.TypeOf(given.Source).Comparable() {
			if other, ok := sources[given.Source]; ok {
				return nil, fmt.Errorf("%w: routes %q and %q share one Source; give each route its own", ErrInvalidOption, other, given.Name)
			}
			sources[given.Source] = given.Name
		}
		if al := given.Overload.AdaptiveLimit; al != nil {
			// One limit fed by two routes would size each window from the
			// other's latency, and CapMax below would cap it to the smaller.
			if other, ok := adaptive[al]; ok {
				return nil, fmt.Errorf("%w: routes %q and %q share one AdaptiveLimit; give each route its own", ErrInvalidOption, other, given.Name)
			}
			adaptive[al] = given.Name
		}
		r, err := newRoute(given.withDefaults(), clock, opts)
		if err != nil {
			return nil, err
		}
		if given.Window.Messages == 0 && given.Overload.AdaptiveLimit == nil && !given.Window.Cost.Enabled() {
			// The default window finds its size (drainWindow).
			d := &r.drain
			d.on, d.minFetch = true, given.Window.MinFetch == 0
			d.hi = r.cfg.Window.Messages
			d.lo = min(2*r.cfg.Workers*max(r.batchMessages(), 1), d.hi)
			d.limit = d.lo
			r.setLimit(d.lo)
		}
		c.routes = append(c.routes, r)
	}
	return c, nil
}

func newRoute(cfg Route, clock Clock, opts Options) (*route, error) {
	w, err := backpressure.NewWindow(cfg.Window.Messages, cfg.Window.Bytes)
	if err != nil {
		return nil, fmt.Errorf("route %q: %w", cfg.Name, err)
	}
	if opts.Budget != nil {
		if err := opts.Budget.Attach(w, cfg.Overload.ReservedBytes, cfg.Overload.Criticality); err != nil {
			return nil, fmt.Errorf("route %q: %w", cfg.Name, err)
		}
	}
	r := &route{
		cfg: cfg, retry: cfg.Retry, window: w, clock: clock,
		expiryOn: cfg.Expiry.Enabled(), header: cfg.Expiry.HeaderName(),
		queue:     newQueue(cfg.Overload.Queue.Order, cfg.Overload.Queue.DropWhenFull, cfg.Overload.Queue.MaxLength, cfg.Overload.Queue.MaxCost),
		fill:      1,
		baseLimit: cfg.Window.Messages,
		resource:  opts.Resource,
	}
	r.letters.init()
	r.failures.init(cfg.Window.Messages)
	if r.expiryOn {
		r.pred = newPredictor(cfg.Workers)
		r.fresh.init(cfg.Overload.Queue.Target)
	}
	if cfg.Window.Cost.Enabled() {
		r.queue.maxRunning = cfg.Window.Cost.MaxRunning
	}
	r.pressure, _ = backpressure.NewPressureGauge(backpressure.PressureOptions{}, r.pressureSignals)
	if cfg.Ordering != Unordered {
		r.order = newOrderer(r)
	}
	if cfg.BatchHandler != nil {
		r.batch = newBatcher(r)
	}
	r.log.init(cfg.Name, opts.Logger, opts.LogInterval)
	r.health.stuckAfter = opts.Health.StuckAfter
	info, err := cfg.Source.Attach(RouteLimits{
		Route: cfg.Name, Messages: cfg.Window.Messages, Bytes: cfg.Window.Bytes,
		MaxAttempts: cfg.Retry.MaxAttempts, MaxDelay: max(cfg.Retry.MaxDelay, cfg.Overload.ShedDelay),
		Ordering: cfg.Ordering, DeadLetter: cfg.DeadLetter.Sink,
	})
	if err != nil {
		return nil, fmt.Errorf("route %q: %w", cfg.Name, err)
	}
	r.info = info
	if info.MaxDeliver > 0 {
		r.maxDeliver = info.MaxDeliver
		if r.retry.MaxAttempts > r.maxDeliver {
			return nil, fmt.Errorf("%w: route %q: Retry.MaxAttempts %d is above the broker's MaxDeliver %d: the last attempts would be dropped by the broker before they are dead-lettered",
				ErrInvalidOption, cfg.Name, r.retry.MaxAttempts, r.maxDeliver)
		}
	}
	if al := cfg.Overload.AdaptiveLimit; al != nil {
		l := al.CapMax(cfg.Window.Messages)
		r.setLimit(l)
		r.limit.Store(int64(l))
	}
	r.keepAlive = cfg.KeepAlive
	if r.keepAlive == 0 && info.AckWait > 0 {
		r.keepAlive = info.AckWait / 3
	}
	if opts.Observer != nil {
		r.obs = opts.Observer.ObserveRoute(r.routeInfo(), r.stats)
	}
	if opts.Hook != nil {
		if h := opts.Hook.HookRoute(r.routeInfo()); !isNil(h) {
			r.hook = h
		}
	}
	o := &cfg.Overload
	r.timed = r.obs != nil || r.hook != nil || o.RetryBudget != nil || o.Throttle != nil || o.AdaptiveLimit != nil
	return r, nil
}

// Stats returns a snapshot of every route, in the order given to New.
func (c *Consumer) Stats() []RouteStats {
	out := make([]RouteStats, len(c.routes))
	for i, r := range c.routes {
		out[i] = r.stats()
	}
	return out
}

func (r *route) routeInfo() RouteInfo {
	return RouteInfo{Name: r.cfg.Name, Criticality: r.cfg.Overload.Criticality, Workers: r.cfg.Workers,
		WindowMessages: r.cfg.Window.Messages, WindowBytes: r.cfg.Window.Bytes, BatchMessages: r.batchMessages()}
}

func (r *route) stats() RouteStats {
	s := RouteStats{RouteInfo: r.routeInfo()}
	s.LastAbandoned = r.c.lastAbandoned.Load()
	// Outcomes first, then Fetched: a message settled in between shows up
	// in both, never in neither, so Fetched >= sum(Settled) always holds.
	for i := range s.Settled {
		s.Settled[i] = r.c.settled[i].Load()
	}
	s.Late = r.c.late.Load()
	s.Fetched = r.c.fetched.Load()
	s.Held = r.held.len()
	s.KeepAlives = r.c.keepAlives.Load()
	s.OldestHeld = r.held.oldest(time.Now())

	w := &s.Window
	w.InUse, w.InUseBytes = r.window.InUse()
	w.Peak, w.PeakBytes = r.window.Peak()
	w.Limit = r.window.Limit()
	w.Adaptive = r.cfg.Overload.AdaptiveLimit != nil
	w.Blocked = r.window.Blocked()
	w.BudgetBlocked = r.window.BudgetBlocked()

	e := &s.Errors
	e.Handler = r.c.handlerErrors.Load()
	e.Panics = r.c.panics.Load()
	e.MalformedDeadlines = r.c.malformed.Load()
	e.MalformedCriticality = r.c.badCrit.Load()
	e.Settle = r.c.settleErrors.Load()
	e.Fetch = r.c.fetchErrors.Load()
	e.DeadLetter = r.c.dlqErrors.Load()
	e.Last, e.LastAt = r.log.last()

	o := &s.Overload
	for i := range o.Shed {
		for j := range o.Shed[i] {
			o.Shed[i][j] = r.c.shed[i][j].Load()
		}
	}
	o.RetryBudgetExhausted = r.c.budgetOut.Load()
	if t := r.cfg.Overload.Throttle; t != nil {
		o.ThrottleProbability = t.Probability()
	}
	o.ThrottleRefused = r.c.throttled.Load()
	o.ExpiredEarly = r.c.expiredEarly.Load()
	o.Stale, o.StandingQueue = r.c.stale.Load(), r.fresh.standing.Load()
	o.Pressure = r.pressure.Load()
	o.ResourceCuts = r.c.resourceCuts.Load()
	r.limitMu.Lock()
	o.ResourceCap = r.resCap
	r.limitMu.Unlock()
	if r.pred != nil {
		o.HandlerMean, o.HandlerP99, _ = r.pred.lat.estimate()
	}
	s.Order = r.orderStats()
	s.Health = r.healthAt(time.Now())
	s.Batch = r.batchStats()
	return s
}

// Run pulls and handles messages until ctx is done or every route's Source
// is closed, then shuts down:
//
//  1. It stops pulling, and hands back (nak, no delay) messages that have
//     not started. A message on the broker's last delivery cannot be
//     handed back: it is run within the grace, or dead-lettered with
//     ClassShutdown (see the package documentation).
//  2. Running handlers get Options.ShutdownGrace to finish; then their
//     contexts are cancelled, and those still running ShutdownSlack later
//     are left unsettled (OutcomeAbandoned: the broker redelivers them
//     after its ack deadline; settling them would let another consumer run
//     them while they still run here). Run then returns ErrStuckHandlers;
//     those goroutines end when their handlers do.
//  3. Settlements and dead-letter writes under way get a ctx that ends at
//     ShutdownGrace + ShutdownSlack/2; settlements still unconfirmed at
//     ShutdownGrace + ShutdownSlack are abandoned (the broker may
//     redeliver them).
//
// So Run returns within ShutdownGrace + ShutdownSlack of ctx's end,
// whatever a handler, sink or broker does. It returns nil after a clean
// shutdown, or the errors of routes whose Source closed (wrapping
// ErrClosed) and ErrStuckHandlers, joined. A closed Source stops its own
// route only; the others go on.
//
// Run owns every goroutine it starts: a fetch loop and Workers goroutines
// per route, one keep-alive goroutine per route that needs it, and one
// letter retrier per route with a dead-letter sink (it retries the letters
// of messages that cannot be nak'd, off the workers). It may be called
// once.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return ErrRunning
	}
	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	handlerCtx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	settleCtx, cancelSettle := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelSettle()
	aliveCtx, stopAlive := context.WithCancel(settleCtx)
	defer stopAlive()

	var workers, fetchers, reapers, letters, alive sync.WaitGroup
	// errs is written by the fetch goroutines; one that has not returned
	// when Run gives up on it may still write it, so it is read under mu.
	var errsMu sync.Mutex
	errs := make([]error, len(c.routes))
	var active atomic.Int32
	active.Store(int32(len(c.routes)))
	for i, r := range c.routes {
		r.handlerCtx, r.settleCtx = handlerCtx, settleCtx
		gone := make(chan struct{})
		r.fetchGone, r.endFetch = gone, sync.OnceFunc(func() { close(gone) })
		r.health.begin(time.Now())
		for c := range r.classCtx {
			r.classCtx[c] = backpressure.WithPressure(backpressure.WithCriticality(handlerCtx, backpressure.Criticality(c)), r.pressure)
		}
		fetchers.Add(1)
		go func() {
			defer fetchers.Done()
			err := r.fetchLoop(runCtx)
			r.endFetch() // before the queue closes: its close may hand messages back
			errsMu.Lock()
			errs[i] = err
			errsMu.Unlock()
			r.health.end(err, false)
			if runCtx.Err() != nil {
				// Shutdown, not a Source that closed: the route is
				// stopping before its queue closes, so a worker the close
				// wakes (a batch lingering for more) hands its messages
				// back instead of running them. Run sets it too, but
				// after this goroutine may have closed the queue.
				r.stopping.Store(true)
			}
			r.queue.close()
			if active.Add(-1) == 0 {
				cancelRun() // every route has stopped: nothing more to do
			}
		}()
		if r.pred != nil {
			reapers.Go(func() { r.reapLoop(runCtx) })
		}
		if r.resource != nil {
			reapers.Go(func() { r.resourceLoop(runCtx, r.resource) })
		}
		if r.cfg.DeadLetter.Sink != nil {
			// Kept letters are retried until the grace ends, when the
			// handlers' ctx does.
			letters.Go(func() { r.retryLetters(handlerCtx) })
		}
		for w := range r.cfg.Workers {
			workers.Add(1)
			go func() {
				defer workers.Done()
				r.work(w)
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
	graceEnd := time.Now().Add(c.grace)
	hardEnd := graceEnd.Add(ShutdownSlack)
	for _, r := range c.routes {
		r.stopping.Store(true)
		if r.order != nil {
			// Held-back messages are handed back now, not after their
			// delay (a route whose Source closed kept them delayed).
			r.order.flush()
		}
	}
	// Handlers (and kept letters) get the grace; settlements and
	// dead-letter writes, wherever they run, are told to end halfway
	// through the slack, so they are done by hardEnd.
	stopHandlers := time.AfterFunc(time.Until(graceEnd), cancelHandlers)
	defer stopHandlers.Stop()
	stopSettling := time.AfterFunc(time.Until(graceEnd.Add(ShutdownSlack/2)), cancelSettle)
	defer stopSettling.Stop()

	var stuckErr error
	if !waitUntil(&reapers, hardEnd) {
		stuckErr = errors.Join(stuckErr, fmt.Errorf("%w: a reaper did not return (a dead-letter sink ignored its ctx)", ErrStuckHandlers))
	}
	if !waitUntil(&fetchers, hardEnd) {
		// A fetch loop is inside a Source or sink call that ignores its
		// ctx. Close the queues so the workers still finish.
		for _, r := range c.routes {
			r.endFetch()
			r.queue.close()
		}
		stuckErr = errors.Join(stuckErr, fmt.Errorf("%w: a fetch loop did not return (a Source or dead-letter sink ignored its ctx)", ErrStuckHandlers))
	}
	if !waitUntil(&workers, hardEnd) {
		n := 0
		for _, r := range c.routes {
			n += r.abandonStuck()
		}
		stuckErr = errors.Join(stuckErr, fmt.Errorf("%w: %d messages left to the broker", ErrStuckHandlers, n))
	}
	// Nothing hands letters over any more: the retriers write what they
	// keep until the grace ends, then abandon it.
	for _, r := range c.routes {
		r.letters.close()
	}
	if !waitUntil(&letters, hardEnd) {
		for _, r := range c.routes {
			r.abandonKept()
		}
		stuckErr = errors.Join(stuckErr, fmt.Errorf("%w: a dead-letter write did not return (a sink ignored its ctx)", ErrStuckHandlers))
	}
	// A kept message released its key's next message when it was
	// settled: an ordered route hands those back now, and from now on
	// hands back at once what a settlement still to come releases (a
	// stuck dead-letter write or settlement that returns late): no
	// worker is left to run it. Handing back a last delivery writes its
	// shutdown letter: a sink that ignores its ctx must not hold Run past
	// hardEnd, so the hand-backs run off Run's goroutine.
	var returning sync.WaitGroup
	for _, r := range c.routes {
		r.queue.mu.Lock()
		r.queue.drained = true
		r.queue.mu.Unlock()
		returning.Go(r.returnQueued)
	}
	if !waitUntil(&returning, hardEnd) {
		stuckErr = errors.Join(stuckErr, fmt.Errorf("%w: a dead-letter write did not return (a sink ignored its ctx)", ErrStuckHandlers))
	}
	// Wait for confirmations still outstanding, up to hardEnd.
	for {
		n := 0
		for _, r := range c.routes {
			n += r.pendingConfirmations()
		}
		if n == 0 || !time.Now().Before(hardEnd) {
			break
		}
		time.Sleep(min(5*time.Millisecond, time.Until(hardEnd)))
	}
	for _, r := range c.routes {
		if n := r.abandonUnconfirmed(); n > 0 {
			r.noteError("shutdown", fmt.Errorf("%w: %d settlements", ErrUnconfirmed, n))
		}
	}
	stopAlive()
	alive.Wait()
	for _, r := range c.routes {
		r.health.end(nil, true)
	}
	errsMu.Lock()
	defer errsMu.Unlock()
	return errors.Join(append(errs, stuckErr)...)
}

// waitUntil waits for wg until deadline and reports whether it finished.
func waitUntil(wg *sync.WaitGroup, deadline time.Time) bool {
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

// abandonStuck runs after the shutdown deadline with workers still inside
// handlers: queued messages are handed back, and the messages of the stuck
// handlers are left unsettled for the broker to redeliver.
func (r *route) abandonStuck() int {
	r.returnQueued()
	n := 0
	for _, m := range r.held.snapshot() {
		if r.settle(m, abandon) {
			n++
		}
	}
	return n
}

// returnQueued hands back every message still queued, once the workers
// are done (or given up on).
func (r *route) returnQueued() {
	for {
		m, ok := r.queue.tryPop()
		if !ok {
			return
		}
		r.giveBack(m)
	}
}

// errorLog keeps a route's last error and logs distinct errors at a bounded
// rate.
type errorLog struct {
	route    string
	logger   *slog.Logger
	interval time.Duration

	mu     sync.Mutex
	text   string
	at     time.Time
	logged map[string]time.Time
}

func (l *errorLog) init(route string, logger *slog.Logger, interval time.Duration) {
	l.route, l.logger, l.interval = route, logger, interval
	if l.interval == 0 {
		l.interval = 10 * time.Second
	}
}

// noteError records err (from what the route was doing) as the route's
// last error and logs it unless the same text was logged within interval.
func (r *route) noteError(what string, err error) {
	l := &r.log
	text := what + ": " + err.Error()
	now := time.Now()
	l.mu.Lock()
	l.text, l.at = text, now
	log := false
	if l.logger != nil {
		if l.logged == nil || len(l.logged) > 256 {
			l.logged = map[string]time.Time{}
		}
		if t, ok := l.logged[text]; !ok || now.Sub(t) >= l.interval {
			l.logged[text] = now
			log = true
		}
	}
	l.mu.Unlock()
	if log {
		l.logger.Error("sluice: "+what+" failed", "route", l.route, "err", err)
	}
}

func (l *errorLog) last() (string, time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.text, l.at
}
