package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// loadstepConfig is -mode loadstep (issue 26): a load step from -ls-low to
// -ls-high × capacity and back, with each consumer's sojourn (publish to
// handler start) and p99 (publish to done, successes) over time.
type loadstepConfig struct {
	low, high             float64
	before, during, after time.Duration
}

func (c *config) addLoadstepFlags(fs *flag.FlagSet) {
	l := &c.loadstep
	fs.Float64Var(&l.low, "ls-low", 1, "loadstep mode: offered load before and after the step, × capacity")
	fs.Float64Var(&l.high, "ls-high", 5, "loadstep mode: offered load of the step, × capacity")
	fs.DurationVar(&l.before, "ls-before", 5*time.Second, "loadstep mode: how long the low load runs before the step")
	fs.DurationVar(&l.during, "ls-during", 10*time.Second, "loadstep mode: how long the step lasts")
	fs.DurationVar(&l.after, "ls-after", 8*time.Second, "loadstep mode: how long the low load runs after the step")
}

func (c *config) parseLoadstepFlags(set map[string]bool) error {
	l := &c.loadstep
	if c.quick {
		if !set["ls-before"] {
			l.before = 2 * time.Second
		}
		if !set["ls-during"] {
			l.during = 3 * time.Second
		}
		if !set["ls-after"] {
			l.after = 3 * time.Second
		}
	}
	if l.low <= 0 || l.high <= 0 || l.before <= 0 || l.during <= 0 || l.after <= 0 {
		return errors.New("-ls-*: loads and durations must be > 0")
	}
	return nil
}

// loadstepBin is one slice of a loadstep trial's timeline.
type loadstepBin struct {
	at      time.Duration // end of the bin, from the producer's start
	sojourn time.Duration // median publish-to-start of the runs started in the bin
	p99     time.Duration // of the successes ending in the bin
	good    float64       // on-time successes ending in the bin, msg/s
}

const loadstepBinWidth = 250 * time.Millisecond

// loadstepPhase is one consumer's figures in one phase (before, during,
// after the step).
type loadstepPhase struct {
	goodput          float64
	sojourn, p50     time.Duration // median sojourn of runs started; p50 of successes
	p99              time.Duration
	late, wasted, ok int
}

type loadstepRow struct {
	kind     kind
	phases   [3]loadstepPhase
	timeline []loadstepBin
	expired  int
	shed     int
}

func loadstepTimeline(r result, total time.Duration) []loadstepBin {
	n := int(total / loadstepBinWidth)
	soj, lat := make([][]time.Duration, n), make([][]time.Duration, n)
	good := make([]int, n)
	for _, x := range r.runs {
		if i := int(x.start.Sub(r.start) / loadstepBinWidth); i >= 0 && i < n {
			soj[i] = append(soj[i], x.start.Sub(x.pub))
		}
		if i := int(x.end.Sub(r.start) / loadstepBinWidth); x.ok && i >= 0 && i < n {
			lat[i] = append(lat[i], x.latency())
			if x.onTime {
				good[i]++
			}
		}
	}
	out := make([]loadstepBin, n)
	for i := range out {
		slices.Sort(soj[i])
		slices.Sort(lat[i])
		out[i] = loadstepBin{at: time.Duration(i+1) * loadstepBinWidth, sojourn: percentile(soj[i], 0.5), p99: percentile(lat[i], 0.99),
			good: float64(good[i]) / loadstepBinWidth.Seconds()}
	}
	return out
}

func runLoadstep(ctx context.Context, b broker, cfg config, rep *report, w io.Writer) error {
	l := cfg.loadstep
	capacity, err := capacityOf(ctx, b, cfg, "ls_cap", cfg.workers, cfg.cost)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "overloadlab loadstep: broker %s, %d workers × %v, deadline %v; capacity %.0f msg/s; %g× → %g× → %g×\n",
		b.name(), cfg.workers, cfg.cost, cfg.deadline, capacity, l.low, l.high, l.low)
	var rows []loadstepRow
	for _, k := range cfg.kinds {
		s := cfg.spec(fmt.Sprintf("ls_%d", k), k, 0)
		s.phases = []phase{{l.before, l.low * capacity}, {l.during, l.high * capacity}, {l.after, l.low * capacity}}
		s.keepRuns = true
		s.drain = 0
		r, err := runTrial(ctx, b, s)
		if err != nil {
			return fmt.Errorf("loadstep %v: %w", k, err)
		}
		rows = append(rows, loadstepRowOf(r, cfg))
	}
	rep.loadstep = rows
	return cfg.emitWithPlot(w, "loadstep", loadstepTable(rows, cfg, capacity), func(png string) error { return plotLoadstep(rows, cfg, png) })
}

