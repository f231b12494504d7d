package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"image/color"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// cpuConfig is -mode cpu (issue 11, section 3): a CPU-bound handler, so
// the handler competes with the broker client, the producer and the GC for
// the same cores.
type cpuConfig struct {
	spin    time.Duration
	load    float64
	dur     time.Duration
	workers int
	target  float64
}

func (c *config) addCPUFlags(fs *flag.FlagSet) {
	p := &c.cpu
	fs.DurationVar(&p.spin, "cpu-spin", 5*time.Millisecond, "cpu mode: CPU time one message costs (a busy loop calibrated on this machine)")
	fs.Float64Var(&p.load, "cpu-load", 3, "cpu mode: offered load × capacity")
	fs.DurationVar(&p.dur, "cpu-duration", 10*time.Second, "cpu mode: how long each consumer is offered the load")
	fs.IntVar(&p.workers, "cpu-workers", 0, "cpu mode: handler workers; 0 means 2 per core available")
	fs.Float64Var(&p.target, "cpu-target", 0.8, "cpu mode: the CPU target, a share of the cores available")
}

func (c *config) parseCPUFlags(set map[string]bool) error {
	p := &c.cpu
	if c.quick && !set["cpu-duration"] {
		p.dur = 4 * time.Second
	}
	if p.workers == 0 {
		p.workers = max(1, int(2*coresAvailable()+0.5))
	}
	if p.spin <= 0 || p.load <= 0 || p.dur <= 0 || p.workers < 0 || !(p.target > 0 && p.target <= 1) {
		return errors.New("-cpu-*: spin, load and duration must be > 0, target in (0, 1]")
	}
	return nil
}

// coresAvailable is the CPU this process may use: the cgroup v2 quota
// (cpu.max) where there is one, else the number of CPUs.
func coresAvailable() float64 {
	n := float64(runtime.NumCPU())
	b, err := os.ReadFile("/sys/fs/cgroup/cpu.max")
	if err != nil {
		return n
	}
	f := strings.Fields(string(b))
	if len(f) != 2 || f[0] == "max" {
		return n
	}
	quota, err1 := strconv.ParseFloat(f[0], 64)
	period, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || period <= 0 || quota <= 0 {
		return n
	}
	return min(n, quota/period)
}

// spin burns CPU: n rounds of xorshift.
func spin(n int, x uint64) uint64 {
	x |= 1
	for range n {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
	}
	return x
}

var (
	spinOnce    sync.Once
	spinPerMsec float64
	spinSink    uint64
	spinMu      sync.Mutex
)

// spinRate calibrates spin once: rounds per millisecond of CPU, the best of
// a few tries (the fastest is the one least disturbed by other work).
func spinRate() float64 {
	spinOnce.Do(func() {
		const n = 2_000_000
		best := time.Duration(1 << 62)
		for range 7 {
			t := time.Now()
			x := spin(n, uint64(t.UnixNano()))
			if d := time.Since(t); d < best {
				best = d
			}
			spinMu.Lock()
			spinSink ^= x
			spinMu.Unlock()
		}
		spinPerMsec = n / (float64(best) / float64(time.Millisecond))
	})
	return spinPerMsec
}

// cpuWork is a CPU-bound handler: d of CPU on an idle core, checking ctx
// every tenth of it.
func cpuWork(d time.Duration) work {
	total := int(spinRate() * float64(d) / float64(time.Millisecond))
	return func(ctx context.Context, m labMsg) (bool, error) {
		x := m.id
		for i := 0; i < 10; i++ {
			if err := ctx.Err(); err != nil {
				return false, err
			}
			x = spin(total/10, x)
		}
		if x == 0 { // never: keeps the loop from being optimised away
			return false, errors.New("spin")
		}
		return false, nil
	}
}

// cpuSample is the process's CPU time at a moment.
type cpuSample struct {
	at  time.Time
	cpu time.Duration // user + system
}

func readCPU() cpuSample {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return cpuSample{at: time.Now(), cpu: time.Duration(ru.Utime.Nano() + ru.Stime.Nano())}
}

// cpuSampler samples the process's CPU time every 100 ms.
type cpuSampler struct {
	mu      sync.Mutex
	samples []cpuSample
	stop    chan struct{}
	done    chan struct{}
}

func startCPUSampler() *cpuSampler {
	s := &cpuSampler{stop: make(chan struct{}), done: make(chan struct{})}
	s.samples = append(s.samples, readCPU())
	go func() {
		defer close(s.done)
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-s.stop:
				return
			case <-t.C:
				x := readCPU()
				s.mu.Lock()
				s.samples = append(s.samples, x)
				s.mu.Unlock()
			}
		}
	}()
	return s
}

