package main

import (
	"context"
	"math/rand/v2"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
)

// kind is which consumer a trial runs. Every table and plot of the lab puts
// the four main kinds side by side, in this order.
type kind int

const (
	// unprotected: the raw client into an unbounded in-process FIFO, no
	// expiry check, the same workers and cost.
	unprotected kind = iota
	// boundedQueue: the raw client into a bounded in-process queue
	// (-queue, 50) that drops an arrival when full (tail drop, acked), and
	// an expiry check before running: seed 002's "protected" consumer, the
	// best simple alternative to sluice, in about forty lines.
	boundedQueue
	// sluiceMinimal: one sluice route with the least configuration the
	// API accepts (see minimalRoute).
	sluiceMinimal
	// sluiceTuned: one sluice route with the lab's advice (see tunedRoute).
	sluiceTuned
	numKinds
)

var kindNames = [...]string{"unprotected", "plain bounded queue", "sluice minimal", "sluice tuned"}

func (k kind) String() string {
	if k < 0 || k >= numKinds {
		return "unknown"
	}
	return kindNames[k]
}

// allKinds is every consumer, in table order.
var allKinds = []kind{unprotected, boundedQueue, sluiceMinimal, sluiceTuned}

func (k kind) isSluice() bool { return k == sluiceMinimal || k == sluiceTuned }

// trialSpec is one run of one consumer at one offered load.
type trialSpec struct {
	name     string
	kind     kind
	rate     float64       // offered msg/s (when phases is empty)
	duration time.Duration // how long the producer offers load (when phases is empty)
	// phases, when set, replaces rate and duration: the producer offers
	// each phase's rate for its duration, in order.
	phases []phase
	// warmup is the start of the measurement: goodput and latency count
	// only runs that finish between warmup and the end of the offered load,
	// so a trial reports its steady state, not the transient while a
	// backlog builds up.
	warmup   time.Duration
	workers  int
	cost     time.Duration // handler cost per message (when the message declares none)
	deadline time.Duration // 0: messages carry no deadline
	window   int           // sluice tuned: MaxInFlight
	queueCap int           // plain bounded queue: its bound
	// margin is the tuned route's start-by margin (Route.ShedNearDeadline):
	// a message with less than margin left before its deadline is shed,
	// not started.
	margin time.Duration
	limits limits // broker-side queue bound
	// highShare is the fraction of messages published CRITICAL, the rest
	// SHEDDABLE (0: all CRITICAL).
	highShare float64
	// mix, when set, draws each message's declared cost (and class) from
	// these shares; the handler then runs for the message's cost.
	mix []mixEntry
	// drain is how long consumers keep running after the producer stops.
	drain time.Duration
	// prefill publishes this many messages before the consumer starts.
	prefill int
	// observer, when set, receives the sluice route's stats (metrics).
	observer consumer.Observer
	payload  int // message payload bytes
	// tune, when set, adjusts a sluice route (queue order, drop policy).
	tune func(*consumer.Route)
	// work, when set, replaces the handler model (a sleep of the
	// message's cost); it reports whether it took a degraded path.
	work work
	// keepRuns keeps every handler run in the result (result.runs), for
	// modes that look at more than the summary.
	keepRuns bool
	// resource, when set, is the sluice consumer's Options.Resource.
	resource backpressure.ResourceSignal
}

// phase is one stretch of constant offered load.
type phase struct {
	dur  time.Duration
	rate float64
}

// mixEntry is one class of a cost mix: share of the messages, each costing cost.
type mixEntry struct {
	share float64
	cost  time.Duration
}

// work is the handler's model: it spends what m costs (or less, when it
// takes a degraded path, which it reports).
type work func(ctx context.Context, m labMsg) (degraded bool, err error)

// sleepWork is the default model: an I/O-like wait of the message's cost.
func sleepWork(cost time.Duration) work {
	return func(ctx context.Context, m labMsg) (bool, error) {
		return false, sleep(ctx, m.costOr(cost))
	}
}

func (s trialSpec) total() time.Duration {
	if len(s.phases) == 0 {
		return s.duration
	}
	var d time.Duration
	for _, p := range s.phases {
		d += p.dur
	}
	return d
}

// due is how many messages the producer should have sent el into the trial.
func (s trialSpec) due(el time.Duration) int {
	if len(s.phases) == 0 {
		return int(el.Seconds() * s.rate)
	}
	var n float64
	for _, p := range s.phases {
		d := min(el, p.dur)
		n += d.Seconds() * p.rate
		el -= d
		if el <= 0 {
			break
		}
	}
	return int(n)
}