func loadstepRowOf(r result, cfg config) loadstepRow {
	l := cfg.loadstep
	row := loadstepRow{kind: r.spec.kind, expired: r.expired, shed: r.shed}
	row.timeline = loadstepTimeline(r, l.before+l.during+l.after)
	// Each phase from a second after it begins (the step's from the
	// deadline and a second, so its backlog has formed) to its end.
	at := r.start
	for i, d := range []time.Duration{l.before, l.during, l.after} {
		from := at.Add(min(time.Second, d/2))
		if i == 1 {
			from = at.Add(min(cfg.deadline+time.Second, d/2))
		}
		pw := window{from: from, until: at.Add(d)}
		s := summarize(r.runs, pw, nil)
		var soj []time.Duration
		for _, x := range r.runs {
			if pw.has(x.start) {
				soj = append(soj, x.start.Sub(x.pub))
			}
		}
		slices.Sort(soj)
		row.phases[i] = loadstepPhase{goodput: float64(s.good) / pw.secs(), sojourn: percentile(soj, 0.5), p50: s.p50, p99: s.p99,
			late: s.late, wasted: s.wasted, ok: s.good}
		at = at.Add(d)
	}
	return row
}

func loadstepTable(rows []loadstepRow, cfg config, capacity float64) string {
	l := cfg.loadstep
	header := []string{"consumer", "phase", "offered", "goodput", "% of capacity", "median sojourn", "p50", "p99", "p99 / deadline", "late", "wasted"}
	var out [][]string
	names := []string{fmt.Sprintf("before (%g×)", l.low), fmt.Sprintf("step (%g×)", l.high), fmt.Sprintf("after (%g×)", l.low)}
	loads := []float64{l.low, l.high, l.low}
	for _, r := range rows {
		for i, p := range r.phases {
			out = append(out, []string{r.kind.String(), names[i], rate(loads[i] * capacity), rate(p.goodput),
				fmt.Sprintf("%.0f%%", 100*p.goodput/capacity), ms(p.sojourn), ms(p.p50), ms(p.p99),
				fmt.Sprintf("%.2f", p.p99.Seconds()/cfg.deadline.Seconds()), fmt.Sprint(p.late), fmt.Sprint(p.wasted)})
		}
	}
	return fmt.Sprintf("Load step: %g× capacity for %v, %g× for %v, %g× for %v; %d workers × %v, deadline %v, capacity %.0f msg/s\n"+
		"(each phase measured from 1 s after it begins, the step from the deadline + 1 s; sojourn: publish to handler start; p50/p99: publish to done, successes; late: runs that finished after the deadline or were cut off)\n\n",
		l.low, l.before, l.high, l.during, l.low, l.after, cfg.workers, cfg.cost, cfg.deadline, capacity) + table(header, out)
}

// plotLoadstep draws each consumer's median sojourn and p99 over the
// trial, with the deadline and the step marked.
func plotLoadstep(rows []loadstepRow, cfg config, file string) error {
	if len(rows) == 0 {
		return nil
	}
	l := cfg.loadstep
	soj, p99 := plot.New(), plot.New()
	soj.Title.Text = fmt.Sprintf("Sojourn: publish to handler start, median per 250 ms (%g× → %g× → %g× capacity)", l.low, l.high, l.low)
	soj.Y.Label.Text = "ms"
	p99.Title.Text = "p99 of successes: publish to done, per 250 ms"
	p99.Y.Label.Text = "ms"
	p99.X.Label.Text = "seconds since the trial began"
	end := (l.before + l.during + l.after).Seconds()
	dl := float64(cfg.deadline.Milliseconds())
	for _, pl := range []*plot.Plot{soj, p99} {
		for _, ref := range []struct {
			xys  plotter.XYs
			name string
		}{
			{plotter.XYs{{X: 0, Y: dl}, {X: end, Y: dl}}, "deadline"},
			{plotter.XYs{{X: l.before.Seconds(), Y: 0}, {X: l.before.Seconds(), Y: 1.25 * dl}}, ""},
			{plotter.XYs{{X: (l.before + l.during).Seconds(), Y: 0}, {X: (l.before + l.during).Seconds(), Y: 1.25 * dl}}, ""},
		} {
			ln, err := plotter.NewLine(ref.xys)
			if err != nil {
				return err
			}
			ln.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
			ln.Color = color.Gray{Y: 120}
			pl.Add(ln)
			if ref.name != "" {
				pl.Legend.Add(ref.name, ln)
			}
		}
	}
	for _, r := range rows {
		st := styleOf(r.kind)
		var s, p plotter.XYs
		for _, b := range r.timeline {
			// Cap at 1.25 × the deadline: the unprotected consumer's
			// seconds would flatten every other line.
			s = append(s, plotter.XY{X: b.at.Seconds(), Y: min(float64(b.sojourn.Milliseconds()), 1.25*dl)})
			p = append(p, plotter.XY{X: b.at.Seconds(), Y: min(float64(b.p99.Milliseconds()), 1.25*dl)})
		}
		for _, pair := range []struct {
			pl  *plot.Plot
			xys plotter.XYs
		}{{soj, s}, {p99, p}} {
			ln, err := plotter.NewLine(pair.xys)
			if err != nil {
				return err
			}
			ln.Color, ln.Dashes = st.col, st.dashes
			pair.pl.Add(ln)
			pair.pl.Legend.Add(st.name, ln)
		}
	}
	for _, pl := range []*plot.Plot{soj, p99} {
		pl.Add(plotter.NewGrid())
		pl.X.Min, pl.X.Max, pl.Y.Min, pl.Y.Max = 0, end, 0, 1.6*dl
		pl.Legend.Top, pl.Legend.Left = true, true
	}
	return writeTwoPlots(soj, p99, file)
}
