package main

import (
	"context"
	"errors"
	"math/rand/v2"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/internal/demo"
)

// kind is which consumer a trial runs.
type kind int

const (
	// baseline: the raw client into an unbounded in-process FIFO, no expiry
	// check, same workers and cost.
	baseline kind = iota
	// protected: sluice with a bounded window, expiry checked at fetch and
	// before the handler, and a start-by margin.
	protected
)

func (k kind) String() string {
	if k == baseline {
		return "unprotected"
	}
	return "sluice"
}

// trialSpec is one run of one consumer at one offered rate.
type trialSpec struct {
	name     string
	kind     kind
	rate     float64       // offered msg/s
	duration time.Duration // how long the producer offers load
	workers  int
	cost     time.Duration // handler sleep per message
	deadline time.Duration // 0: messages carry no deadline
	window   int           // sluice MaxInFlight
	// margin is sluice's start-by margin (Route.ShedNearDeadline): a
	// message with less than margin left before its deadline is shed when
	// a worker picks it, not started.
	margin time.Duration
	limits limits // broker-side queue bound
	// highShare is the fraction of messages published CRITICAL, the rest
	// SHEDDABLE (0: all CRITICAL).
	highShare float64
	// drain is how long consumers keep running after the producer stops.
	drain time.Duration
	// prefill publishes this many messages before the consumer starts.
	prefill int
	// observer, when set, receives the sluice route's stats (metrics).
	observer consumer.Observer
	payload  int // message payload bytes
	// tune, when set, adjusts the sluice route (queue order, drop policy).
	tune func(*consumer.Route)
}

// result is what one trial measured. Every count is of messages the
// producer offered during the trial.
type result struct {
	spec              trialSpec
	offered, accepted int // publish attempts; accepted by the broker
	rejected          int // refused by a full queue (tail-drop)
	good              int // succeeded within the deadline
	late              int // succeeded, or cut off, after the deadline
	wasted            int // handler runs started on an already-expired message
	handled           int // handler runs completed successfully
	expired           int // settled as expired without a handler run
	shed              int // shed by sluice
	headDropped       int // discarded by the broker (head-drop): accepted, never delivered
	leftover          int // still queued or held when the trial stopped
	goodByClass       [4]int
	offeredByClass    [4]int
	p50, p99          time.Duration // latency (publish to done) of successful runs
	goodput           float64       // good / duration, msg/s
	peakInFlight      int           // sluice: window peak; baseline: buffered + running
	peakHeap          uint64        // bytes, sampled every 10 ms
	elapsed           time.Duration
}

// recorder collects handler-side measurements; both consumers use it.
type recorder struct {
	mu      sync.Mutex
	lat     []time.Duration
	good    int
	late    int
	wasted  int
	handled int
	byClass [4]int
	waits   []time.Duration // publish to handler start, in start order
	// until, when set, is the end of the offered-load window: goodput
	// counts only successes finished by then (the drain after it lets
	// queued work finish but is not part of the rate).
	until      time.Time
	goodWindow int
}

// run is called once per handler run with its start and end; ok is false
// when the run was cut off (its context ended).
func (r *recorder) run(m labMsg, start, end time.Time, ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.waits = append(r.waits, start.Sub(m.pub))
	if !m.deadline.IsZero() && !start.Before(m.deadline) {
		r.wasted++
	}
	if !ok {
		r.late++
		return
	}
	r.handled++
	r.lat = append(r.lat, end.Sub(m.pub))
	if m.deadline.IsZero() || !end.After(m.deadline) {
		r.good++
		if r.until.IsZero() || !end.After(r.until) {
			r.goodWindow++
		}
		if m.crit.Valid() {
			r.byClass[m.crit]++
		}
	} else {
		r.late++
	}
}

// sleep is the handler's cost: an I/O-like wait, so a 2-core machine can
// emulate any capacity honestly (CPU-bound handlers would compete with the
// broker and the producer for the same cores).
var sleep = demo.Sleep

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

