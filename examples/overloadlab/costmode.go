package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// costConfig is -mode cost (issue 11, section 4): a mix of cheap and dear
// messages, each declaring its cost (payload and the Sluice-Cost header).
type costConfig struct {
	cheap, dear time.Duration
	cheapShare  float64 // by count
	load        float64
	dur         time.Duration
	queueUnits  int    // the cost-weighted route's queue bound; 0: one dear run per worker
	order       string // the cost-weighted route's queue order: fifo or cheapest
}

func (c *config) addCostFlags(fs *flag.FlagSet) {
	p := &c.costMix
	fs.DurationVar(&p.cheap, "cost-cheap", time.Millisecond, "cost mode: the cheap messages' cost")
	fs.DurationVar(&p.dear, "cost-dear", 100*time.Millisecond, "cost mode: the dear messages' cost")
	fs.Float64Var(&p.cheapShare, "cost-cheap-share", 0.9, "cost mode: share of the messages (by count) that are cheap")
	fs.Float64Var(&p.load, "cost-load", 3, "cost mode: offered load × capacity (in cost units)")
	fs.DurationVar(&p.dur, "cost-duration", 10*time.Second, "cost mode: how long each consumer is offered the load")
	fs.IntVar(&p.queueUnits, "cost-queue", 0, "cost mode: the cost-weighted route's queue bound in units (ms); 0 means one dear message per worker")
	fs.StringVar(&p.order, "cost-order", "cheapest", "cost mode: the cost-weighted route's queue order, cheapest (first) or fifo")
}

func (c *config) parseCostFlags(set map[string]bool) error {
	p := &c.costMix
	if c.quick && !set["cost-duration"] {
		p.dur = 4 * time.Second
	}
	if p.order != "fifo" && p.order != "cheapest" {
		return errors.New("-cost-order: fifo or cheapest")
	}
	if p.cheap <= 0 || p.queueUnits < 0 || p.dear <= p.cheap || !(p.cheapShare > 0 && p.cheapShare < 1) || p.load <= 0 || p.dur <= 0 {
		return errors.New("-cost-*: cheap > 0, dear above cheap, share in (0, 1), load and duration > 0")
	}
	return nil
}

func (p costConfig) mix() []mixEntry {
	return []mixEntry{{p.cheapShare, p.cheap}, {1 - p.cheapShare, p.dear}}
}

// mean is the mix's mean cost per message.
func (p costConfig) mean() time.Duration {
	return time.Duration(p.cheapShare*float64(p.cheap) + (1-p.cheapShare)*float64(p.dear))
}

// costRow is one consumer in cost mode.
type costRow struct {
	kind       kind
	label      string
	short      string
	units      float64 // goodput in cost units: handler-seconds of on-time work per second
	capUnits   float64 // capacity in the same units
	count      float64 // goodput, msg/s
	cheapP50   time.Duration
	cheapP99   time.Duration
	dearP99    time.Duration
	cheapGood  int
	dearGood   int
	cheapShare float64 // of the on-time messages, the cheap ones
	wasted     int
	// busy is the share of the workers' time spent in handler runs (any
	// outcome) in the measured window; cheapRun and dearRun are each
	// class's mean run time, as the handler saw it.
	busy              float64
	cheapRun, dearRun time.Duration
	// onTimeBusy is the share of the workers' time spent in runs that
	// succeeded on time: the work done, in the handler's own seconds.
	onTimeBusy float64
}

