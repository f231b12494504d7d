package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"

	"github.com/sluice-go/sluice/backpressure"
)

// degradeConfig is -mode degrade (issue 11, section 2): a handler with a
// full path and a cheaper degraded one, offered a burst of load and then
// light load.
type degradeConfig struct {
	full, cheap time.Duration
	high, low   float64
	highDur     time.Duration
	lowDur      time.Duration
	fill        float64 // the plain bounded queue degrades at this fill level
}

func (c *config) addDegradeFlags(fs *flag.FlagSet) {
	d := &c.degrade
	fs.DurationVar(&d.full, "degrade-full", 20*time.Millisecond, "degrade mode: the handler's full path")
	fs.DurationVar(&d.cheap, "degrade-cheap", 4*time.Millisecond, "degrade mode: the handler's degraded path")
	fs.Float64Var(&d.high, "degrade-high", 5, "degrade mode: offered load of the burst, × full-path capacity")
	fs.Float64Var(&d.low, "degrade-low", 0.5, "degrade mode: offered load after the burst")
	fs.DurationVar(&d.highDur, "degrade-high-duration", 10*time.Second, "degrade mode: how long the burst lasts")
	fs.DurationVar(&d.lowDur, "degrade-low-duration", 6*time.Second, "degrade mode: how long the light load lasts")
	fs.Float64Var(&d.fill, "degrade-fill", 0.5, "degrade mode: the plain bounded queue's handler takes the cheap path while its queue is at least this full")
}

func (c *config) parseDegradeFlags(set map[string]bool) error {
	d := &c.degrade
	if c.quick {
		if !set["degrade-high-duration"] {
			d.highDur = 4 * time.Second
		}
		if !set["degrade-low-duration"] {
			d.lowDur = 3 * time.Second
		}
	}
	if d.full <= 0 || d.cheap <= 0 || d.cheap >= d.full || d.high <= 0 || d.low <= 0 || d.highDur <= 0 || d.lowDur <= 0 || d.fill <= 0 || d.fill > 1 {
		return errors.New("-degrade-*: paths, loads and durations must be > 0, cheap below full, fill in (0, 1]")
	}
	return nil
}

// pressed reports whether the consumer running a handler with ctx is
// pressed enough to take the degraded path: the plain bounded queue's
// handler looks at its queue, a sluice handler asks its route
// (backpressure.PressureFrom: elevated or high). The unprotected consumer
// has no signal and never degrades.
func pressed(ctx context.Context, fill float64) bool {
	if f, ok := queueFill(ctx); ok {
		return f >= fill
	}
	return backpressure.PressureFrom(ctx).Level >= backpressure.PressureElevated
}

// degradeWork takes the cheap path when pressed, the full one otherwise.
func degradeWork(d degradeConfig) work {
	return func(ctx context.Context, m labMsg) (bool, error) {
		if pressed(ctx, d.fill) {
			return true, sleep(ctx, d.cheap)
		}
		return false, sleep(ctx, d.full)
	}
}

// degradeRow is one consumer in degrade mode.
type degradeRow struct {
	kind       kind
	capacity   float64 // full path
	highGood   float64 // goodput in the burst's steady state, msg/s
	highShare  float64 // of the runs in the burst, the degraded ones
	highP99    time.Duration
	lowGood    float64
	lowP99     time.Duration
	recovery   time.Duration // from the end of the burst to the last degraded start; 0: none
	lowOffered float64
	wasted     int
	timeline   []degradeBin // the whole trial, for degrade.png
	burst      time.Duration
}

// degradeBin is one slice of a degrade trial's timeline.
type degradeBin struct {
	at       time.Duration // end of the bin, from the producer's start
	good     float64       // on-time successes ending in the bin, msg/s
	degraded float64       // of the runs started in the bin, the degraded share
}

// degradeBinWidth is the timeline's resolution.
const degradeBinWidth = 250 * time.Millisecond

// timelineOf bins r's runs.
func timelineOf(r result, total time.Duration) []degradeBin {
	n := int(total / degradeBinWidth)
	good, started, degraded := make([]int, n), make([]int, n), make([]int, n)
	for _, x := range r.runs {
		if i := int(x.end.Sub(r.start) / degradeBinWidth); x.onTime && i >= 0 && i < n {
			good[i]++
		}
		if i := int(x.start.Sub(r.start) / degradeBinWidth); i >= 0 && i < n {
			started[i]++
			if x.degraded {
				degraded[i]++
			}
		}
	}
	out := make([]degradeBin, n)
	for i := range out {
		out[i] = degradeBin{at: time.Duration(i+1) * degradeBinWidth, good: float64(good[i]) / degradeBinWidth.Seconds()}
		if started[i] > 0 {
			out[i].degraded = float64(degraded[i]) / float64(started[i])
		}
	}
	return out
}

func runDegrade(ctx context.Context, b broker, cfg config, rep *report, w io.Writer) error {
	d := cfg.degrade
	capacity, err := capacityOf(ctx, b, cfg, "deg_cap", cfg.workers, d.full)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "overloadlab degrade: broker %s, %d workers, full path %v, degraded %v, deadline %v; full-path capacity %.0f msg/s\n",
		b.name(), cfg.workers, d.full, d.cheap, cfg.deadline, capacity)
	for _, k := range cfg.kinds {
		s := cfg.spec(fmt.Sprintf("deg_%d", k), k, 0)
		s.cost = d.full
		s.phases = []phase{{d.highDur, d.high * capacity}, {d.lowDur, d.low * capacity}}
		s.work = degradeWork(d)
		s.keepRuns = true
		s.drain = 0
		r, err := runTrial(ctx, b, s)
		if err != nil {
			return fmt.Errorf("degrade %v: %w", k, err)
		}
		row := degradeRowOf(r, capacity, cfg)
		row.burst, row.timeline = d.highDur, timelineOf(r, d.highDur+d.lowDur)
		rep.degrade = append(rep.degrade, row)
	}
	return cfg.emitWithPlot(w, "degrade", degradeTable(rep.degrade, cfg), func(png string) error { return plotDegrade(rep.degrade, cfg, png) })
}

