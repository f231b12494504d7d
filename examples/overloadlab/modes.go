package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
)

// dropRow is one policy of the drop comparison.
type dropRow struct {
	policy string
	note   string // why a policy has no figures, when it has none
	res    result
	ran    bool
}

// dropPolicies lists the comparison in the order of seed 002's table:
// the unprotected consumer, the plain bounded queue and sluice's minimal
// route, then sluice routes whose local queue of
// fetched-but-not-started messages is bounded at -drop-queue with each drop
// policy (the window leaves room above it, so the route keeps pulling and
// the policy decides what is shed), then two bounds the broker itself can
// enforce on a JetStream stream, and sluice with expiry alone and with the
// start-by margin. Every sluice row checks deadlines at fetch and before
// the handler; shed messages are acked (dropped), as in the seed.
func dropPolicies(cfg config, rate float64) []struct {
	policy string
	spec   trialSpec
} {
	mk := func(name string, k kind, margin time.Duration, lim limits, tune func(*consumer.Route)) trialSpec {
		s := cfg.spec(name, k, rate)
		s.window = cfg.windowFor(cfg.workers)
		s.margin, s.limits, s.highShare = margin, lim, cfg.dropHigh
		if tune != nil {
			s.window = cfg.dropQueue + cfg.workers + 8
			s.tune = tune
		}
		return s
	}
	queue := func(order consumer.QueueOrder, drop consumer.DropPolicy) func(*consumer.Route) {
		return func(r *consumer.Route) {
			r.Overload.Queue = consumer.QueuePolicy{Order: order, DropWhenFull: drop, MaxLength: cfg.dropQueue}
			r.Overload.OnShed = consumer.ShedAck
		}
	}
	n := cfg.dropQueue
	margin := cfg.marginFor(cfg.cost, cfg.deadline)
	return []struct {
		policy string
		spec   trialSpec
	}{
		{"unbounded FIFO (unprotected)", mk("d_fifo", unprotected, 0, limits{}, nil)},
		{fmt.Sprintf("plain client, bounded queue %d, tail drop + expiry check", cfg.queueCap), mk("d_plain", boundedQueue, 0, limits{}, nil)},
		{"sluice minimal (defaults)", mk("d_minimal", sluiceMinimal, 0, limits{}, nil)},
		{fmt.Sprintf("tail-drop (queue %d, DropNewest)", n), mk("d_tail", sluiceTuned, 0, limits{}, queue(consumer.QueueFIFO, consumer.DropNewest))},
		{fmt.Sprintf("head-drop (queue %d, DropOldest)", n), mk("d_head", sluiceTuned, 0, limits{}, queue(consumer.QueueFIFO, consumer.DropOldest))},
		{fmt.Sprintf("LIFO + drop oldest (queue %d)", n), mk("d_lifo", sluiceTuned, 0, limits{}, queue(consumer.QueueLIFO, consumer.DropOldest))},
		{fmt.Sprintf("random drop (queue %d)", n), mk("d_random", sluiceTuned, 0, limits{}, queue(consumer.QueueFIFO, consumer.DropRandom))},
		{fmt.Sprintf("by criticality (queue %d, DropLowestCriticality)", n), mk("d_crit", sluiceTuned, 0, limits{}, queue(consumer.QueueFIFO, consumer.DropLowestCriticality))},
		{fmt.Sprintf("broker tail-drop (stream %d, DiscardNew)", n), mk("d_btail", sluiceTuned, 0, limits{maxMsgs: n, dropNew: true}, nil)},
		{fmt.Sprintf("broker head-drop (stream %d, DiscardOld)", n), mk("d_bhead", sluiceTuned, 0, limits{maxMsgs: n}, nil)},
		{"sluice window 2×workers, expiry only", mk("d_expiry", sluiceTuned, 0, limits{}, nil)},
		{fmt.Sprintf("sluice tuned (window 2×workers, expiry + start-by %v)", margin), mk("d_margin", sluiceTuned, margin, limits{}, nil)},
	}
}