func runCost(ctx context.Context, b broker, cfg config, rep *report, w io.Writer) error {
	p := cfg.costMix
	// Capacity in cost units: the workers' handler-seconds per second, as
	// measured on the mix (the unprotected consumer draining a backlog).
	capa, err := capacityMix(ctx, b, cfg, p)
	if err != nil {
		return err
	}
	capMsgs := capa.msgs
	fmt.Fprintf(w, "overloadlab cost: broker %s, %d workers, %.0f%% × %v + %.0f%% × %v (mean %v), deadline %v; capacity %.0f msg/s = %.2f handler-s/s (mean runs: cheap %.2f ms, dear %.1f ms)\n",
		b.name(), cfg.workers, 100*p.cheapShare, p.cheap, 100*(1-p.cheapShare), p.dear, p.mean(), cfg.deadline, capMsgs, capa.units, msf(capa.cheapRun), msf(capa.dearRun))
	dearMS := int(max(1, p.dear.Milliseconds()))
	// By default the queue holds a dear run per worker, cheapest first:
	// cheap messages never wait behind a dear one, dear ones keep their
	// workers (-cost-queue and -cost-order change both).
	queueUnits := cfg.workers * dearMS
	if p.queueUnits > 0 {
		queueUnits = p.queueUnits
	}
	order, orderName := consumer.QueueFIFO, "FIFO"
	if p.order == "cheapest" {
		order, orderName = consumer.QueueCheapestFirst, "cheapest first"
	}
	type variant struct {
		k     kind
		label string
		short string // in cost.png
		tune  func(*consumer.Route)
	}
	var vs []variant
	for _, k := range cfg.kinds {
		vs = append(vs, variant{k, k.String(), k.String(), nil})
		if k != sluiceMinimal {
			continue
		}
		vs = append(vs,
			variant{k, fmt.Sprintf("sluice, queue bounded by count (%d, ShedAck)", cfg.queueCap), "sluice by count", func(r *consumer.Route) {
				r.Window.Messages = cfg.queueCap + cfg.workers + 8
				r.Overload.Queue = consumer.QueuePolicy{MaxLength: cfg.queueCap}
				r.Overload.OnShed = consumer.ShedAck
			}},
			variant{k, fmt.Sprintf("sluice, cost-weighted (Sluice-Cost; queue %d units %s, at most %d running, ShedAck)", queueUnits, orderName, (cfg.workers-1)*dearMS+10), "sluice by cost", func(r *consumer.Route) {
				r.Window.Cost = consumer.CostPolicy{Header: consumer.CostHeader, Max: dearMS, MaxRunning: (cfg.workers-1)*dearMS + 10}
				r.Window.Messages = cfg.workers*dearMS + 2*queueUnits
				r.Overload.Queue = consumer.QueuePolicy{MaxCost: queueUnits, Order: order}
				r.Overload.OnShed = consumer.ShedAck
			}})
	}
	for i, v := range vs {
		s := cfg.spec(fmt.Sprintf("cost_%d", i), v.k, p.load*capMsgs)
		s.cost, s.duration, s.mix, s.keepRuns, s.drain = p.mean(), p.dur, p.mix(), true, 0
		s.warmup = min(cfg.deadline+time.Second, p.dur/2)
		s.tune = v.tune
		r, err := runTrial(ctx, b, s)
		if err != nil {
			return fmt.Errorf("cost %v: %w", v.label, err)
		}
		row := costRowOf(r, p, capa)
		row.label, row.short = v.label, v.short
		rep.cost = append(rep.cost, row)
	}
	return cfg.emitWithPlot(w, "cost", costTable(rep.cost, cfg), func(png string) error { return plotCost(rep.cost, png) })
}

// plotCost draws each consumer's goodput in cost units (bars, share of
// capacity) and the cheap class's p99 (points, log scale), with the
// targets marked.
func plotCost(rows []costRow, file string) error {
	if len(rows) == 0 {
		return nil
	}
	good, p99 := plot.New(), plot.New()
	good.Title.Text = "Goodput in cost units (on-time handler-seconds per second)"
	good.Y.Label.Text = "% of capacity"
	p99.Title.Text = "p99 of the cheap class (successes)"
	p99.Y.Label.Text = "ms (log scale)"
	var shares plotter.Values
	var pts plotter.XYs
	var names []string
	for i, r := range rows {
		shares = append(shares, 100*r.units/r.capUnits)
		if r.cheapP99 > 0 {
			pts = append(pts, plotter.XY{X: float64(i), Y: max(float64(r.cheapP99)/float64(time.Millisecond), 1)})
		}
		names = append(names, r.short)
	}
	bars, err := plotter.NewBarChart(shares, vg.Points(28))
	if err != nil {
		return err
	}
	bars.Color = color.RGBA{G: 120, B: 180, A: 255}
	good.Add(bars)
	sc, err := plotter.NewScatter(pts)
	if err != nil {
		return err
	}
	sc.Color = color.RGBA{R: 200, A: 255}
	sc.Radius = vg.Points(4)
	p99.Add(sc)
	for _, ref := range []struct {
		pl   *plot.Plot
		y    float64
		name string
	}{{good, 95, "target: 95% of capacity"}, {p99, 50, "target: 50 ms"}} {
		l, err := plotter.NewLine(plotter.XYs{{X: -0.5, Y: ref.y}, {X: float64(len(rows)) - 0.5, Y: ref.y}})
		if err != nil {
			return err
		}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		l.Color = color.Gray{Y: 120}
		ref.pl.Add(l)
		ref.pl.Legend.Add(ref.name, l)
	}
	for _, p := range []*plot.Plot{good, p99} {
		p.NominalX(names...)
		p.Add(plotter.NewGrid())
		p.X.Min, p.X.Max = -0.5, float64(len(rows))-0.5
		p.Legend.Top = true
	}
	good.Y.Min, good.Y.Max = 0, 130
	p99.Y.Scale, p99.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{}
	p99.Y.Min = 1
	for _, xy := range pts {
		p99.Y.Max = max(p99.Y.Max, 3*xy.Y)
	}
	return writeTwoPlots(good, p99, file)
}

// mixCapacity is what the workers do with a backlog of the mix: messages
// and declared cost units (handler-seconds) per second, and each class's
// mean run time as the handler measured it (on this VM a 1 ms timer takes
// about 2 ms under load: the lab's "1 ms" message costs its worker twice
// what it declares).
type mixCapacity struct {
	msgs, units       float64
	cheapRun, dearRun time.Duration
}

