package metrics

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
)

const namespace = "sluice"

// Option configures New.
type Option func(*config)

type config struct {
	constLabels prometheus.Labels
}

// WithConstLabels adds labels to every metric New registers.
func WithConstLabels(l prometheus.Labels) Option {
	return func(c *config) { c.constLabels = l }
}

// Observer exports consumer stats and handler latency to Prometheus. It
// implements consumer.Observer; pass it as consumer.Options.Observer.
type Observer struct {
	latency *prometheus.HistogramVec
	// Batch routes (consumer.BatchHandler): messages per batch, linger
	// and handler time per batch.
	batchSize, batchLinger, batchLatency *prometheus.HistogramVec
	col                                  *collector
}

var _ consumer.Observer = (*Observer)(nil)

// New registers the metrics on reg and returns the Observer. Registration
// errors (for example registering twice on one registry) are returned.
func New(reg prometheus.Registerer, opts ...Option) (*Observer, error) {
	var cfg config
	for _, o := range opts {
		o(&cfg)
	}
	col := newCollector(cfg.constLabels)
	latency := prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace:   namespace,
		Name:        "handler_duration_seconds",
		Help:        "Handler run time by route and outcome.",
		ConstLabels: cfg.constLabels,
		// 0.5 ms * 2^16 ≈ 32.8 s.
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 17),
	}, []string{"route", "outcome"})
	hist := func(name, help string, buckets []float64) *prometheus.HistogramVec {
		return prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: name, Help: help,
			ConstLabels: cfg.constLabels, Buckets: buckets}, []string{"route"})
	}
	o := &Observer{latency: latency, col: col,
		// 1 to 4096 messages.
		batchSize:    hist("batch_messages", "Messages per batch a batch handler ran, by route.", prometheus.ExponentialBuckets(1, 2, 13)),
		batchLinger:  hist("batch_linger_seconds", "Time a batch waited for more messages after its first (BatchPolicy.Linger), by route.", prometheus.ExponentialBuckets(0.0005, 2, 14)),
		batchLatency: hist("batch_duration_seconds", "Batch handler run time, by route.", prometheus.ExponentialBuckets(0.0005, 2, 17)),
	}
	cs := []prometheus.Collector{col, latency, o.batchSize, o.batchLinger, o.batchLatency}
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			return nil, err
		}
	}
	return o, nil
}

// ObserveRoute implements consumer.Observer.
func (o *Observer) ObserveRoute(info consumer.RouteInfo, stats func() consumer.RouteStats) consumer.RouteObserver {
	o.col.add(info, stats)
	outs := consumer.Outcomes()
	ro := &routeObserver{byOutcome: make([]prometheus.Observer, len(outs))}
	for i, out := range outs {
		ro.byOutcome[i] = o.latency.WithLabelValues(info.Name, out.String())
	}
	if info.BatchMessages > 0 {
		return &batchRouteObserver{routeObserver: ro, size: o.batchSize.WithLabelValues(info.Name),
			linger: o.batchLinger.WithLabelValues(info.Name), latency: o.batchLatency.WithLabelValues(info.Name)}
	}
	return ro
}

// batchRouteObserver also records batches (consumer.BatchObserver).
type batchRouteObserver struct {
	*routeObserver
	size, linger, latency prometheus.Observer
}

// BatchDone implements consumer.BatchObserver.
func (b *batchRouteObserver) BatchDone(info consumer.BatchInfo) {
	b.size.Observe(float64(info.Size))
	b.linger.Observe(info.Linger.Seconds())
	b.latency.Observe(info.Latency.Seconds())
}

type routeObserver struct {
	byOutcome []prometheus.Observer // indexed by consumer.Outcome
}

// HandlerDone implements consumer.RouteObserver.
func (r *routeObserver) HandlerDone(outcome consumer.Outcome, latency time.Duration) {
	if outcome >= 0 && int(outcome) < len(r.byOutcome) {
		r.byOutcome[outcome].Observe(latency.Seconds())
	}
}

type routeEntry struct {
	name, crit string
	stats      func() consumer.RouteStats
}

type collector struct {
	mu     sync.Mutex
	routes []routeEntry

	fetched, settled, goodput, late, handlerErrors, panics, malformed, badCrit,
	settleErrors, fetchErrors, dlqErrors, lastError, keepAlives, held,
	inUseMsgs, limitMsgs, inUseBytes, limitBytes, peakMsgs, peakBytes,
	blocked, budgetBlocked, oldest *prometheus.Desc
	shed, budgetOut, throttleP, throttled, adaptive   *prometheus.Desc
	expiredEarly, pressure, pressureCause, handlerP99 *prometheus.Desc
	resourceCap, resourceCuts                         *prometheus.Desc
	state, stateSince                                 *prometheus.Desc
	states                                            []consumer.RouteState
	outcomes                                          []consumer.Outcome
	reasons                                           []consumer.ShedReason
}