// runTrial runs one consumer against a fresh queue at spec.rate for
// spec.duration, then lets it drain for spec.drain, and measures.
func runTrial(ctx context.Context, b broker, spec trialSpec) (result, error) {
	res := result{spec: spec}
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
	var stopConsumer func() (consumerStats, error)
	switch spec.kind {
	case baseline:
		stopConsumer, err = startBaseline(ctx, q, spec, rec)
	default:
		stopConsumer, err = startSluice(ctx, q, spec, rec)
	}
	if err != nil {
		heap.finish()
		return res, err
	}

	// Open-loop producer: it sends on schedule whatever the consumer does.
	start := time.Now()
	rec.mu.Lock()
	rec.until = start.Add(spec.duration)
	rec.mu.Unlock()
	tick := time.NewTicker(time.Millisecond)
	for {
		now := <-tick.C
		el := now.Sub(start)
		if el >= spec.duration {
			break
		}
		due := int(el.Seconds() * spec.rate)
		for res.offered-spec.prefill < due {
			pubOne(time.Now())
		}
	}
	tick.Stop()
	res.rejected += q.flush(ctx)
	res.accepted = res.offered - res.rejected

	// Past deadline+drain nothing published in the trial can still count
	// as goodput.
	drainT := time.NewTimer(spec.drain)
	select {
	case <-drainT.C:
	case <-ctx.Done():
		drainT.Stop()
	}
	res.elapsed = time.Since(start)
	depth, derr := q.depth(ctx)
	cs, cerr := stopConsumer()
	res.peakHeap = heap.finish()

	rec.mu.Lock()
	res.good, res.late, res.wasted, res.handled = rec.good, rec.late, rec.wasted, rec.handled
	res.goodByClass = rec.byClass
	lat := slices.Clone(rec.lat)
	goodWindow := rec.goodWindow
	rec.mu.Unlock()
	res.p50, res.p99 = percentile(lat, 0.50), percentile(lat, 0.99)
	res.goodput = float64(goodWindow) / spec.duration.Seconds()
	res.expired, res.shed, res.peakInFlight = cs.expired, cs.shed, cs.peakInFlight
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

type consumerStats struct {
	fetched, expired, shed, peakInFlight int
}

// percentile returns the q-quantile of d (nearest rank), 0 for none.
func percentile(d []time.Duration, q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	slices.Sort(d)
	i := int(q*float64(len(d))+0.999999) - 1
	return d[min(max(i, 0), len(d)-1)]
}

// fifo is the unprotected baseline's buffer: unbounded, first in first out.
type fifo struct {
	mu     sync.Mutex
	items  []rawDelivery
	head   int
	wake   chan struct{}
	peak   int
	active int // being handled
}

func (f *fifo) push(d rawDelivery) {
	f.mu.Lock()
	f.items = append(f.items, d)
	if n := len(f.items) - f.head + f.active; n > f.peak {
		f.peak = n
	}
	f.mu.Unlock()
	select {
	case f.wake <- struct{}{}:
	default:
	}
}

func (f *fifo) pop(ctx context.Context) (rawDelivery, bool) {
	for ctx.Err() == nil {
		f.mu.Lock()
		if f.head < len(f.items) {
			d := f.items[f.head]
			f.items[f.head] = rawDelivery{}
			f.head++
			if f.head > 1024 && f.head*2 > len(f.items) {
				f.items = append(f.items[:0], f.items[f.head:]...)
				f.head = 0
			}
			f.active++
			f.mu.Unlock()
			return d, true
		}
		f.mu.Unlock()
		select {
		case <-ctx.Done():
			return rawDelivery{}, false
		case <-f.wake:
		}
	}
	return rawDelivery{}, false
}

func (f *fifo) done() {
	f.mu.Lock()
	f.active--
	f.mu.Unlock()
}

// startBaseline runs the unprotected consumer: the broker's client pulls
// everything into an unbounded FIFO; workers run every message, expired or
// not, without a deadline on the handler's context.
func startBaseline(ctx context.Context, q queue, spec trialSpec, rec *recorder) (func() (consumerStats, error), error) {
	f := &fifo{wake: make(chan struct{}, spec.workers)}
	var fetched atomic.Int64
	stopRaw, err := q.raw(ctx, func(d rawDelivery) {
		fetched.Add(1)
		f.push(d)
	})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for range spec.workers {
		wg.Go(func() {
			for {
				d, ok := f.pop(wctx)
				if !ok {
					return
				}
				start := time.Now()
				err := sleep(wctx, spec.cost)
				rec.run(d.msg, start, time.Now(), err == nil)
				d.ack()
				f.done()
			}
		})
	}
	return func() (consumerStats, error) {
		stopRaw()
		cancel()
		wg.Wait()
		f.mu.Lock()
		defer f.mu.Unlock()
		return consumerStats{fetched: int(fetched.Load()), peakInFlight: f.peak}, nil
	}, nil
}

// startSluice runs the protected consumer on one sluice route.
func startSluice(ctx context.Context, q queue, spec trialSpec, rec *recorder) (func() (consumerStats, error), error) {
	src, err := q.source(ctx, spec.window)
	if err != nil {
		return nil, err
	}
	route := consumer.Route{
		Name: spec.name, Source: src, Criticality: backpressure.CriticalPlus,
		Workers: spec.workers, MaxInFlight: spec.window, MaxInFlightBytes: windowBytes(spec.window, spec.payload),
		MinFetch: max(1, spec.workers/2),
		Retry:    consumer.RetryPolicy{MaxAttempts: 1},
		Handler: func(hctx context.Context, m *consumer.Message) error {
			lm, ok := decode(m.Value)
			if !ok {
				return consumer.Permanent(errors.New("undecodable"))
			}
			start := time.Now()
			err := sleep(hctx, spec.cost)
			rec.run(lm, start, time.Now(), err == nil)
			return err
		},
	}
	opts := consumer.Options{ShutdownGrace: time.Second, Observer: spec.observer}
	if spec.deadline > 0 {
		route.Expiry = expiry.Policy{UseHeader: true}
		route.OnExpired = consumer.ExpiredAck
		// Start-by margin: a worker sheds (drops, acked) a message with
		// less than margin left instead of starting work that would most
		// likely finish late.
		route.ShedNearDeadline = spec.margin
		route.OnShed = consumer.ShedAck
	}
	if spec.tune != nil {
		spec.tune(&route)
	}
	c, err := consumer.New(opts, route)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(rctx) }()
	return func() (consumerStats, error) {
		cancel()
		err := <-errc
		if errors.Is(err, consumer.ErrStuckHandlers) {
			err = nil // their messages were returned; the trial's figures stand
		}
		if closer, ok := src.(interface{ Close() error }); ok {
			_ = closer.Close()
		}
		s := c.Stats()[0]
		cut := rec.cutCount()
		return consumerStats{
			fetched:      int(s.Fetched),
			expired:      max(0, int(s.Settled[consumer.OutcomeExpired])-cut),
			shed:         int(s.Settled[consumer.OutcomeShed]),
			peakInFlight: s.PeakInFlight,
		}, err
	}, nil
}

// windowBytes is a route's byte window for n messages of payload bytes:
// room for headers and slack, so the message count is the binding limit.
func windowBytes(n, payload int) int64 {
	return int64(n) * int64(max(4<<10, 2*(payload+512)))
}

// cutCount is the number of runs cut off by their deadline (the consumer
// settles those as expired too).
func (r *recorder) cutCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.late - (r.handled - r.good)
}
