package main

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// fifo is the unprotected consumer's buffer: unbounded, first in first out.
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

// startUnprotected runs the unprotected consumer: the broker's client pulls
// everything into an unbounded FIFO; workers run every message, expired or
// not, without a deadline on the handler's context.
func startUnprotected(ctx context.Context, q queue, spec trialSpec, rec *recorder) (func() (consumerStats, error), error) {
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
				degraded, err := spec.work(wctx, d.msg)
				rec.run(d.msg, start, time.Now(), err == nil, degraded)
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

// startBoundedQueue runs seed 002's protected consumer without sluice: the
// broker's client pulls everything, as for the unprotected consumer, but
// into a queue of spec.queueCap messages; an arrival that finds it full is
// dropped (acked: a counted loss, like sluice's ShedAck). A worker checks
// the deadline before running a message and drops it (acked) when it has
// passed. It is what a careful engineer writes in forty lines.
func startBoundedQueue(ctx context.Context, q queue, spec trialSpec, rec *recorder) (func() (consumerStats, error), error) {
	ch := make(chan rawDelivery, spec.queueCap)
	var fetched, dropped, expired, active atomic.Int64
	var peak atomic.Int64
	stopRaw, err := q.raw(ctx, func(d rawDelivery) {
		fetched.Add(1)
		select {
		case ch <- d:
			if n := int64(len(ch)) + active.Load(); n > peak.Load() {
				peak.Store(n)
			}
		default:
			dropped.Add(1)
			d.ack()
		}
	})
	if err != nil {
		return nil, err
	}
	wctx, cancel := context.WithCancel(ctx)
	// What a degraded-mode handler of this consumer can read: how full its
	// queue is.
	hctx := withQueueFill(wctx, func() float64 { return float64(len(ch)) / float64(cap(ch)) })
	var wg sync.WaitGroup
	for range spec.workers {
		wg.Go(func() {
			for {
				var d rawDelivery
				select {
				case d = <-ch:
				case <-wctx.Done():
					return
				}
				if !d.msg.deadline.IsZero() && !time.Now().Before(d.msg.deadline) {
					expired.Add(1)
					d.ack()
					continue
				}
				active.Add(1)
				start := time.Now()
				degraded, err := spec.work(hctx, d.msg)
				rec.run(d.msg, start, time.Now(), err == nil, degraded)
				d.ack()
				active.Add(-1)
			}
		})
	}
	return func() (consumerStats, error) {
		stopRaw()
		cancel()
		wg.Wait()
		return consumerStats{fetched: int(fetched.Load()), expired: int(expired.Load()),
			shed: int(dropped.Load()), peakInFlight: int(peak.Load())}, nil
	}, nil
}

type queueFillKey struct{}

// withQueueFill gives a plain consumer's handler its queue's fill level
// (0 to 1), the simplest overload signal a consumer without sluice has.
func withQueueFill(ctx context.Context, fill func() float64) context.Context {
	return context.WithValue(ctx, queueFillKey{}, fill)
}

// queueFill returns the fill level withQueueFill put on ctx, and whether
// there was one.
func queueFill(ctx context.Context) (float64, bool) {
	f, ok := ctx.Value(queueFillKey{}).(func() float64)
	if !ok {
		return 0, false
	}
	return f(), true
}