// plotDegrade draws each consumer's on-time goodput and the share of its
// runs on the degraded path over the trial, with the full-path capacity
// and the end of the burst marked.
func plotDegrade(rows []degradeRow, cfg config, file string) error {
	if len(rows) == 0 {
		return nil
	}
	good, share := plot.New(), plot.New()
	good.Title.Text = "Goodput (on-time successes per second, 250 ms bins)"
	good.Y.Label.Text = "goodput, msg/s"
	share.Title.Text = "Runs on the degraded path"
	share.Y.Label.Text = "share of runs started"
	share.X.Label.Text = "seconds since the burst began"
	end := rows[0].burst + cfg.degrade.lowDur
	capacity := rows[0].capacity
	for _, ref := range []struct {
		pl   *plot.Plot
		xys  plotter.XYs
		name string
	}{
		{good, plotter.XYs{{X: 0, Y: capacity}, {X: end.Seconds(), Y: capacity}}, "full-path capacity"},
		{good, plotter.XYs{{X: 0, Y: 3 * capacity}, {X: rows[0].burst.Seconds(), Y: 3 * capacity}}, "target in the burst: 3× capacity"},
	} {
		l, err := plotter.NewLine(ref.xys)
		if err != nil {
			return err
		}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		l.Color = color.Gray{Y: 120}
		ref.pl.Add(l)
		ref.pl.Legend.Add(ref.name, l)
	}
	for _, r := range rows {
		st := styleOf(r.kind)
		var g, d plotter.XYs
		for _, b := range r.timeline {
			g = append(g, plotter.XY{X: b.at.Seconds(), Y: b.good})
			d = append(d, plotter.XY{X: b.at.Seconds(), Y: b.degraded})
		}
		for _, pair := range []struct {
			pl  *plot.Plot
			xys plotter.XYs
		}{{good, g}, {share, d}} {
			l, err := plotter.NewLine(pair.xys)
			if err != nil {
				return err
			}
			l.Color, l.Dashes = st.col, st.dashes
			pair.pl.Add(l)
			pair.pl.Legend.Add(st.name, l)
		}
	}
	for _, p := range []*plot.Plot{good, share} {
		p.Add(plotter.NewGrid())
		p.X.Min, p.X.Max, p.Y.Min = 0, end.Seconds(), 0
		p.Legend.Top, p.Legend.Left = true, false
	}
	// Room above the lines for the legends.
	top := 3 * capacity
	for _, r := range rows {
		for _, b := range r.timeline {
			top = max(top, b.good)
		}
	}
	good.Y.Max, share.Y.Max = 1.5*top, 1.5
	return writeTwoPlots(good, share, file)
}

func degradeRowOf(r result, capacity float64, cfg config) degradeRow {
	d := cfg.degrade
	row := degradeRow{kind: r.spec.kind, capacity: capacity, wasted: r.wasted, lowOffered: d.low * capacity}
	drop := r.start.Add(d.highDur)
	// The burst's steady state: after the deadline and a second, so the
	// backlog has formed.
	hw := window{from: r.start.Add(min(cfg.deadline+time.Second, d.highDur/2)), until: drop}
	hs := summarize(r.runs, hw, nil)
	row.highGood, row.highP99 = float64(hs.good)/hw.secs(), hs.p99
	if n := hs.handled + hs.late; n > 0 {
		row.highShare = float64(hs.degraded) / float64(n)
	}
	// After the burst: the last second of light load is its steady state.
	end := drop.Add(d.lowDur)
	lw := window{from: end.Add(-min(time.Second, d.lowDur/2)), until: end}
	ls := summarize(r.runs, lw, nil)
	row.lowGood, row.lowP99 = float64(ls.good)/lw.secs(), ls.p99
	for _, x := range r.runs {
		if x.degraded && x.start.After(drop) && x.start.Sub(drop) > row.recovery {
			row.recovery = x.start.Sub(drop)
		}
	}
	return row
}

func degradeTable(rows []degradeRow, cfg config) string {
	d := cfg.degrade
	header := []string{"consumer", "burst goodput", "× full-path capacity", "burst runs degraded", "burst p99",
		"after: goodput", "after: p99", "last degraded run after the drop", "wasted"}
	var out [][]string
	for _, r := range rows {
		rec := "none"
		if r.recovery > 0 {
			rec = ms(r.recovery)
		}
		out = append(out, []string{r.kind.String(), rate(r.highGood), fmt.Sprintf("%.2f×", r.highGood/r.capacity),
			fmt.Sprintf("%.0f%%", 100*r.highShare), ms(r.highP99), fmt.Sprintf("%s of %s", rate(r.lowGood), rate(r.lowOffered)), ms(r.lowP99), rec, fmt.Sprint(r.wasted)})
	}
	return fmt.Sprintf("Degraded mode: %g× full-path capacity for %v, then %g× for %v; full path %v, degraded path %v, %d workers, deadline %v\n"+
		"(target: burst goodput ≥ 3× full-path capacity; back to the full path within 2 s of the drop)\n\n",
		d.high, d.highDur, d.low, d.lowDur, d.full, d.cheap, cfg.workers, cfg.deadline) + table(header, out)
}
