package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/metrics"
)

func main() {
	if child, code := serveIfChild(); child {
		os.Exit(code)
	}
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "overloadlab:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if _, err := runLab(ctx, cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "overloadlab:", err)
		os.Exit(1)
	}
}

// config is the lab's command line.
type config struct {
	mode     string // steps, drop, backpressure, all
	broker   string // nats, memory, kafka (hook)
	natsURL  string
	inProc   bool   // embedded nats-server in this process rather than a child
	out      string // directory for tables and the plot; "" writes none
	workers  int
	cost     time.Duration
	deadline time.Duration
	steps    []float64
	stepDur  time.Duration
	warmup   time.Duration // -1: auto
	window   int
	margin   time.Duration // the tuned route's ShedNearDeadline (0: none); drop mode: 0 means startByMargin
	queueCap int           // the plain bounded queue's bound
	kinds    []kind        // the consumers each step and grid cell runs
	capacity float64       // msg/s; 0 measures it
	capDur   time.Duration
	payload  int

	dropLoad  float64 // offered load of the drop comparison, × capacity
	dropQueue int     // queue bound of the drop comparison
	dropHigh  float64 // share of CRITICAL messages in the drop comparison

	bpRate    float64
	bpWorkers int
	bpCost    time.Duration
	bpDur     time.Duration
	bpQueue   int

	isoLoad   float64 // isolation mode: orders load × capacity
	isoRounds int
	isoDur    time.Duration

	metricsAddr string
	observer    consumer.Observer // set by runLab when metricsAddr is
	quick       bool

	grid    gridConfig
	degrade degradeConfig
	// loadstep is -mode loadstep's (loadstep.go).
	loadstep loadstepConfig
	cpu      cpuConfig
	costMix  costConfig
}

// modes lists -mode's values.
var modes = []string{"steps", "drop", "backpressure", "isolation", "all", "grid", "degrade", "cpu", "cost", "loadstep"}