func newCollector(cl prometheus.Labels) *collector {
	labels := []string{"route", "criticality"}
	d := func(name, help string, extra ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(namespace, "", name), help, append(labels[:2:2], extra...), cl)
	}
	return &collector{
		fetched:       d("fetched_total", "Messages fetched from the source."),
		settled:       d("settled_total", "Messages settled, by outcome.", "outcome"),
		goodput:       d("goodput_total", "Successes that finished within their deadline."),
		late:          d("late_total", "Successes that finished after their deadline."),
		handlerErrors: d("handler_errors_total", "Handler runs that returned an error or panicked."),
		panics:        d("panics_total", "Handler runs that panicked."),
		malformed:     d("malformed_deadlines_total", "Deadline headers that could not be parsed."),
		badCrit:       d("malformed_criticality_total", "Criticality headers that named no class."),
		settleErrors:  d("settle_errors_total", "Settlements the broker refused or never confirmed."),
		fetchErrors:   d("fetch_errors_total", "Failed fetches."),
		dlqErrors:     d("dead_letter_errors_total", "Failed dead-letter writes."),
		lastError:     d("last_error_timestamp_seconds", "When the route last recorded a fetch, settlement or dead-letter error (Unix seconds; 0: never). The text is in RouteStats.Errors.Last and the Logger."),
		keepAlives:    d("keepalives_total", "InProgress calls for held messages."),
		held:          d("held_messages", "Messages the route holds: queued, running, waiting for the window or for a settlement's confirmation."),
		inUseMsgs:     d("window_in_use_messages", "Messages held in the route's window."),
		limitMsgs:     d("window_limit_messages", "The route window's message limit."),
		inUseBytes:    d("window_in_use_bytes", "Bytes held in the route's window."),
		limitBytes:    d("window_limit_bytes", "The route window's byte limit."),
		peakMsgs:      d("window_peak_messages", "Most messages ever held in the route's window."),
		peakBytes:     d("window_peak_bytes", "Most bytes ever held in the route's window."),
		blocked:       d("window_blocked_seconds_total", "Time spent waiting for window capacity."),
		budgetBlocked: d("budget_blocked_seconds_total", "Part of the window wait spent on the process-wide byte budget while the window itself had room."),
		oldest:        d("oldest_inflight_seconds", "Age of the oldest message the route holds."),
		shed:          d("shed_total", "Messages shed by an overload policy, by reason and message class.", "reason", "class"),
		budgetOut:     d("retry_budget_exhausted_total", "Retryable failures the retry budget refused to retry."),
		throttleP:     d("throttle_probability", "Local reject probability of the route's adaptive throttle."),
		throttled:     d("throttle_refused_total", "Window slots the route's throttle kept the pull from filling."),
		adaptive:      d("adaptive_limit", "Message limit in force set by the route's adaptive concurrency limit."),
		expiredEarly:  d("expired_early_total", "Messages settled as expired before their deadline because they were predicted to finish after it (predictive expiry); also in settled_total{outcome=\"expired\"}."),
		pressure:      d("pressure_level", "How pressed the route is, as backpressure.PressureFrom tells its handlers: 0 normal, 1 elevated, 2 high."),
		pressureCause: d("pressure_cause", "1 for each cause of the route's pressure level now, else 0.", "cause"),
		resourceCap:   d("resource_cap_messages", "The cap the process's resource pressure (consumer.Options.Resource) puts on the route's window now; 0 when none binds."),
		resourceCuts:  d("resource_cuts_total", "Intervals in which the process was over its resource target and the route lowered its window's cap."),
		handlerP99:    d("handler_p99_seconds", "The 99th percentile of handler latency the route has learned from its recent runs on messages with a deadline (what predictive expiry uses); 0 before the first."),
		state:         d("route_state", "1 for the route's state now (consumer.Consumer.Health: stopped, failed, not_ready, stuck, shedding, progressing, idle), else 0. The reason in words is on /readyz (package health).", "state"),
		stateSince:    d("route_state_since_seconds", "When the route entered its state (Unix seconds), as far as health probes and scrapes saw it."),
		states:        consumer.RouteStates(),
		outcomes:      consumer.Outcomes(),
		reasons:       consumer.ShedReasons(),
	}
}