// result is what one trial measured. Every count is of messages the
// producer offered during the trial.
type result struct {
	spec              trialSpec
	offered, accepted int // publish attempts; accepted by the broker
	rejected          int // refused by a full queue (broker tail-drop)
	good              int // succeeded within the deadline (whole trial)
	late              int // succeeded, or cut off, after the deadline
	wasted            int // handler runs started on an already-expired message
	handled           int // handler runs completed successfully
	expired           int // settled as expired without a handler run
	shed              int // shed by sluice, or dropped by the plain bounded queue
	headDropped       int // discarded by the broker (head-drop): accepted, never delivered
	leftover          int // still queued or held when the trial stopped
	goodByClass       [4]int
	offeredByClass    [4]int
	p50, p99          time.Duration // latency (publish to done) of successful runs in the window
	goodput           float64       // good in the window / window, msg/s
	peakInFlight      int           // sluice: window peak; others: buffered + running
	peakHeap          uint64        // bytes, sampled every 10 ms
	elapsed           time.Duration
	offeredRate       float64 // what the producer achieved, msg/s
	runs              []runRec
	start             time.Time // the producer's start
	stats             consumerStats
	failed            string // why the trial has no figures (grid mode)
}

// runRec is one handler run.
type runRec struct {
	pub, start, end time.Time
	cost            time.Duration // the message's declared cost, 0 if none
	crit            backpressure.Criticality
	ok              bool // the handler returned nil
	onTime          bool // ok and finished by the deadline
	wasted          bool // started after the deadline
	degraded        bool // took the degraded path
}

func (r runRec) latency() time.Duration { return r.end.Sub(r.pub) }

// recorder collects handler-side measurements; every consumer uses it.
type recorder struct {
	mu   sync.Mutex
	runs []runRec
}

// run is called once per handler run with its start and end; ok is false
// when the run failed or was cut off (its context ended).
func (r *recorder) run(m labMsg, start, end time.Time, ok, degraded bool) {
	rec := runRec{pub: m.pub, start: start, end: end, cost: m.cost, crit: m.crit, ok: ok, degraded: degraded}
	rec.wasted = !m.deadline.IsZero() && !start.Before(m.deadline)
	rec.onTime = ok && (m.deadline.IsZero() || !end.After(m.deadline))
	r.mu.Lock()
	r.runs = append(r.runs, rec)
	r.mu.Unlock()
}

func (r *recorder) snapshot() []runRec {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.runs)
}

// window is a span of runs' end times, [from, until).
type window struct{ from, until time.Time }

func (w window) has(t time.Time) bool { return !t.Before(w.from) && t.Before(w.until) }
func (w window) secs() float64        { return w.until.Sub(w.from).Seconds() }

// summary is what a set of runs shows over a window.
type summary struct {
	good, late, wasted, handled, degraded int
	units                                 time.Duration // cost of the runs on time (cost mode)
	p50, p99                              time.Duration
	lat                                   []time.Duration // of ok runs
}

// summarize the runs ending in w that keep(r) selects (nil: all).
func summarize(runs []runRec, w window, keep func(runRec) bool) summary {
	var s summary
	for _, r := range runs {
		if !w.has(r.end) || keep != nil && !keep(r) {
			continue
		}
		if r.wasted {
			s.wasted++
		}
		if r.degraded {
			s.degraded++
		}
		if !r.ok {
			s.late++
			continue
		}
		s.handled++
		s.lat = append(s.lat, r.latency())
		if r.onTime {
			s.good++
			s.units += r.cost
		} else {
			s.late++
		}
	}
	s.p50, s.p99 = percentile(s.lat, 0.50), percentile(s.lat, 0.99)
	return s
}

// sleep is the handler's cost: an I/O-like wait, so a 2-core machine can
// emulate any capacity honestly (CPU-bound handlers would compete with the
// broker and the producer for the same cores).
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// heapSampler records the peak live heap while it runs.
type heapSampler struct {
	peak atomic.Uint64
	stop chan struct{}
	done chan struct{}
}

func startHeapSampler() *heapSampler {
	runtime.GC()
	h := &heapSampler{stop: make(chan struct{}), done: make(chan struct{})}
	sample := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	read := func() {
		metrics.Read(sample)
		if v := sample[0].Value.Uint64(); v > h.peak.Load() {
			h.peak.Store(v)
		}
	}
	read()
	go func() {
		defer close(h.done)
		t := time.NewTicker(10 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-h.stop:
				read()
				return
			case <-t.C:
				read()
			}
		}
	}()
	return h
}

func (h *heapSampler) finish() uint64 {
	close(h.stop)
	<-h.done
	return h.peak.Load()
}

