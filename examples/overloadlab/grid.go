package main

import (
	"context"
	"encoding/csv"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// gridConfig is -mode grid: every consumer at every offered load, for every
// handler (workers × cost) and deadline.
type gridConfig struct {
	costs, workers, deadlines, loads string // the flags, parsed below
	costList                         []time.Duration
	workerList                       []int
	deadlineList                     []time.Duration
	loadList                         []float64
	measure                          time.Duration
	settle                           time.Duration
	csv                              string // render these grid.csv files instead of running
}

func (c *config) addModeFlags(fs *flag.FlagSet) {
	g := &c.grid
	fs.StringVar(&g.costs, "grid-costs", "2ms,10ms,50ms", "grid mode: handler costs")
	fs.StringVar(&g.workers, "grid-workers", "1,4,32", "grid mode: handler workers")
	fs.StringVar(&g.deadlines, "grid-deadlines", "100ms,500ms,5s", "grid mode: deadlines after publish")
	fs.StringVar(&g.loads, "grid-loads", "0.5,1,2,5,10", "grid mode: offered loads, × each handler's measured capacity")
	fs.DurationVar(&g.measure, "grid-measure", 3*time.Second, "grid mode: how long each trial is measured, after its warm-up")
	fs.StringVar(&g.csv, "grid-csv", "", "grid mode: render the table and heat map from these comma-separated grid.csv files (for example the parts of a run split by handler) instead of running")
	fs.DurationVar(&g.settle, "grid-settle", time.Second, "grid mode: warm-up of each trial before measuring; above 1× capacity the deadline and this again are added, so a backlog reaches its steady state (every queued message as old as the deadline) first")
	c.addDegradeFlags(fs)
	c.addLoadstepFlags(fs)
	c.addCPUFlags(fs)
	c.addCostFlags(fs)
}

// parseModeFlags reads the flags of the grid, degrade, cpu and cost modes;
// set holds the flags given on the command line.
func (c *config) parseModeFlags(set map[string]bool) error {
	g := &c.grid
	if c.quick {
		// The short form for CI: one handler, one deadline, one load below
		// and one above capacity, 1 s measured.
		if !set["grid-costs"] {
			g.costs = "10ms"
		}
		if !set["grid-workers"] {
			g.workers = "4"
		}
		if !set["grid-deadlines"] {
			g.deadlines = "250ms"
		}
		if !set["grid-loads"] {
			g.loads = "1,5"
		}
		if !set["grid-measure"] {
			g.measure = time.Second
		}
		if !set["grid-settle"] {
			g.settle = 500 * time.Millisecond
		}
	}
	var err error
	if g.costList, err = parseList(g.costs, "-grid-costs", time.ParseDuration); err != nil {
		return err
	}
	if g.workerList, err = parseList(g.workers, "-grid-workers", strconv.Atoi); err != nil {
		return err
	}
	if g.deadlineList, err = parseList(g.deadlines, "-grid-deadlines", time.ParseDuration); err != nil {
		return err
	}
	if g.loadList, err = parseList(g.loads, "-grid-loads", func(s string) (float64, error) { return strconv.ParseFloat(s, 64) }); err != nil {
		return err
	}
	if g.measure <= 0 || g.settle < 0 {
		return errors.New("-grid-measure must be > 0, -grid-settle >= 0")
	}
	if err := c.parseLoadstepFlags(set); err != nil {
		return err
	}
	if err := c.parseDegradeFlags(set); err != nil {
		return err
	}
	if err := c.parseCPUFlags(set); err != nil {
		return err
	}
	return c.parseCostFlags(set)
}

// parseList parses a comma-separated list of positive values.
func parseList[T int | float64 | time.Duration](s, flagName string, parse func(string) (T, error)) ([]T, error) {
	var out []T
	for _, f := range strings.Split(s, ",") {
		v, err := parse(strings.TrimSpace(f))
		if err != nil || v <= 0 {
			return nil, fmt.Errorf("bad %s value %q", flagName, f)
		}
		out = append(out, v)
	}
	return out, nil
}

// runOwnMode runs the modes that measure their own capacities.
func runOwnMode(ctx context.Context, b broker, cfg config, rep *report, w io.Writer) error {
	switch cfg.mode {
	case "grid":
		return runGrid(ctx, b, cfg, rep, w)
	case "degrade":
		return runDegrade(ctx, b, cfg, rep, w)
	case "loadstep":
		return runLoadstep(ctx, b, cfg, rep, w)
	case "cpu":
		return runCPU(ctx, b, cfg, rep, w)
	case "cost":
		return runCost(ctx, b, cfg, rep, w)
	}
	return fmt.Errorf("unknown mode %q", cfg.mode)
}

// gridCell is one handler, deadline and load, with every consumer's result.
type gridCell struct {
	workers  int
	cost     time.Duration
	deadline time.Duration
	capacity float64
	load     float64
	res      []result // one per cfg.kinds
}

func (g gridCell) of(k kind) (result, bool) { return resultOf(g.res, k) }

// handler labels the cell's handler, e.g. "4×20ms".
func (g gridCell) handler() string { return fmt.Sprintf("%d×%v", g.workers, g.cost) }

// share is goodput as a fraction of capacity.
func (g gridCell) share(r result) float64 { return r.goodput / g.capacity }

// meets reports whether r meets issue 11's target in this cell: at 2× and
// above, goodput at least 97% of capacity, no handler run on an expired
// message and p99 under the deadline; at 1× and below, goodput at least
// 97% of the offered load and no run on an expired message.
func (g gridCell) meets(r result) bool {
	if r.wasted > 0 || r.failed != "" {
		return false
	}
	if g.load >= 2 {
		return g.share(r) >= 0.97 && r.p99 > 0 && r.p99 < g.deadline
	}
	return r.goodput >= 0.97*math.Min(r.offeredRate, g.capacity)
}

// renderGrid writes the table and heat map of the cells in cfg.grid.csv.
func renderGrid(cfg config, rep *report, w io.Writer) error {
	var brokerName string
	for _, f := range strings.Split(cfg.grid.csv, ",") {
		cells, b, err := readGridCSV(strings.TrimSpace(f))
		if err != nil {
			return err
		}
		brokerName = b
		rep.grid = append(rep.grid, cells...)
	}
	return writeGrid(cfg, rep.grid, brokerName, w)
}

// runGrid measures each handler's capacity, then runs every consumer at
// every deadline and load, printing each cell as it completes, and writes
// grid.txt, grid.csv and grid.png.
func runGrid(ctx context.Context, b broker, cfg config, rep *report, w io.Writer) error {
	g := cfg.grid
	n := len(g.costList) * len(g.workerList) * len(g.deadlineList) * len(g.loadList) * len(cfg.kinds)
	fmt.Fprintf(w, "overloadlab grid: broker %s, handlers %v × %v, deadlines %v, loads %v, consumers %v: %d trials, each measured %v\n",
		b.name(), g.workerList, g.costList, g.deadlineList, g.loadList, cfg.kinds, n, g.measure)
	for _, cost := range g.costList {
		for _, workers := range g.workerList {
			// A long run on a shared machine meets the odd broker hiccup:
			// each measurement gets a second try, and a handler or trial
			// that fails twice is reported as such, not the whole grid.
			capName := fmt.Sprintf("cap_%d_%d", workers, cost.Microseconds())
			capacity, err := capacityOf(ctx, b, cfg, capName, workers, cost)
			if err != nil && ctx.Err() == nil {
				fmt.Fprintf(w, "handler %d×%v: capacity: %v; trying again\n", workers, cost, err)
				capacity, err = capacityOf(ctx, b, cfg, capName+"_2", workers, cost)
			}
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				fmt.Fprintf(w, "handler %d×%v: capacity: %v; skipped\n", workers, cost, err)
				continue
			}
			fmt.Fprintf(w, "handler %d×%v: measured capacity %.0f msg/s (nominal %.0f)\n", workers, cost, capacity, float64(workers)/cost.Seconds())
			for _, dl := range g.deadlineList {
				for _, load := range g.loadList {
					cell := gridCell{workers: workers, cost: cost, deadline: dl, capacity: capacity, load: load}
					for _, k := range cfg.kinds {
						s := cfg.gridSpec(cell, k)
						r, err := runTrial(ctx, b, s)
						if err != nil && ctx.Err() == nil {
							s.name += "_2"
							r, err = runTrial(ctx, b, s)
						}
						if err != nil {
							if ctx.Err() != nil {
								return ctx.Err()
							}
							r = result{spec: s, failed: err.Error()}
						}
						cell.res = append(cell.res, r)
					}
					rep.grid = append(rep.grid, cell)
					fmt.Fprintln(w, cellLine(cell))
					if err := ctx.Err(); err != nil {
						return err
					}
				}
			}
		}
	}
	return writeGrid(cfg, rep.grid, b.name(), w)
}