func (s *cpuSampler) finish() []cpuSample {
	close(s.stop)
	<-s.done
	return s.samples
}

// cpuShare is the process's CPU use over w as a share of cores: the mean,
// and the highest over any 1 s.
func cpuShare(samples []cpuSample, w window, cores float64) (mean, peak float64) {
	var in []cpuSample
	for _, x := range samples {
		if w.has(x.at) {
			in = append(in, x)
		}
	}
	if len(in) < 2 {
		return 0, 0
	}
	use := func(a, b cpuSample) float64 {
		return float64(b.cpu-a.cpu) / float64(b.at.Sub(a.at)) / cores
	}
	mean = use(in[0], in[len(in)-1])
	for i := range in {
		for j := i + 1; j < len(in); j++ {
			if in[j].at.Sub(in[i].at) >= time.Second {
				peak = max(peak, use(in[i], in[j]))
				break
			}
		}
	}
	return mean, peak
}

// cpuRow is one consumer in cpu mode.
type cpuRow struct {
	kind            kind
	label           string
	capacity, good  float64
	p50, p99        time.Duration
	cpuMean, cpuMax float64
	wasted          int
	cpuLine         plotter.XYs // process CPU share per 500 ms, from the producer's start
	goodLine        plotter.XYs // on-time successes per second, 500 ms bins
}

// cpuBin is the resolution of cpu.png.
const cpuBin = 500 * time.Millisecond

// cpuTimeline bins a trial's CPU samples and on-time runs.
func cpuTimeline(r result, samples []cpuSample, cores float64, total time.Duration) (cpu, good plotter.XYs) {
	n := int(total / cpuBin)
	prev := 0
	for i := 1; i <= n; i++ {
		end := r.start.Add(time.Duration(i) * cpuBin)
		j := prev
		for j < len(samples)-1 && samples[j+1].at.Before(end) {
			j++
		}
		if j > prev {
			a, b := samples[prev], samples[j]
			cpu = append(cpu, plotter.XY{X: (time.Duration(i) * cpuBin).Seconds(), Y: float64(b.cpu-a.cpu) / float64(b.at.Sub(a.at)) / cores})
			prev = j
		}
	}
	counts := make([]int, n)
	for _, x := range r.runs {
		if i := int(x.end.Sub(r.start) / cpuBin); x.onTime && i >= 0 && i < n {
			counts[i]++
		}
	}
	for i, c := range counts {
		good = append(good, plotter.XY{X: (time.Duration(i+1) * cpuBin).Seconds(), Y: float64(c) / cpuBin.Seconds()})
	}
	return cpu, good
}

func runCPU(ctx context.Context, b broker, cfg config, rep *report, w io.Writer) error {
	p := cfg.cpu
	wk := cpuWork(p.spin)
	cores := coresAvailable()
	capacity, err := capacityWith(ctx, b, cfg, "cpu_cap", p.workers, p.spin, wk)
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "overloadlab cpu: broker %s, %d workers × %v of CPU, %.1f cores available, deadline %v; capacity %.0f msg/s (nominal %.0f)\n",
		b.name(), p.workers, p.spin, cores, cfg.deadline, capacity, cores/p.spin.Seconds())
	type variant struct {
		k        kind
		label    string
		resource bool
		cpuOnly  bool // the monitor's CPU signal alone (no scheduler latency)
	}
	var vs []variant
	for _, k := range cfg.kinds {
		vs = append(vs, variant{k, k.String(), false, false})
		if k == sluiceMinimal {
			vs = append(vs, variant{k, fmt.Sprintf("sluice minimal + resource signal (CPU target %.0f%%)", 100*p.target), true, false},
				variant{k, fmt.Sprintf("sluice minimal + resource signal, CPU only (target %.0f%%, SchedLatencyTarget -1)", 100*p.target), true, true})
		}
	}
	for i, v := range vs {
		s := cfg.spec(fmt.Sprintf("cpu_%d", i), v.k, p.load*capacity)
		s.workers, s.cost, s.duration, s.work = p.workers, p.spin, p.dur, wk
		s.warmup = min(cfg.deadline+2*time.Second, p.dur/2)
		s.drain, s.keepRuns = 0, true
		if v.resource {
			o := backpressure.ResourceOptions{CPUTarget: p.target}
			if v.cpuOnly {
				o.SchedLatencyTarget = -1
			}
			m, err := backpressure.NewResourceMonitor(o)
			if err != nil {
				return err
			}
			s.resource = m
		}
		smp := startCPUSampler()
		r, err := runTrial(ctx, b, s)
		samples := smp.finish()
		if err != nil {
			return fmt.Errorf("cpu %v: %w", v.label, err)
		}
		row := cpuRow{kind: v.k, label: v.label, capacity: capacity, good: r.goodput, p50: r.p50, p99: r.p99, wasted: r.wasted}
		row.cpuMean, row.cpuMax = cpuShare(samples, r.measureWindow(), cores)
		row.cpuLine, row.goodLine = cpuTimeline(r, samples, cores, p.dur)
		rep.cpu = append(rep.cpu, row)
	}
	return cfg.emitWithPlot(w, "cpu", cpuTable(rep.cpu, cfg, cores), func(png string) error { return plotCPU(rep.cpu, cfg, png) })
}

