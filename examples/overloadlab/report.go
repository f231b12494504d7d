package main

import (
	"fmt"
	"image/color"
	"os"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// table renders rows as a pipe-separated table with aligned columns, the
// shape of seed 002's tables (and valid Markdown).
func table(header []string, rows [][]string) string {
	width := make([]int, len(header))
	for _, r := range append([][]string{header}, rows...) {
		for i, c := range r {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	var b strings.Builder
	line := func(r []string) {
		b.WriteString("|")
		for i, c := range r {
			b.WriteString(" " + c + strings.Repeat(" ", width[i]-len([]rune(c))) + " |")
		}
		b.WriteString("\n")
	}
	line(header)
	sep := make([]string, len(header))
	for i := range sep {
		sep[i] = strings.Repeat("-", width[i])
	}
	line(sep)
	for _, r := range rows {
		line(r)
	}
	return b.String()
}

func ms(d time.Duration) string {
	if d == 0 {
		return "-"
	}
	return fmt.Sprintf("%d ms", d.Round(time.Millisecond).Milliseconds())
}

func rate(v float64) string { return fmt.Sprintf("%.0f/s", v) }

func mib(b uint64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

func pct(n, of int) string {
	if of == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*float64(n)/float64(of))
}

func stepsTable(rep *report) string {
	header := []string{"load", "offered", "consumer", "goodput", "% of capacity", "p50", "p99",
		"wasted (started expired)", "late or cut off", "expired (not run)", "shed or dropped", "left at stop", "peak in-flight", "peak heap"}
	var rows [][]string
	for _, s := range rep.steps {
		for _, r := range s.res {
			rows = append(rows, []string{
				fmt.Sprintf("%g×", s.load), rate(float64(r.offered) / r.spec.duration.Seconds()), r.spec.kind.String(),
				rate(r.goodput), fmt.Sprintf("%.0f%%", 100*r.goodput/rep.capacity), ms(r.p50), ms(r.p99),
				fmt.Sprint(r.wasted), fmt.Sprint(r.late), fmt.Sprint(r.expired), fmt.Sprint(r.shed + r.rejected + r.headDropped),
				fmt.Sprint(r.leftover), fmt.Sprint(r.peakInFlight), mib(r.peakHeap),
			})
		}
	}
	return fmt.Sprintf("Offered-load steps (capacity %.0f msg/s; goodput and latency measured after a warm-up of %v)\n\n", rep.capacity, stepWarmup(rep)) + table(header, rows)
}

func stepWarmup(rep *report) time.Duration {
	if len(rep.steps) == 0 || len(rep.steps[0].res) == 0 {
		return 0
	}
	return rep.steps[0].res[0].spec.warmup
}

func dropTable(rep *report, cfg config) string {
	header := []string{"policy", "goodput", "p50 of successes", "p99", "CRITICAL on time", "SHEDDABLE on time", "wasted (done after deadline)"}
	var rows [][]string
	for _, d := range rep.drop {
		if !d.ran {
			rows = append(rows, []string{d.policy, "n/a", d.note, "", "", "", ""})
			continue
		}
		r := d.res
		rows = append(rows, []string{d.policy, rate(r.goodput), ms(r.p50), ms(r.p99),
			pct(r.goodByClass[2], r.offeredByClass[2]), pct(r.goodByClass[0], r.offeredByClass[0]), fmt.Sprint(r.late)})
	}
	return fmt.Sprintf("Drop policies at %.0f msg/s offered (%g× capacity), %.0f%% CRITICAL, the rest SHEDDABLE\n\n", cfg.dropLoad*rep.capacity, cfg.dropLoad, 100*cfg.dropHigh) +
		table(header, rows)
}

func bpTable(rep *report, cfg config) string {
	header := []string{"queue", fmt.Sprintf("produced in %v", cfg.bpDur), "producer rate", "consumer rate", "queue length per second",
		"median wait, last 300", "max wait", "left when producer stopped"}
	var rows [][]string
	for _, r := range rep.bp {
		if r.note != "" {
			rows = append(rows, []string{r.queue, "n/a", r.note, "", "", "", "", ""})
			continue
		}
		rows = append(rows, []string{r.queue, fmt.Sprint(r.produced), rate(r.rate), rate(r.consumeRate),
			strings.ReplaceAll(fmt.Sprint(r.perSecond), " ", ", "), ms(r.medianLast), ms(r.maxWait), fmt.Sprint(r.leftAtStop)})
	}
	return fmt.Sprintf("Backpressure: producer %.0f/s into %d worker(s) × %v\n\n", cfg.bpRate, cfg.bpWorkers, cfg.bpCost) + table(header, rows)
}

func isoTable(rep *report, cfg config) string {
	header := []string{"phase (median round)", "orders offered", "orders on time", "orders p50", "orders p99", "p99 of each round", "reports held (window 4)"}
	var rows [][]string
	for _, r := range rep.iso {
		var each []string
		for _, p := range r.p99s {
			each = append(each, fmt.Sprintf("%.1f", float64(p)/float64(time.Millisecond)))
		}
		rows = append(rows, []string{r.phase, rate(r.offered), fmt.Sprint(r.good), ms(r.p50), ms(r.p99),
			strings.Join(each, ", ") + " ms", fmt.Sprintf("%d of %d fetched", r.reportsHeld, r.reportsFetched)})
	}
	verdict := ""
	if len(rep.iso) == 2 && rep.iso[0].p99 > 0 {
		a, b := rep.iso[0].p99, rep.iso[1].p99
		ok := b <= a+a/5 || b <= a+2*time.Millisecond
		verdict = fmt.Sprintf("\norders p99 %v → %v (%+.1f%%): target +20%% or +2 ms: %s\n",
			a.Round(100*time.Microsecond), b.Round(100*time.Microsecond), 100*(float64(b)/float64(a)-1), map[bool]string{true: "met", false: "NOT met"}[ok])
	}
	return fmt.Sprintf("Isolation: critical orders (%d workers × %v) next to a sheddable reports route (2 workers, window 4), 50 reports/s, %d interleaved rounds of %v\n\n", cfg.workers, cfg.cost, cfg.isoRounds, cfg.isoDur) +
		table(header, rows) + verdict
}

// wholeTicks are the default ticks labelled without decimals.
type wholeTicks struct{}

func (wholeTicks) Ticks(lo, hi float64) []plot.Tick {
	ts := plot.DefaultTicks{}.Ticks(lo, hi)
	for i := range ts {
		if ts[i].Label != "" {
			ts[i].Label = fmt.Sprintf("%.0f", ts[i].Value)
		}
	}
	return ts
}

// plotSteps writes goodput and p99 against offered load, one panel each,
// for both consumers.
func plotSteps(rep *report, file string) error {
	good, lat := plot.New(), plot.New()
	good.Title.Text = "Goodput (successes within deadline)"
	good.X.Label.Text = "offered load, msg/s"
	good.Y.Label.Text = "goodput, msg/s"
	lat.Title.Text = "p99 latency of successes"
	lat.X.Label.Text = "offered load, msg/s"
	lat.Y.Label.Text = "p99, ms"
	var series []seriesStyle
	for _, k := range allKinds {
		series = append(series, styleOf(k))
	}
	capLine := plotter.XYs{}
	for _, s := range rep.steps {
		if len(s.res) == 0 {
			continue
		}
		capLine = append(capLine, plotter.XY{X: s.load * rep.capacity, Y: rep.capacity})
	}
	if len(capLine) > 0 {
		l, err := plotter.NewLine(capLine)
		if err != nil {
			return err
		}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		l.Color = color.Gray{Y: 120}
		good.Add(l)
		good.Legend.Add("measured capacity", l)
	}
	for _, se := range series {
		var g, p plotter.XYs
		for _, s := range rep.steps {
			r, ok := s.of(se.kind)
			if !ok {
				continue
			}
			x := s.load * rep.capacity
			g = append(g, plotter.XY{X: x, Y: r.goodput})
			if r.p99 > 0 {
				p = append(p, plotter.XY{X: x, Y: float64(r.p99) / float64(time.Millisecond)})
			}
		}
		for _, pair := range []struct {
			pl  *plot.Plot
			xys plotter.XYs
		}{{good, g}, {lat, p}} {
			if len(pair.xys) == 0 {
				continue
			}
			l, pts, err := plotter.NewLinePoints(pair.xys)
			if err != nil {
				return err
			}
			l.Color, pts.Color, l.Dashes = se.col, se.col, se.dashes
			pair.pl.Add(l, pts)
			pair.pl.Legend.Add(se.name, l, pts)
		}
	}
	if len(capLine) > 0 {
		dl := rep.steps[0].res[0].spec.deadline
		l, err := plotter.NewLine(plotter.XYs{{X: capLine[0].X, Y: float64(dl / time.Millisecond)}, {X: capLine[len(capLine)-1].X, Y: float64(dl / time.Millisecond)}})
		if err != nil {
			return err
		}
		l.Dashes = []vg.Length{vg.Points(4), vg.Points(3)}
		l.Color = color.Gray{Y: 120}
		lat.Add(l)
		lat.Legend.Add("deadline", l)
	}
	var ticks []plot.Tick
	for _, xy := range capLine {
		ticks = append(ticks, plot.Tick{Value: xy.X, Label: fmt.Sprintf("%.0f", xy.X)})
	}
	for _, p := range []*plot.Plot{good, lat} {
		p.X.Scale = plot.LogScale{}
		p.X.Tick.Marker = plot.ConstantTicks(ticks)
		p.Add(plotter.NewGrid())
		p.Y.Min = 0
	}
	lat.Y.Tick.Marker = wholeTicks{}
	good.Y.Tick.Marker = wholeTicks{}
	good.Y.Max = rep.capacity * 1.2
	good.Legend.Top, good.Legend.Left = false, true
	good.Legend.XOffs, good.Legend.YOffs = vg.Points(8), vg.Points(8)
	lat.Legend.Top, lat.Legend.Left = true, true
	lat.Legend.XOffs = vg.Points(8)

	return writeTwoPlots(good, lat, file)
}

// seriesStyle is how a consumer is drawn in every plot.
type seriesStyle struct {
	kind   kind
	name   string
	col    color.Color
	dashes []vg.Length
}

func styleOf(k kind) seriesStyle {
	switch k {
	case unprotected:
		return seriesStyle{k, "unprotected (unbounded FIFO)", color.RGBA{R: 200, A: 255}, nil}
	case boundedQueue:
		return seriesStyle{k, "plain client, bounded queue + expiry check", color.RGBA{R: 150, G: 150, A: 255}, []vg.Length{vg.Points(6), vg.Points(2)}}
	case sluiceMinimal:
		return seriesStyle{k, "sluice, minimal route", color.RGBA{G: 150, B: 60, A: 255}, []vg.Length{vg.Points(2), vg.Points(2)}}
	default:
		return seriesStyle{k, "sluice, tuned route", color.RGBA{B: 200, G: 90, A: 255}, nil}
	}
}

// writeTwoPlots draws top above bottom, 8 × 8 inches, to file as PNG.
func writeTwoPlots(top, bottom *plot.Plot, file string) error {
	img := vgimg.New(8*vg.Inch, 8*vg.Inch)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadTop: vg.Points(6), PadBottom: vg.Points(6), PadLeft: vg.Points(6), PadRight: vg.Points(12), PadY: vg.Points(12)}
	canvases := plot.Align([][]*plot.Plot{{top}, {bottom}}, tiles, dc)
	top.Draw(canvases[0][0])
	bottom.Draw(canvases[1][0])
	return writePNG(img, file)
}

// writePNG writes img to file as PNG.
func writePNG(img *vgimg.Canvas, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