// parseKinds reads -consumers.
func parseKinds(s string) ([]kind, error) {
	names := map[string]kind{"unprotected": unprotected, "bounded": boundedQueue, "minimal": sluiceMinimal, "tuned": sluiceTuned}
	var out []kind
	for _, f := range strings.Split(s, ",") {
		k, ok := names[strings.TrimSpace(f)]
		if !ok {
			return nil, fmt.Errorf("bad -consumers value %q (unprotected, bounded, minimal, tuned)", f)
		}
		if !slices.Contains(out, k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out, nil
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("overloadlab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.mode, "mode", "steps", "what to run: steps, drop, backpressure, isolation, all (those four), grid, degrade, cpu, cost or loadstep")
	fs.StringVar(&c.broker, "broker", "nats", "nats (embedded nats-server unless -nats-url or $NATS_URL), memory (no broker round trip), kafka (not wired yet)")
	fs.StringVar(&c.natsURL, "nats-url", os.Getenv("NATS_URL"), "external NATS server with JetStream, e.g. nats://127.0.0.1:4222 from docker-compose; empty starts an embedded one")
	fs.BoolVar(&c.inProc, "nats-in-process", false, "run the embedded nats-server in this process (its heap then counts in peak heap) instead of a child process")
	fs.StringVar(&c.out, "out", "", "directory for the tables (*.txt) and the plot (steps.png); empty writes none")
	fs.IntVar(&c.workers, "workers", 4, "handler goroutines, the same for both consumers")
	fs.DurationVar(&c.cost, "cost", 20*time.Millisecond, "handler cost per message, a sleep (I/O-like)")
	fs.DurationVar(&c.deadline, "deadline", 500*time.Millisecond, "each message's deadline after its publish time")
	steps := fs.String("steps", "0.5,1,2,5,10", "offered load steps, × measured capacity")
	fs.DurationVar(&c.stepDur, "step-duration", 8*time.Second, "how long each consumer is offered each step")
	fs.DurationVar(&c.warmup, "warmup", -1, "start of the measurement in each trial (steady state only); negative means min(deadline + 1s, half the trial)")
	fs.IntVar(&c.window, "window", 0, "tuned sluice route's fixed window (Window.Messages); 0 leaves the window that finds its size; the drop, backpressure and isolation modes' routes: 0 means 2×workers")
	fs.DurationVar(&c.margin, "margin", 0, "tuned sluice route's ShedNearDeadline: a message with less than this left before its deadline is shed, not started; 0 means none (predictive expiry alone); the drop mode's start-by row: 0 means max(2×cost, deadline/5) capped at deadline − cost, negative disables")
	fs.IntVar(&c.queueCap, "queue", 50, "the plain bounded queue's bound (messages)")
	consumers := fs.String("consumers", "unprotected,bounded,minimal,tuned", "the consumers to compare: unprotected, bounded (plain client + bounded queue + expiry check), minimal (sluice, least configuration), tuned (sluice, the lab's advice)")
	fs.Float64Var(&c.capacity, "capacity", 0, "capacity in msg/s; 0 measures it first")
	fs.DurationVar(&c.capDur, "capacity-duration", 3*time.Second, "how long the capacity measurement runs")
	fs.IntVar(&c.payload, "payload", 256, "message payload bytes")
	fs.Float64Var(&c.dropLoad, "drop-load", 2.5, "drop mode: offered load × capacity")
	fs.IntVar(&c.dropQueue, "drop-queue", 50, "drop mode: queue bound (messages) for tail-drop and head-drop")
	fs.Float64Var(&c.dropHigh, "drop-critical", 0.2, "drop mode: share of messages sent CRITICAL (the rest SHEDDABLE)")
	fs.Float64Var(&c.bpRate, "bp-rate", 500, "backpressure mode: producer rate, msg/s")
	fs.IntVar(&c.bpWorkers, "bp-workers", 1, "backpressure mode: consumer workers")
	fs.DurationVar(&c.bpCost, "bp-cost", 6*time.Millisecond, "backpressure mode: handler cost (1 worker × 6 ms ≈ 160/s)")
	fs.DurationVar(&c.bpDur, "bp-duration", 6*time.Second, "backpressure mode: how long the producer runs")
	fs.IntVar(&c.bpQueue, "bp-queue", 100, "backpressure mode: bound of the bounded queue")
	fs.Float64Var(&c.isoLoad, "iso-load", 0.5, "isolation mode: the critical route's offered load × capacity")
	fs.IntVar(&c.isoRounds, "iso-rounds", 3, "isolation mode: interleaved rounds of each phase (the median round is reported)")
	fs.DurationVar(&c.isoDur, "iso-duration", 4*time.Second, "isolation mode: how long each round offers load")
	fs.StringVar(&c.metricsAddr, "metrics-addr", os.Getenv("METRICS_ADDR"), "serve sluice's Prometheus metrics on this address (docker-compose scrapes 0.0.0.0:9465); empty serves none")
	quick := fs.Bool("quick", false, "a short run: steps 1,2,10 of 2 s, shorter capacity, drop and backpressure modes; the grid's short form")
	c.addModeFlags(fs)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c.quick = *quick
	if *quick {
		if !set["steps"] {
			*steps = "1,2,10"
		}
		if !set["step-duration"] {
			c.stepDur = 2 * time.Second
		}
		if !set["capacity-duration"] {
			c.capDur = 1500 * time.Millisecond
		}
		if !set["bp-duration"] {
			c.bpDur = 3 * time.Second
		}
		if !set["iso-rounds"] {
			c.isoRounds = 1
		}
		if !set["iso-duration"] {
			c.isoDur = 2 * time.Second
		}
	}
	for _, s := range strings.Split(*steps, ",") {
		v, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || v <= 0 {
			return c, fmt.Errorf("bad -steps value %q", s)
		}
		c.steps = append(c.steps, v)
	}
	switch {
	case c.workers <= 0:
		return c, errors.New("-workers must be > 0")
	case c.cost <= 0 || c.deadline <= 0 || c.stepDur <= 0 || c.capDur <= 0:
		return c, errors.New("-cost, -deadline, -step-duration and -capacity-duration must be > 0")
	case !slices.Contains(modes, c.mode):
		return c, fmt.Errorf("unknown -mode %q", c.mode)
	case c.queueCap <= 0:
		return c, errors.New("-queue must be > 0")
	case c.isoLoad <= 0 || c.isoRounds <= 0 || c.isoDur <= 0:
		return c, errors.New("-iso-load, -iso-rounds and -iso-duration must be > 0")
	case c.bpRate <= 0 || c.bpWorkers <= 0 || c.bpCost <= 0 || c.bpQueue <= 0 || c.dropQueue <= 0 || c.dropLoad <= 0 || c.dropHigh <= 0 || c.dropHigh >= 1:
		return c, errors.New("-bp-*, -drop-queue and -drop-load must be > 0, -drop-critical in (0, 1)")
	}
	var err error
	if c.mode == "loadstep" && !set["consumers"] {
		*consumers = "unprotected,bounded,minimal" // issue 26's three
	}
	if c.kinds, err = parseKinds(*consumers); err != nil {
		return c, err
	}
	if err := c.parseModeFlags(set); err != nil {
		return c, err
	}
	return c, nil
}

// report is everything one lab run measured.
type report struct {
	capacity float64
	steps    []stepResult
	drop     []dropRow
	bp       []bpRow
	iso      []isoRow
	grid     []gridCell
	degrade  []degradeRow
	loadstep []loadstepRow
	cpu      []cpuRow
	cost     []costRow
}

type stepResult struct {
	load float64
	res  []result // one per cfg.kinds
}

// of returns the step's result for consumer k, if it ran.
func (s stepResult) of(k kind) (result, bool) { return resultOf(s.res, k) }

// resultOf returns consumer k's result among res, if it ran.
func resultOf(res []result, k kind) (result, bool) {
	for _, r := range res {
		if r.spec.kind == k {
			return r, true
		}
	}
	return result{}, false
}

// runLab runs cfg.mode and prints the tables to w (and to cfg.out).
func runLab(ctx context.Context, cfg config, w io.Writer) (*report, error) {
	if cfg.mode == "grid" && cfg.grid.csv != "" {
		rep := &report{}
		return rep, renderGrid(cfg, rep, w)
	}
	b, err := newBroker(cfg.broker, cfg.natsURL, cfg.inProc, cfg.payload)
	if err != nil {
		return nil, err
	}
	defer b.close()
	if cfg.out != "" {
		if err := os.MkdirAll(cfg.out, 0o755); err != nil {
			return nil, err
		}
	}
	if cfg.metricsAddr != "" {
		stop, err := serveMetrics(&cfg, w)
		if err != nil {
			return nil, err
		}
		defer stop()
	}
	rep := &report{capacity: cfg.capacity}
	if cfg.mode == "grid" || cfg.mode == "degrade" || cfg.mode == "cpu" || cfg.mode == "cost" || cfg.mode == "loadstep" {
		return rep, runOwnMode(ctx, b, cfg, rep, w)
	}
	fmt.Fprintf(w, "overloadlab: broker %s, %d workers × %v sleep, deadline %v; plain bounded queue %d; sluice minimal: defaults; sluice tuned: %s\n",
		b.name(), cfg.workers, cfg.cost, cfg.deadline, cfg.queueCap, cfg.tunedSummary())
	needCap := cfg.mode != "backpressure"
	if needCap && rep.capacity == 0 {
		c, err := measureCapacity(ctx, b, cfg)
		if err != nil {
			return nil, fmt.Errorf("measuring capacity: %w", err)
		}
		rep.capacity = c
		fmt.Fprintf(w, "measured capacity: %.0f msg/s (nominal %.0f)\n", c, float64(cfg.workers)/cfg.cost.Seconds())
	}
	emit := cfg.emitter(w)
	if cfg.mode == "steps" || cfg.mode == "all" {
		if err := runSteps(ctx, b, cfg, rep); err != nil {
			return rep, err
		}
		if err := emit("steps.txt", stepsTable(rep)); err != nil {
			return rep, err
		}
		if cfg.out != "" {
			if err := plotSteps(rep, filepath.Join(cfg.out, "steps.png")); err != nil {
				return rep, err
			}
			fmt.Fprintln(w, "plot:", filepath.Join(cfg.out, "steps.png"))
		}
	}
	if cfg.mode == "drop" || cfg.mode == "all" {
		if err := runDrop(ctx, b, cfg, rep); err != nil {
			return rep, err
		}
		if err := emit("drop.txt", dropTable(rep, cfg)); err != nil {
			return rep, err
		}
	}
	if cfg.mode == "backpressure" || cfg.mode == "all" {
		if err := runBackpressure(ctx, b, cfg, rep); err != nil {
			return rep, err
		}
		if err := emit("backpressure.txt", bpTable(rep, cfg)); err != nil {
			return rep, err
		}
	}
	if cfg.mode == "isolation" || cfg.mode == "all" {
		if err := runIsolation(ctx, b, cfg, rep); err != nil {
			return rep, err
		}
		if err := emit("isolation.txt", isoTable(rep, cfg)); err != nil {
			return rep, err
		}
	}
	return rep, nil
}

// emitter returns a function that prints a table to w and writes it to
// cfg.out/file.
func (c config) emitter(w io.Writer) func(file, text string) error {
	return func(file, text string) error {
		fmt.Fprintln(w)
		fmt.Fprint(w, text)
		if c.out == "" {
			return nil
		}
		return os.WriteFile(filepath.Join(c.out, file), []byte(text), 0o644)
	}
}

// emitWithPlot emits text as name.txt (see emitter) and, with an output
// directory, draws name.png there with plot and prints its path.
func (c config) emitWithPlot(w io.Writer, name, text string, plot func(png string) error) error {
	if err := c.emitter(w)(name+".txt", text); err != nil {
		return err
	}
	if c.out == "" {
		return nil
	}
	png := filepath.Join(c.out, name+".png")
	if err := plot(png); err != nil {
		return err
	}
	fmt.Fprintln(w, "plot:", png)
	return nil
}

// tunedWindow is the tuned route's fixed window: -window, or 0 (the
// window that finds its size, as Window.Messages's documentation
// advises).
func (c config) tunedWindow() int { return max(c.window, 0) }

// tunedMargin is the tuned route's ShedNearDeadline: -margin, or none
// (predictive expiry; the option is an explicit floor on top of it).
func (c config) tunedMargin() time.Duration { return max(c.margin, 0) }

// tunedSummary says what the tuned route sets beyond the minimal one.
func (c config) tunedSummary() string {
	w, m := "the window that finds its size", "no ShedNearDeadline"
	if c.tunedWindow() > 0 {
		w = fmt.Sprintf("a fixed window of %d", c.tunedWindow())
	}
	if c.tunedMargin() > 0 {
		m = fmt.Sprintf("ShedNearDeadline %v", c.tunedMargin())
	}
	return w + ", " + m + ", ShedAck, CriticalPlus, one attempt, the Source's tuned options"
}

// windowFor is the window of the drop, backpressure and isolation modes'
// sluice routes for workers (they keep the reference run's 2×workers).
func (c config) windowFor(workers int) int {
	if c.window > 0 {
		return c.window
	}
	return 2 * workers
}

// marginFor is the drop mode's start-by margin for a handler cost and deadline.
func (c config) marginFor(cost, deadline time.Duration) time.Duration {
	switch {
	case c.margin < 0 || deadline == 0:
		return 0
	case c.margin > 0:
		return c.margin
	}
	return startByMargin(cost, deadline)
}

// warmupFor is where a trial of dur with deadline starts measuring.
func (c config) warmupFor(deadline, dur time.Duration) time.Duration {
	if c.warmup >= 0 {
		return min(c.warmup, dur/2)
	}
	return min(deadline+time.Second, dur/2)
}

func (c config) spec(name string, k kind, rate float64) trialSpec {
	return trialSpec{
		name: name, kind: k, rate: rate, duration: c.stepDur, warmup: c.warmupFor(c.deadline, c.stepDur),
		workers: c.workers, cost: c.cost, deadline: c.deadline, queueCap: c.queueCap,
		window: c.tunedWindow(), margin: c.tunedMargin(), observer: c.observer, payload: c.payload,
		drain: c.deadline + c.cost + 100*time.Millisecond,
	}
}

// serveMetrics registers a metrics.Observer for every sluice route the lab
// runs (each trial is its own route) and serves it on cfg.metricsAddr.
func serveMetrics(cfg *config, w io.Writer) (stop func(), err error) {
	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", cfg.metricsAddr)
	if err != nil {
		return nil, err
	}
	cfg.observer = obs
	hs := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: time.Second}
	done := make(chan struct{})
	go func() { defer close(done); _ = hs.Serve(ln) }()
	fmt.Fprintf(w, "metrics at http://%s/metrics\n", ln.Addr())
	return func() { _ = hs.Close(); <-done }, nil
}

// measureCapacity drains a prefilled backlog without deadlines through the
// unprotected consumer and returns its rate.
func measureCapacity(ctx context.Context, b broker, cfg config) (float64, error) {
	return capacityOf(ctx, b, cfg, "capacity", cfg.workers, cfg.cost)
}

// capacityOf measures the capacity of workers × cost (see measureCapacity).
func capacityOf(ctx context.Context, b broker, cfg config, name string, workers int, cost time.Duration) (float64, error) {
	return capacityWith(ctx, b, cfg, name, workers, cost, nil)
}

// capacityWith measures the capacity of workers running wk (nil: a sleep of
// cost) with the unprotected consumer draining a backlog without deadlines.
func capacityWith(ctx context.Context, b broker, cfg config, name string, workers int, cost time.Duration, wk work) (float64, error) {
	cfg.workers, cfg.cost = workers, cost
	nominal := float64(workers) / cost.Seconds()
	s := cfg.spec(name, unprotected, 0)
	s.deadline, s.duration, s.warmup, s.work, s.keepRuns = 0, cfg.capDur, 0, wk, true
	// The backlog is drained for twice the duration and the rate taken
	// from the first handled run to the last, so a client slow to start
	// on a large backlog (kafka-go's first fetch of it) does not count.
	s.drain = cfg.capDur
	s.prefill = int(nominal*2*cfg.capDur.Seconds()*1.2) + 100
	r, err := runTrial(ctx, b, s)
	if err != nil {
		return 0, err
	}
	return drainRate(r.runs, workers, cost)
}

// drainRate is the rate of the successful runs, from the first start to
// the last end.
func drainRate(runs []runRec, workers int, cost time.Duration) (float64, error) {
	var n int
	var first, last time.Time
	for _, x := range runs {
		if !x.ok {
			continue
		}
		n++
		if first.IsZero() || x.start.Before(first) {
			first = x.start
		}
		if x.end.After(last) {
			last = x.end
		}
	}
	if n < 10 || !last.After(first) {
		return 0, fmt.Errorf("capacity of %d × %v: only %d messages handled", workers, cost, n)
	}
	return float64(n) / last.Sub(first).Seconds(), nil
}

func runSteps(ctx context.Context, b broker, cfg config, rep *report) error {
	for i, load := range cfg.steps {
		rate := load * rep.capacity
		sr := stepResult{load: load}
		for _, k := range cfg.kinds {
			r, err := runTrial(ctx, b, cfg.spec(fmt.Sprintf("s%d_%d", i, k), k, rate))
			if err != nil {
				return fmt.Errorf("%g× %v: %w", load, k, err)
			}
			sr.res = append(sr.res, r)
		}
		rep.steps = append(rep.steps, sr)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}