func (c *collector) add(info consumer.RouteInfo, stats func() consumer.RouteStats) {
	c.mu.Lock()
	c.routes = append(c.routes, routeEntry{name: info.Name, crit: info.Criticality.String(), stats: stats})
	c.mu.Unlock()
}

func (c *collector) descs() []*prometheus.Desc {
	return []*prometheus.Desc{c.fetched, c.settled, c.goodput, c.late, c.handlerErrors, c.panics,
		c.malformed, c.badCrit, c.settleErrors, c.fetchErrors, c.dlqErrors, c.lastError, c.keepAlives, c.held,
		c.inUseMsgs, c.limitMsgs, c.inUseBytes, c.limitBytes, c.peakMsgs, c.peakBytes, c.blocked, c.budgetBlocked, c.oldest,
		c.shed, c.budgetOut, c.throttleP, c.throttled, c.adaptive, c.expiredEarly, c.pressure, c.pressureCause, c.handlerP99,
		c.resourceCap, c.resourceCuts, c.state, c.stateSince}
}

// Describe implements prometheus.Collector.
func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs() {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	routes := append([]routeEntry(nil), c.routes...)
	c.mu.Unlock()
	for _, r := range routes {
		s := r.stats()
		cnt := func(d *prometheus.Desc, v float64, extra ...string) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v, append([]string{r.name, r.crit}, extra...)...)
		}
		gauge := func(d *prometheus.Desc, v float64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, r.name, r.crit)
		}
		cnt(c.fetched, float64(s.Fetched))
		for _, o := range c.outcomes {
			cnt(c.settled, float64(s.Settled[o]), o.String())
		}
		cnt(c.goodput, float64(s.Goodput()))
		cnt(c.late, float64(s.Late))
		e, w, o := &s.Errors, &s.Window, &s.Overload
		cnt(c.handlerErrors, float64(e.Handler))
		cnt(c.panics, float64(e.Panics))
		cnt(c.malformed, float64(e.MalformedDeadlines))
		cnt(c.badCrit, float64(e.MalformedCriticality))
		cnt(c.settleErrors, float64(e.Settle))
		cnt(c.fetchErrors, float64(e.Fetch))
		cnt(c.dlqErrors, float64(e.DeadLetter))
		var last float64
		if !e.LastAt.IsZero() {
			last = float64(e.LastAt.UnixNano()) / 1e9
		}
		gauge(c.lastError, last)
		cnt(c.keepAlives, float64(s.KeepAlives))
		gauge(c.held, float64(s.Held))
		gauge(c.inUseMsgs, float64(w.InUse))
		gauge(c.limitMsgs, float64(s.WindowMessages))
		gauge(c.inUseBytes, float64(w.InUseBytes))
		gauge(c.limitBytes, float64(s.WindowBytes))
		gauge(c.peakMsgs, float64(w.Peak))
		gauge(c.peakBytes, float64(w.PeakBytes))
		cnt(c.blocked, w.Blocked.Seconds())
		cnt(c.budgetBlocked, w.BudgetBlocked.Seconds())
		gauge(c.oldest, s.OldestHeld.Seconds())
		for _, reason := range c.reasons {
			for class := backpressure.Sheddable; class <= backpressure.CriticalPlus; class++ {
				cnt(c.shed, float64(o.Shed[reason][class]), reason.String(), class.String())
			}
		}
		cnt(c.budgetOut, float64(o.RetryBudgetExhausted))
		gauge(c.throttleP, o.ThrottleProbability)
		cnt(c.throttled, float64(o.ThrottleRefused))
		if w.Adaptive {
			gauge(c.adaptive, float64(w.Limit))
		}
		cnt(c.expiredEarly, float64(o.ExpiredEarly))
		gauge(c.pressure, float64(o.Pressure.Level))
		for _, cause := range backpressure.PressureCauses() {
			var v float64
			if o.Pressure.Causes&cause != 0 {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.pressureCause, prometheus.GaugeValue, v, r.name, r.crit, cause.String())
		}
		gauge(c.handlerP99, o.HandlerP99.Seconds())
		gauge(c.resourceCap, float64(o.ResourceCap))
		cnt(c.resourceCuts, float64(o.ResourceCuts))
		for _, st := range c.states {
			var v float64
			if s.Health.State == st {
				v = 1
			}
			ch <- prometheus.MustNewConstMetric(c.state, prometheus.GaugeValue, v, r.name, r.crit, st.String())
		}
		gauge(c.stateSince, float64(s.Health.Since.UnixNano())/1e9)
	}
}