// writeGrid prints the grid's table and writes grid.txt, grid.csv and
// grid.png to cfg.out.
func writeGrid(cfg config, cells []gridCell, broker string, w io.Writer) error {
	if err := cfg.emitter(w)("grid.txt", gridTable(cells, broker)); err != nil {
		return err
	}
	if cfg.out == "" {
		return nil
	}
	if err := os.MkdirAll(cfg.out, 0o755); err != nil {
		return err
	}
	if err := writeGridCSV(cells, broker, filepath.Join(cfg.out, "grid.csv")); err != nil {
		return err
	}
	png := filepath.Join(cfg.out, "grid.png")
	if err := plotGrid(cells, broker, png); err != nil {
		return err
	}
	fmt.Fprintln(w, "plot:", png)
	return nil
}

// gridSpec is consumer k's trial in cell.
func (c config) gridSpec(cell gridCell, k kind) trialSpec {
	warm := c.grid.settle
	if cell.load > 1 {
		warm += cell.deadline + c.grid.settle
	}
	return trialSpec{
		// Stream names take no dots.
		name: strings.ReplaceAll(fmt.Sprintf("g_%d_%d_%d_%g_%d", cell.workers, cell.cost.Microseconds(), cell.deadline.Milliseconds(), cell.load, k), ".", "p"),
		kind: k, rate: cell.load * cell.capacity, duration: warm + c.grid.measure, warmup: warm,
		workers: cell.workers, cost: cell.cost, deadline: cell.deadline, queueCap: c.queueCap,
		window: c.tunedWindow(), margin: c.tunedMargin(),
		observer: c.observer, payload: c.payload,
	}
}