// runTrial runs one consumer against a fresh queue at the spec's offered
// load, then lets it drain for spec.drain, and measures.
func runTrial(ctx context.Context, b broker, spec trialSpec) (result, error) {
	res := result{spec: spec}
	if spec.work == nil {
		spec.work = sleepWork(spec.cost)
	}
	q, err := b.queue(ctx, spec.name, spec.limits)
	if err != nil {
		return res, err
	}
	defer q.close()
	rec := &recorder{}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	var next uint64
	pubOne := func(now time.Time) {
		m := labMsg{id: next, pub: now, crit: backpressure.Critical}
		next++
		if spec.highShare > 0 && rand.Float64() >= spec.highShare {
			m.crit = backpressure.Sheddable
		}
		if spec.deadline > 0 {
			m.deadline = now.Add(spec.deadline)
		}
		if len(spec.mix) > 0 {
			m.cost = drawCost(spec.mix)
		}
		res.offered++
		res.offeredByClass[m.crit]++
		if err := q.publish(ctx, m); err != nil {
			res.rejected++
		}
	}
	for range spec.prefill {
		pubOne(time.Now())
	}
	res.rejected += q.flush(ctx)

	heap := startHeapSampler()
	stopConsumer, err := startConsumer(ctx, q, spec, rec)
	if err != nil {
		heap.finish()
		return res, err
	}

	// Open-loop producer: it sends on schedule whatever the consumer does.
	start := time.Now()
	res.start = start
	total := spec.total()
	tick := time.NewTicker(time.Millisecond)
	for {
		now := <-tick.C
		el := now.Sub(start)
		if el >= total || ctx.Err() != nil {
			break
		}
		due := spec.due(el)
		for res.offered-spec.prefill < due {
			pubOne(time.Now())
		}
	}
	tick.Stop()
	res.offeredRate = float64(res.offered-spec.prefill) / time.Since(start).Seconds()
	res.rejected += q.flush(ctx)
	res.accepted = res.offered - res.rejected

	// Past deadline+drain nothing published in the trial can still count
	// as goodput.
	if spec.drain > 0 {
		drainT := time.NewTimer(spec.drain)
		select {
		case <-drainT.C:
		case <-ctx.Done():
			drainT.Stop()
		}
	}
	res.elapsed = time.Since(start)
	depth, derr := q.depth(ctx)
	cs, cerr := stopConsumer()
	res.peakHeap = heap.finish()
	res.stats = cs

	res.runs = rec.snapshot()
	all := summarize(res.runs, window{from: time.Time{}, until: start.Add(res.elapsed + time.Hour)}, nil)
	res.good, res.late, res.wasted, res.handled = all.good, all.late, all.wasted, all.handled
	for _, r := range res.runs {
		if r.onTime && r.crit.Valid() {
			res.goodByClass[r.crit]++
		}
	}
	w := res.measureWindow()
	in := summarize(res.runs, w, nil)
	res.p50, res.p99 = in.p50, in.p99
	res.goodput = float64(in.good) / w.secs()
	res.expired, res.shed, res.peakInFlight = cs.expired, cs.shed, cs.peakInFlight
	if !spec.keepRuns {
		res.runs = nil
	}
	if derr == nil {
		res.leftover = depth
	}
	// What the broker accepted but never delivered was discarded by its
	// head-drop limit.
	if spec.limits.maxMsgs > 0 && !spec.limits.dropNew {
		res.headDropped = max(0, res.accepted-cs.fetched-res.leftover)
	}
	return res, cerr
}

// measureWindow is the steady-state part of the offered load.
func (r result) measureWindow() window {
	return window{from: r.start.Add(r.spec.warmup), until: r.start.Add(r.spec.total())}
}

func drawCost(mix []mixEntry) time.Duration {
	var sum float64
	for _, e := range mix {
		sum += e.share
	}
	x := rand.Float64() * sum
	for _, e := range mix {
		if x < e.share {
			return e.cost
		}
		x -= e.share
	}
	return mix[len(mix)-1].cost
}

type consumerStats struct {
	fetched, expired, shed, peakInFlight int
}

// startConsumer starts the spec's kind of consumer on q.
func startConsumer(ctx context.Context, q queue, spec trialSpec, rec *recorder) (func() (consumerStats, error), error) {
	switch spec.kind {
	case unprotected:
		return startUnprotected(ctx, q, spec, rec)
	case boundedQueue:
		return startBoundedQueue(ctx, q, spec, rec)
	default:
		return startSluice(ctx, q, spec, rec)
	}
}

// percentile returns the q-quantile of d (nearest rank), 0 for none. It
// sorts d.
func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := int(q*float64(len(d))+0.999999) - 1
	return d[min(max(i, 0), len(d)-1)]
}