// plotCPU draws each consumer's process CPU share and on-time goodput over
// its trial, with the CPU target and the capacity marked.
func plotCPU(rows []cpuRow, cfg config, file string) error {
	if len(rows) == 0 {
		return nil
	}
	use, good := plot.New(), plot.New()
	use.Title.Text = "Process CPU (share of the cores available, 500 ms bins)"
	use.Y.Label.Text = "CPU share"
	good.Title.Text = "Goodput (on-time successes per second)"
	good.Y.Label.Text = "goodput, msg/s"
	good.X.Label.Text = "seconds since the load began"
	end := cfg.cpu.dur.Seconds()
	top := rows[0].capacity
	for _, ref := range []struct {
		pl   *plot.Plot
		y    float64
		name string
	}{{use, cfg.cpu.target, "CPU target"}, {good, rows[0].capacity, "measured capacity"}, {good, 0.9 * rows[0].capacity, "target: 90% of capacity"},
		{good, cfg.cpu.target * rows[0].capacity, "capacity at the CPU target"}} {
		l, err := plotter.NewLine(plotter.XYs{{X: 0, Y: ref.y}, {X: end, Y: ref.y}})
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
		switch {
		case strings.Contains(r.label, "CPU only"):
			st.col, st.dashes = color.RGBA{R: 230, G: 130, A: 255}, nil
		case strings.Contains(r.label, "resource"):
			st.col, st.dashes = color.RGBA{R: 120, B: 180, A: 255}, nil
		}
		for _, pair := range []struct {
			pl  *plot.Plot
			xys plotter.XYs
		}{{use, r.cpuLine}, {good, r.goodLine}} {
			if len(pair.xys) == 0 {
				continue
			}
			l, err := plotter.NewLine(pair.xys)
			if err != nil {
				return err
			}
			l.Color, l.Dashes = st.col, st.dashes
			pair.pl.Add(l)
			pair.pl.Legend.Add(r.label, l)
		}
		for _, xy := range r.goodLine {
			top = max(top, xy.Y)
		}
	}
	for _, p := range []*plot.Plot{use, good} {
		p.Add(plotter.NewGrid())
		p.X.Min, p.X.Max, p.Y.Min = 0, end, 0
		p.Legend.Top, p.Legend.Left = true, false
	}
	use.Y.Max, good.Y.Max = 1.6, 1.6*top
	return writeTwoPlots(use, good, file)
}

func cpuTable(rows []cpuRow, cfg config, cores float64) string {
	p := cfg.cpu
	header := []string{"consumer", "goodput", "% of capacity", "% of capacity at the CPU target", "p50", "p99", "process CPU (mean)", "process CPU (busiest 1 s)", "wasted"}
	var out [][]string
	for _, r := range rows {
		out = append(out, []string{r.label, rate(r.good), fmt.Sprintf("%.0f%%", 100*r.good/r.capacity),
			fmt.Sprintf("%.0f%%", 100*r.good/(r.capacity*p.target)), ms(r.p50), ms(r.p99),
			fmt.Sprintf("%.0f%%", 100*r.cpuMean), fmt.Sprintf("%.0f%%", 100*r.cpuMax), fmt.Sprint(r.wasted)})
	}
	return fmt.Sprintf("CPU-bound handler: %d workers × %v of CPU at %g× capacity, %.1f cores available, deadline %v; CPU as a share of the cores (producer included, broker not)\n"+
		"(target: process CPU ≤ %.0f%%, goodput ≥ 90%% of capacity, p99 < deadline; capacity is measured on all the cores,\n"+
		"capacity at the CPU target is %.0f%% of it: 90%% of capacity cannot be had at or under the target)\n\n",
		p.workers, p.spin, p.load, cores, cfg.deadline, 100*p.target, 100*p.target) + table(header, out)
}