// cellLine is one progress line.
func cellLine(g gridCell) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%-8s deadline %-6v %4g× (%5.0f/s):", g.handler(), g.deadline, g.load, g.load*g.capacity)
	for _, r := range g.res {
		if r.failed != "" {
			fmt.Fprintf(&b, "  %s failed: %s;", r.spec.kind, r.failed)
			continue
		}
		fmt.Fprintf(&b, "  %s %3.0f%% p99 %s wasted %d;", r.spec.kind, 100*g.share(r), ms(r.p99), r.wasted)
	}
	return b.String()
}

func gridTable(cells []gridCell, broker string) string {
	header := []string{"handler", "deadline", "capacity", "load", "offered"}
	if len(cells) == 0 {
		return "no grid cells\n"
	}
	kinds := cellKinds(cells)
	for _, k := range kinds {
		header = append(header, k.String())
	}
	header = append(header, "wasted ("+kindInitials(kinds)+")")
	hasMin := kindIn(kinds, sluiceMinimal)
	if hasMin {
		header = append(header, "sluice minimal: target")
	}
	var rows [][]string
	met, total := 0, 0
	for _, c := range cells {
		row := []string{c.handler(), c.deadline.String(), rate(c.capacity), fmt.Sprintf("%g×", c.load), ""}
		var wasted []string
		for i, r := range c.res {
			if i == 0 {
				row[4] = rate(r.offeredRate)
			}
			if r.failed != "" {
				row = append(row, "failed")
			} else {
				row = append(row, fmt.Sprintf("%.0f%% · %s", 100*c.share(r), ms(r.p99)))
			}
			wasted = append(wasted, fmt.Sprint(r.wasted))
		}
		row = append(row, strings.Join(wasted, "/"))
		if m, ok := c.of(sluiceMinimal); ok {
			total++
			v := "miss"
			if c.meets(m) {
				v = "met"
				met++
			}
			row = append(row, v)
		}
		rows = append(rows, row)
	}
	s := fmt.Sprintf("Grid on %s: goodput as %% of each handler's measured capacity · p99 of successes\n\n", broker) + table(header, rows)
	if hasMin {
		s += fmt.Sprintf("\nsluice minimal meets the target in %d of %d cells (at ≥2×: ≥97%% of capacity, 0 wasted, p99 < deadline; at ≤1×: ≥97%% of the offered load, 0 wasted)\n", met, total)
	}
	return s + "\n" + gridSummary(cells, kinds)
}