// capacityMix measures how many messages of the mix the workers handle per
// second, draining a backlog, how much declared cost (handler-seconds) per
// second, and what each class's runs took.
func capacityMix(ctx context.Context, b broker, cfg config, p costConfig) (mixCapacity, error) {
	nominal := float64(cfg.workers) / p.mean().Seconds()
	s := cfg.spec("cost_cap", unprotected, 0)
	s.cost, s.deadline, s.duration, s.warmup, s.mix, s.keepRuns = p.mean(), 0, cfg.capDur, 0, p.mix(), true
	s.drain = cfg.capDur
	s.prefill = int(nominal*2*cfg.capDur.Seconds()*1.2) + 100
	r, err := runTrial(ctx, b, s)
	if err != nil {
		return mixCapacity{}, err
	}
	msgs, err := drainRate(r.runs, cfg.workers, p.mean())
	if err != nil {
		return mixCapacity{}, err
	}
	w := window{until: r.start.Add(time.Hour)}
	all := summarize(r.runs, w, nil)
	c := mixCapacity{msgs: msgs, units: msgs * all.units.Seconds() / float64(all.good)}
	_, c.cheapRun, c.dearRun = runTimes(r.runs, w, p)
	return c, nil
}

// runTimes returns the handler time of the runs ending in w (any outcome)
// and each class's mean run time (of the runs that succeeded: a run cut
// off at the end of a trial is not a run of its class).
func runTimes(runs []runRec, w window, p costConfig) (busy, cheap, dear time.Duration) {
	var nCheap, nDear time.Duration
	for _, x := range runs {
		if !w.has(x.end) {
			continue
		}
		d := x.end.Sub(x.start)
		busy += d
		if !x.ok {
			continue
		}
		switch x.cost {
		case p.cheap:
			cheap += d
			nCheap++
		case p.dear:
			dear += d
			nDear++
		}
	}
	return busy, cheap / max(nCheap, 1), dear / max(nDear, 1)
}

func costRowOf(r result, p costConfig, c mixCapacity) costRow {
	w := r.measureWindow()
	cheap := summarize(r.runs, w, func(x runRec) bool { return x.cost == p.cheap })
	dear := summarize(r.runs, w, func(x runRec) bool { return x.cost == p.dear })
	all := summarize(r.runs, w, nil)
	row := costRow{kind: r.spec.kind, capUnits: c.units, count: float64(all.good) / w.secs(),
		units: all.units.Seconds() / w.secs(), cheapP50: cheap.p50, cheapP99: cheap.p99, dearP99: dear.p99,
		cheapGood: cheap.good, dearGood: dear.good, wasted: r.wasted}
	if all.good > 0 {
		row.cheapShare = float64(cheap.good) / float64(all.good)
	}
	busy, onTime := time.Duration(0), time.Duration(0)
	busy, row.cheapRun, row.dearRun = runTimes(r.runs, w, p)
	for _, x := range r.runs {
		if x.onTime && w.has(x.end) {
			onTime += x.end.Sub(x.start)
		}
	}
	if workers := r.spec.workers; workers > 0 {
		all := float64(workers) * w.secs()
		row.busy, row.onTimeBusy = busy.Seconds()/all, onTime.Seconds()/all
	}
	return row
}

// msf is d in milliseconds, with decimals.
func msf(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

func costTable(rows []costRow, cfg config) string {
	p := cfg.costMix
	header := []string{"consumer", "goodput (cost units)", "% of capacity", "workers on on-time runs", "goodput (messages)", "cheap p50", "cheap p99", "dear p99", "cheap share of successes", "workers busy", "mean run cheap / dear", "wasted"}
	var out [][]string
	for _, r := range rows {
		out = append(out, []string{r.label, fmt.Sprintf("%.2f handler-s/s", r.units), fmt.Sprintf("%.0f%%", 100*r.units/r.capUnits),
			fmt.Sprintf("%.0f%%", 100*r.onTimeBusy), rate(r.count), ms(r.cheapP50), ms(r.cheapP99), ms(r.dearP99), fmt.Sprintf("%.0f%%", 100*r.cheapShare),
			fmt.Sprintf("%.0f%%", 100*r.busy), fmt.Sprintf("%.2f / %.1f ms", msf(r.cheapRun), msf(r.dearRun)), fmt.Sprint(r.wasted)})
	}
	return fmt.Sprintf("Cost mix: %.0f%% of messages cost %v, %.0f%% cost %v, at %g× capacity, %d workers, deadline %v\n"+
		"(target: cheap p99 < 50 ms and goodput in cost units ≥ 95%% of capacity; workers busy: share of the workers' time in handler runs,\n"+
		"on on-time runs: in runs that succeeded on time; mean run: what each class's successful runs took, against their declared cost)\n\n",
		100*p.cheapShare, p.cheap, 100*(1-p.cheapShare), p.dear, p.load, cfg.workers, cfg.deadline) + table(header, out)
}
