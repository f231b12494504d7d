package main

import (
	"context"
	"errors"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
)

// The minimal route is what a new user writes: Name, Source and Handler
// (deadlines come from the Sluice-Deadline header by default), on a Source
// with its default options. Workers is set too: it is the handler's
// concurrency, the one number that describes the handler being emulated,
// so every consumer gets the same.

// sourceFor is the route window a trial's Source is made for.
func sourceFor(spec trialSpec) srcOpts {
	if spec.kind == sluiceMinimal {
		return srcOpts{}
	}
	return srcOpts{messages: spec.window, bytes: windowBytes(spec.window, spec.payload), tuned: true}
}

// minimalRoute is the route with the least configuration.
func minimalRoute(name string, src consumer.Source, workers int, h consumer.Handler) consumer.Route {
	return consumer.Route{Name: name, Source: src, Handler: h, Workers: workers}
}

// tunedRoute is the route with the documentation's advice beyond the
// minimal route: the window left to find its size (Window.Messages 0)
// unless -window fixes one (then with a low-water mark of half the
// workers), no ShedNearDeadline unless -margin sets one (predictive expiry
// decides; the option is an explicit floor), expired and shed messages
// acked, one attempt (the handler never fails), CriticalPlus; its Source
// gets the lab's tuned options (see sourceFor).
func tunedRoute(spec trialSpec, src consumer.Source, h consumer.Handler) consumer.Route {
	r := consumer.Route{
		Name:     spec.name,
		Source:   src,
		Handler:  h,
		Workers:  spec.workers,
		Retry:    consumer.RetryPolicy{MaxAttempts: 1},
		Overload: consumer.OverloadPolicy{Criticality: backpressure.CriticalPlus},
	}
	if spec.window > 0 {
		r.Window = consumer.WindowPolicy{Messages: spec.window, Bytes: windowBytes(spec.window, spec.payload), MinFetch: max(1, spec.workers/2)}
	}
	r.Expiry = expiry.Policy{IgnoreHeader: true}
	if spec.deadline > 0 {
		r.Expiry = expiry.Policy{}
		r.DeadLetter.OnExpired = consumer.ExpiredAck
		r.Overload.ShedNearDeadline = spec.margin
		r.Overload.OnShed = consumer.ShedAck
	}
	return r
}

// startByMargin is the drop mode's start-by margin for a handler of cost and a
// deadline: max(2×cost, deadline/5), but never so large that a message
// cannot start at all (at most deadline − cost, at least cost).
func startByMargin(cost, deadline time.Duration) time.Duration {
	return min(max(2*cost, deadline/5), max(cost, deadline-cost))
}

// startSluice runs one sluice route, minimal or tuned.
func startSluice(ctx context.Context, q queue, spec trialSpec, rec *recorder) (func() (consumerStats, error), error) {
	src, err := q.source(ctx, sourceFor(spec))
	if err != nil {
		return nil, err
	}
	h := func(hctx context.Context, m *consumer.Message) error {
		lm, ok := decode(m.Value)
		if !ok {
			return consumer.Permanent(errors.New("undecodable"))
		}
		start := time.Now()
		degraded, err := spec.work(hctx, lm)
		rec.run(lm, start, time.Now(), err == nil, degraded)
		return err
	}
	var route consumer.Route
	if spec.kind == sluiceMinimal {
		route = minimalRoute(spec.name, src, spec.workers, h)
	} else {
		route = tunedRoute(spec, src, h)
	}
	if spec.tune != nil {
		spec.tune(&route)
	}
	opts := consumer.Options{ShutdownGrace: time.Second, Observer: spec.observer}
	if spec.resource != nil {
		opts.Resource = spec.resource
	}
	c, err := consumer.New(opts, route)
	if err != nil {
		return nil, err
	}
	if err := waitReady(ctx, q); err != nil {
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
		return consumerStats{
			fetched: int(s.Fetched),
			// Runs cut off by their deadline are settled as expired too;
			// they are counted as late runs instead.
			expired:      max(0, int(s.Settled[consumer.OutcomeExpired])-rec.cutCount()),
			shed:         int(s.Settled[consumer.OutcomeShed]),
			peakInFlight: s.Window.Peak,
		}, err
	}, nil
}

// waitReady waits until each queue's Source can deliver: a Kafka Source
// joins its group when its route attaches it (consumer.New), and a trial's
// clock must not run while the group forms.
func waitReady(ctx context.Context, qs ...queue) error {
	for _, q := range qs {
		if r, ok := q.(interface{ ready(context.Context) error }); ok {
			if err := r.ready(ctx); err != nil {
				return err
			}
		}
	}
	return nil
}

// windowBytes is a route's byte window for n messages of payload bytes:
// room for headers and slack, so the message count is the binding limit.
func windowBytes(n, payload int) int64 {
	return int64(n) * int64(max(4<<10, 2*(payload+512)))
}

// cutCount is the number of runs cut off by their context (the consumer
// settles those as expired).
func (r *recorder) cutCount() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, x := range r.runs {
		if !x.ok {
			n++
		}
	}
	return n
}