// gridSummary is, per load and consumer, the median and lowest goodput
// share across the cells, how many cells reach 97% of capacity (at ≥2×;
// of the offered load below), and the handler runs on expired messages.
func gridSummary(cells []gridCell, kinds []kind) string {
	var loads []float64
	for _, c := range cells {
		if !slices.Contains(loads, c.load) {
			loads = append(loads, c.load)
		}
	}
	header := []string{"load"}
	for _, k := range kinds {
		header = append(header, k.String()+": median / lowest, cells ≥97%, wasted")
	}
	var rows [][]string
	for _, ld := range loads {
		row := []string{fmt.Sprintf("%g×", ld)}
		for _, k := range kinds {
			var shares []float64
			ok, n, wasted := 0, 0, 0
			for _, c := range cells {
				r, has := c.of(k)
				if c.load != ld || !has {
					continue
				}
				n++
				sh := c.share(r)
				if r.failed != "" {
					sh = 0
				}
				shares = append(shares, sh)
				wasted += r.wasted
				if ld >= 2 && sh >= 0.97 || ld < 2 && r.goodput >= 0.97*math.Min(r.offeredRate, c.capacity) {
					ok++
				}
			}
			if n == 0 {
				row = append(row, "-")
				continue
			}
			slices.Sort(shares)
			row = append(row, fmt.Sprintf("%.0f%% / %.0f%%, %d of %d, %d", 100*shares[len(shares)/2], 100*shares[0], ok, n, wasted))
		}
		rows = append(rows, row)
	}
	return "Across the grid, goodput as % of capacity:\n\n" + table(header, rows)
}

func cellKinds(cells []gridCell) []kind {
	var ks []kind
	for _, r := range cells[0].res {
		ks = append(ks, r.spec.kind)
	}
	return ks
}

func kindIn(ks []kind, k kind) bool {
	for _, x := range ks {
		if x == k {
			return true
		}
	}
	return false
}

func kindInitials(ks []kind) string {
	initials := [...]string{"u", "b", "m", "t"}
	var out []string
	for _, k := range ks {
		out = append(out, initials[k])
	}
	return strings.Join(out, "/")
}