func runDrop(ctx context.Context, b broker, cfg config, rep *report) error {
	rate := cfg.dropLoad * rep.capacity
	for _, p := range dropPolicies(cfg, rate) {
		row := dropRow{policy: p.policy}
		r, err := runTrial(ctx, b, p.spec)
		switch {
		case errors.Is(err, errUnsupported):
			row.note = unsupportedNote(b, err)
		case err != nil:
			return fmt.Errorf("%s: %w", p.policy, err)
		default:
			row.res, row.ran = r, true
		}
		rep.drop = append(rep.drop, row)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}

// bpRow is one queue of the backpressure demo.
type bpRow struct {
	queue       string
	note        string // why the row has no figures
	produced    int
	rate        float64 // producer's achieved rate, msg/s
	perSecond   []int   // queue length sampled at the start of each second
	medianLast  time.Duration
	maxWait     time.Duration
	leftAtStop  int
	consumed    int
	consumeRate float64
}

// runBackpressure offers bpRate msg/s to a consumer of bpWorkers × bpCost:
// once through an unbounded stream into the unprotected consumer, once
// through a stream bounded at bpQueue (DiscardNew) with a producer that
// blocks (retries) while it is full, into sluice.
func runBackpressure(ctx context.Context, b broker, cfg config, rep *report) error {
	for _, bounded := range []bool{false, true} {
		row, err := bpTrial(ctx, b, cfg, bounded)
		if errors.Is(err, errUnsupported) {
			row.note = unsupportedNote(b, err)
			rep.bp = append(rep.bp, row)
			continue
		}
		if err != nil {
			return err
		}
		rep.bp = append(rep.bp, row)
	}
	return nil
}

func bpTrial(ctx context.Context, b broker, cfg config, bounded bool) (bpRow, error) {
	row := bpRow{queue: "unbounded"}
	spec := trialSpec{name: "bp_unbounded", kind: unprotected, workers: cfg.bpWorkers, cost: cfg.bpCost, window: max(2*cfg.bpWorkers, 4),
		observer: cfg.observer, payload: cfg.payload, work: sleepWork(cfg.bpCost)}
	if bounded {
		row.queue = fmt.Sprintf("bounded (%d) + blocking put", cfg.bpQueue)
		spec.name, spec.kind = "bp_bounded", sluiceTuned
		spec.limits = limits{maxMsgs: cfg.bpQueue, dropNew: true}
	}
	q, err := b.queue(ctx, spec.name, spec.limits)
	if err != nil {
		return row, err
	}
	defer q.close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	rec := &recorder{}
	stop, err := startConsumer(ctx, q, spec, rec)
	if err != nil {
		return row, err
	}
	start := time.Now()
	nSamples := max(1, int(cfg.bpDur/time.Second))
	samples := make(chan []int, 1)
	go func() {
		var s []int
		t := time.NewTicker(time.Second)
		defer t.Stop()
		for {
			d, _ := q.depth(ctx)
			s = append(s, d)
			if len(s) >= nSamples {
				break
			}
			select {
			case <-t.C:
			case <-ctx.Done():
				samples <- s
				return
			}
		}
		samples <- s
	}()
	var id uint64
	tick := time.NewTicker(time.Millisecond)
produce:
	for {
		now := <-tick.C
		el := now.Sub(start)
		if el >= cfg.bpDur {
			break
		}
		for row.produced < int(el.Seconds()*cfg.bpRate) {
			m := labMsg{id: id, pub: time.Now()}
			if !bounded {
				if err := q.publish(ctx, m); err != nil {
					return row, err
				}
			} else {
				// Blocking put: retry while the queue is full, so the
				// producer runs at the consumer's pace.
				for {
					if time.Since(start) >= cfg.bpDur || ctx.Err() != nil {
						break produce
					}
					m.pub = time.Now()
					err := q.put(ctx, m)
					if err == nil {
						break
					}
					if !errors.Is(err, errRejected) {
						return row, err
					}
					time.Sleep(time.Millisecond)
				}
			}
			id++
			row.produced++
		}
	}
	tick.Stop()
	q.flush(ctx)
	elapsed := time.Since(start)
	row.rate = float64(row.produced) / elapsed.Seconds()
	row.leftAtStop, _ = q.depth(ctx)
	row.perSecond = <-samples
	if _, err := stop(); err != nil && !errors.Is(err, context.Canceled) {
		return row, err
	}
	var waits []time.Duration
	for _, x := range rec.snapshot() {
		waits = append(waits, x.start.Sub(x.pub))
		if x.ok {
			row.consumed++
		}
	}
	row.consumeRate = float64(row.consumed) / elapsed.Seconds()
	if len(waits) > 0 {
		row.maxWait = slices.Max(waits)
		last := waits[max(0, len(waits)-300):]
		row.medianLast = percentile(slices.Clone(last), 0.5)
	}
	return row, nil
}

// isoRow is one phase of the isolation check.
type isoRow struct {
	phase          string
	offered        float64
	good           int
	p50, p99       time.Duration
	reportsHeld    int // report messages stuck in their handler or window
	reportsFetched int
	p99s           []time.Duration // every round's p99, sorted (on the median row)
}

// runIsolation runs a critical "orders" route at -iso-load × capacity next
// to a sheddable "reports" route in the same consumer, once with reports
// idle and once with every report handler stuck until shutdown, and
// compares the orders' latency: the report route may fill only its own
// window and workers.
func runIsolation(ctx context.Context, b broker, cfg config, rep *report) error {
	// Interleave the phases and report each phase's median round, so a
	// burst of machine noise does not decide the comparison.
	rounds := make([][]isoRow, 2)
	for i := range cfg.isoRounds {
		for j, stuck := range []bool{false, true} {
			row, err := isoTrial(ctx, b, cfg, rep.capacity*cfg.isoLoad, stuck, i)
			if err != nil {
				return err
			}
			rounds[j] = append(rounds[j], row)
		}
	}
	for _, rs := range rounds {
		slices.SortFunc(rs, func(a, b isoRow) int { return int(a.p99 - b.p99) })
		med := rs[len(rs)/2]
		for _, r := range rs {
			med.p99s = append(med.p99s, r.p99)
		}
		rep.iso = append(rep.iso, med)
	}
	return nil
}

func isoTrial(ctx context.Context, b broker, cfg config, rate float64, stuck bool, round int) (isoRow, error) {
	row := isoRow{phase: "reports idle", offered: rate}
	tag := fmt.Sprintf("idle%d", round)
	if stuck {
		row.phase, tag = "reports handler stuck", fmt.Sprintf("stuck%d", round)
	}
	orders, err := b.queue(ctx, "iso_orders_"+tag, limits{})
	if err != nil {
		return row, err
	}
	defer orders.close()
	reports, err := b.queue(ctx, "iso_reports_"+tag, limits{})
	if err != nil {
		return row, err
	}
	defer reports.close()
	oSrc, err := orders.source(ctx, srcOpts{messages: cfg.windowFor(cfg.workers), bytes: windowBytes(cfg.windowFor(cfg.workers), cfg.payload), tuned: true})
	if err != nil {
		return row, err
	}
	const reportWindow = 4
	rSrc, err := reports.source(ctx, srcOpts{messages: reportWindow, bytes: windowBytes(reportWindow, cfg.payload), tuned: true})
	if err != nil {
		return row, err
	}
	rec := &recorder{}
	c, err := consumer.New(consumer.Options{ShutdownGrace: 200 * time.Millisecond, Observer: cfg.observer},
		consumer.Route{
			Name:    "orders_" + tag,
			Source:  oSrc,
			Workers: cfg.workers,
			Expiry:  expiry.Policy{},
			Retry:   consumer.RetryPolicy{MaxAttempts: 1},
			Handler: func(hctx context.Context, m *consumer.Message) error {
				lm, _ := decode(m.Value)
				start := time.Now()
				err := sleep(hctx, cfg.cost)
				rec.run(lm, start, time.Now(), err == nil, false)
				return err
			},
			Window:   consumer.WindowPolicy{Messages: cfg.windowFor(cfg.workers), Bytes: windowBytes(cfg.windowFor(cfg.workers), cfg.payload)},
			Overload: consumer.OverloadPolicy{Criticality: backpressure.Critical},
		},
		consumer.Route{
			Name:    "reports_" + tag,
			Source:  rSrc,
			Workers: 2,
			Expiry:  expiry.Policy{IgnoreHeader: true},
			Retry:   consumer.RetryPolicy{MaxAttempts: 1},
			Handler: func(hctx context.Context, m *consumer.Message) error {
				if stuck {
					<-hctx.Done() // a handler stuck on a dead dependency
					return hctx.Err()
				}
				return sleep(hctx, cfg.cost)
			},
			Window:   consumer.WindowPolicy{Messages: reportWindow, Bytes: windowBytes(reportWindow, cfg.payload)},
			Overload: consumer.OverloadPolicy{Criticality: backpressure.Sheddable},
		})
	if err != nil {
		return row, err
	}
	if err := waitReady(ctx, orders, reports); err != nil {
		return row, err
	}
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- c.Run(rctx) }()

	start := time.Now()
	tick := time.NewTicker(time.Millisecond)
	var sent, reportsSent int
	for {
		now := <-tick.C
		el := now.Sub(start)
		if el >= cfg.isoDur {
			break
		}
		for sent < int(el.Seconds()*rate) {
			t := time.Now()
			if err := orders.publish(ctx, labMsg{id: uint64(sent), pub: t, deadline: t.Add(cfg.deadline), crit: backpressure.Critical}); err != nil {
				return row, err
			}
			sent++
		}
		for reportsSent < int(el.Seconds()*50) { // 50 reports/s
			if err := reports.publish(ctx, labMsg{id: uint64(reportsSent), pub: time.Now(), crit: backpressure.Sheddable}); err != nil {
				return row, err
			}
			reportsSent++
		}
	}
	tick.Stop()
	orders.flush(ctx)
	reports.flush(ctx)
	time.Sleep(cfg.deadline + cfg.cost)
	st := c.Stats()
	row.reportsHeld, row.reportsFetched = st[1].Held, int(st[1].Fetched)
	cancel()
	if err := <-errc; err != nil && !errors.Is(err, consumer.ErrStuckHandlers) {
		return row, err
	}
	all := summarize(rec.snapshot(), window{until: time.Now().Add(time.Hour)}, nil)
	row.good, row.p50, row.p99 = all.good, all.p50, all.p99
	return row, nil
}

func unsupportedNote(b broker, err error) string {
	return "not on " + b.name() + ": " + strings.TrimPrefix(err.Error(), errUnsupported.Error()+": ")
}