// writeGridCSV writes one line per cell and consumer, for comparing runs.
func writeGridCSV(cells []gridCell, broker, file string) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	cw := csv.NewWriter(f)
	_ = cw.Write([]string{"broker", "workers", "cost_ms", "deadline_ms", "capacity", "load", "consumer", "offered", "goodput", "share",
		"p50_ms", "p99_ms", "wasted", "late", "expired", "shed", "peak_in_flight", "peak_heap_bytes", "failed"})
	for _, c := range cells {
		for _, r := range c.res {
			_ = cw.Write([]string{broker, fmt.Sprint(c.workers), fmtMS(c.cost), fmtMS(c.deadline), fmt.Sprintf("%.1f", c.capacity), fmt.Sprint(c.load),
				r.spec.kind.String(), fmt.Sprintf("%.1f", r.offeredRate), fmt.Sprintf("%.1f", r.goodput), fmt.Sprintf("%.4f", c.share(r)),
				fmtMS(r.p50), fmtMS(r.p99), fmt.Sprint(r.wasted), fmt.Sprint(r.late), fmt.Sprint(r.expired), fmt.Sprint(r.shed),
				fmt.Sprint(r.peakInFlight), fmt.Sprint(r.peakHeap), r.failed})
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// readGridCSV reads what writeGridCSV wrote: the cells and the broker.
func readGridCSV(file string) ([]gridCell, string, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, "", err
	}
	defer f.Close()
	recs, err := csv.NewReader(f).ReadAll()
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", file, err)
	}
	if len(recs) < 1 || len(recs[0]) < 18 || recs[0][0] != "broker" {
		return nil, "", fmt.Errorf("%s: not a grid.csv", file)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	kindOf := map[string]kind{}
	for _, k := range allKinds {
		kindOf[k.String()] = k
	}
	var cells []gridCell
	var broker string
	for n, rec := range recs[1:] {
		bad := func(field string) error { return fmt.Errorf("%s: line %d: bad %s", file, n+2, field) }
		num := func(field string) (float64, error) {
			v, err := strconv.ParseFloat(rec[col[field]], 64)
			if err != nil {
				return 0, bad(field)
			}
			return v, nil
		}
		dur := func(field string) (time.Duration, error) {
			v, err := num(field)
			return time.Duration(v * float64(time.Millisecond)), err
		}
		broker = rec[col["broker"]]
		var c gridCell
		var r result
		var workers, wasted, late, expired, shed, peak, heap float64
		var err error
		for _, x := range []struct {
			p *float64
			f string
		}{{&workers, "workers"}, {&c.capacity, "capacity"}, {&c.load, "load"}, {&r.offeredRate, "offered"}, {&r.goodput, "goodput"},
			{&wasted, "wasted"}, {&late, "late"}, {&expired, "expired"}, {&shed, "shed"}, {&peak, "peak_in_flight"}, {&heap, "peak_heap_bytes"}} {
			if *x.p, err = num(x.f); err != nil {
				return nil, "", err
			}
		}
		for _, x := range []struct {
			p *time.Duration
			f string
		}{{&c.cost, "cost_ms"}, {&c.deadline, "deadline_ms"}, {&r.p50, "p50_ms"}, {&r.p99, "p99_ms"}} {
			if *x.p, err = dur(x.f); err != nil {
				return nil, "", err
			}
		}
		k, ok := kindOf[rec[col["consumer"]]]
		if !ok {
			return nil, "", bad("consumer")
		}
		c.workers = int(workers)
		r.spec = trialSpec{kind: k, workers: c.workers, cost: c.cost, deadline: c.deadline}
		r.wasted, r.late, r.expired, r.shed, r.peakInFlight, r.peakHeap = int(wasted), int(late), int(expired), int(shed), int(peak), uint64(heap)
		if i, ok := col["failed"]; ok {
			r.failed = rec[i]
		}
		if last := len(cells) - 1; last >= 0 && cells[last].workers == c.workers && cells[last].cost == c.cost &&
			cells[last].deadline == c.deadline && cells[last].load == c.load {
			cells[last].res = append(cells[last].res, r)
			continue
		}
		c.res = []result{r}
		cells = append(cells, c)
	}
	return cells, broker, nil
}

func fmtMS(d time.Duration) string {
	return strconv.FormatFloat(float64(d)/float64(time.Millisecond), 'f', -1, 64)
}

// heatGrid is one consumer's cells as a heat map: columns are loads, rows
// are handler × deadline; the value is goodput as a share of what was
// achievable (the offered load, at most capacity).
type heatGrid struct {
	loads []float64
	rows  []string
	z     [][]float64 // [row][col]
}

func (h heatGrid) Dims() (c, r int)   { return len(h.loads), len(h.rows) }
func (h heatGrid) Z(c, r int) float64 { return h.z[r][c] }
func (h heatGrid) X(c int) float64    { return float64(c) }
func (h heatGrid) Y(r int) float64    { return float64(r) }
func (h heatGrid) Min() float64       { return 0 }
func (h heatGrid) Max() float64       { return 1 }

// ramp is a red → yellow → green palette of n colours.
type ramp int

func (n ramp) Colors() []color.Color {
	out := make([]color.Color, n)
	for i := range out {
		x := float64(i) / float64(n-1)
		// Most of the range is red to orange: the interesting part is the
		// last few percent, yellow at 90%, green from 97%.
		var r, g float64
		switch {
		case x < 0.9:
			r, g = 1, 0.75*x/0.9
		case x < 0.97:
			r, g = 1-0.6*(x-0.9)/0.07, 0.75+0.1*(x-0.9)/0.07
		default:
			r, g = 0.25, 0.8
		}
		out[i] = color.RGBA{R: uint8(255 * r), G: uint8(255 * g), B: 70, A: 255}
	}
	return out
}

// plotGrid draws one heat map per consumer, side by side: goodput as a
// share of the achievable (colour) and of capacity (the number).
func plotGrid(cells []gridCell, broker, file string) error {
	if len(cells) == 0 {
		return nil
	}
	var loads []float64
	var rowKeys []string
	rowOf := map[string]int{}
	colOf := map[float64]int{}
	for _, c := range cells {
		if _, ok := colOf[c.load]; !ok {
			colOf[c.load] = len(loads)
			loads = append(loads, c.load)
		}
		key := fmt.Sprintf("%s, %v", c.handler(), c.deadline)
		if _, ok := rowOf[key]; !ok {
			rowOf[key] = len(rowKeys)
			rowKeys = append(rowKeys, key)
		}
	}
	kinds := cellKinds(cells)
	var plots []*plot.Plot
	for _, k := range kinds {
		h := heatGrid{loads: loads, rows: rowKeys, z: make([][]float64, len(rowKeys))}
		labels := plotter.XYLabels{}
		for i := range h.z {
			h.z[i] = make([]float64, len(loads))
			for j := range h.z[i] {
				h.z[i][j] = math.NaN()
			}
		}
		for _, c := range cells {
			r, ok := c.of(k)
			if !ok {
				continue
			}
			row, col := rowOf[fmt.Sprintf("%s, %v", c.handler(), c.deadline)], colOf[c.load]
			achievable := math.Min(r.offeredRate, c.capacity)
			h.z[row][col] = math.Min(1, r.goodput/achievable)
			lbl := fmt.Sprintf("%.0f", 100*c.share(r))
			if r.wasted > 0 {
				lbl += "*"
			}
			labels.XYs = append(labels.XYs, plotter.XY{X: float64(col), Y: float64(row)})
			labels.Labels = append(labels.Labels, lbl)
		}
		p := plot.New()
		p.Title.Text = k.String()
		hm := plotter.NewHeatMap(h, ramp(64))
		hm.NaN = color.Gray{Y: 220}
		p.Add(hm)
		if len(labels.XYs) > 0 {
			l, err := plotter.NewLabels(labels)
			if err != nil {
				return err
			}
			for i := range l.TextStyle {
				l.TextStyle[i].Handler = plot.DefaultTextHandler
				l.TextStyle[i].XAlign, l.TextStyle[i].YAlign = text.XCenter, text.YCenter
				l.TextStyle[i].Font.Size = vg.Points(8)
			}
			p.Add(l)
		}
		var xt, yt []plot.Tick
		for i, ld := range loads {
			xt = append(xt, plot.Tick{Value: float64(i), Label: fmt.Sprintf("%g×", ld)})
		}
		for i, rk := range rowKeys {
			yt = append(yt, plot.Tick{Value: float64(i), Label: rk})
		}
		p.X.Tick.Marker, p.Y.Tick.Marker = plot.ConstantTicks(xt), plot.ConstantTicks(yt)
		p.X.Label.Text = "offered load × capacity"
		p.X.Min, p.X.Max = -0.5, float64(len(loads))-0.5
		p.Y.Min, p.Y.Max = -0.5, float64(len(rowKeys))-0.5
		plots = append(plots, p)
	}
	cols := min(len(plots), 4)
	rows := (len(plots) + cols - 1) / cols
	width := vg.Length(cols) * 3.6 * vg.Inch
	height := vg.Length(rows)*(1.2*vg.Inch+vg.Length(len(rowKeys))*0.22*vg.Inch) + 0.6*vg.Inch
	img := vgimg.New(width, height)
	dc := draw.New(img)
	titleH := 0.5 * vg.Inch
	top := draw.Canvas{Canvas: dc.Canvas, Rectangle: vg.Rectangle{Min: vg.Point{X: dc.Min.X, Y: dc.Max.Y - titleH}, Max: dc.Max}}
	body := draw.Canvas{Canvas: dc.Canvas, Rectangle: vg.Rectangle{Min: dc.Min, Max: vg.Point{X: dc.Max.X, Y: dc.Max.Y - titleH}}}
	sty := draw.TextStyle{Color: color.Black, Font: plot.DefaultFont, Handler: plot.DefaultTextHandler, XAlign: text.XCenter, YAlign: text.YCenter}
	sty.Font.Size = vg.Points(11)
	top.FillText(sty, vg.Point{X: (top.Min.X + top.Max.X) / 2, Y: (top.Min.Y + top.Max.Y) / 2},
		fmt.Sprintf("%s: goodput, %% of capacity (colour: share of min(offered, capacity); * = handler runs on expired messages)", broker))
	grid := make([][]*plot.Plot, rows)
	for i := range grid {
		grid[i] = make([]*plot.Plot, cols)
		for j := range grid[i] {
			if k := i*cols + j; k < len(plots) {
				grid[i][j] = plots[k]
			}
		}
	}
	tiles := draw.Tiles{Rows: rows, Cols: cols, PadTop: vg.Points(4), PadBottom: vg.Points(4), PadLeft: vg.Points(4), PadRight: vg.Points(8), PadX: vg.Points(8), PadY: vg.Points(8)}
	canvases := plot.Align(grid, tiles, body)
	for i := range grid {
		for j, p := range grid[i] {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
	}
	return writePNG(img, file)
}
