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
	window   int
	margin   time.Duration
	capacity float64 // msg/s; 0 measures it
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
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	var c config
	fs := flag.NewFlagSet("overloadlab", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.mode, "mode", "steps", "what to run: steps, drop, backpressure, isolation or all")
	fs.StringVar(&c.broker, "broker", "nats", "nats (embedded nats-server unless -nats-url or $NATS_URL), memory (no broker round trip), kafka (not wired yet)")
	fs.StringVar(&c.natsURL, "nats-url", os.Getenv("NATS_URL"), "external NATS server with JetStream, e.g. nats://127.0.0.1:4222 from docker-compose; empty starts an embedded one")
	fs.BoolVar(&c.inProc, "nats-in-process", false, "run the embedded nats-server in this process (its heap then counts in peak heap) instead of a child process")
	fs.StringVar(&c.out, "out", "", "directory for the tables (*.txt) and the plot (steps.png); empty writes none")
	fs.IntVar(&c.workers, "workers", 4, "handler goroutines, the same for both consumers")
	fs.DurationVar(&c.cost, "cost", 20*time.Millisecond, "handler cost per message, a sleep (I/O-like)")
	fs.DurationVar(&c.deadline, "deadline", 500*time.Millisecond, "each message's deadline after its publish time")
	steps := fs.String("steps", "0.5,1,2,5,10", "offered load steps, × measured capacity")
	fs.DurationVar(&c.stepDur, "step-duration", 8*time.Second, "how long each consumer is offered each step")
	fs.IntVar(&c.window, "window", 0, "sluice MaxInFlight; 0 means 2×workers")
	fs.DurationVar(&c.margin, "margin", 0, "sluice start-by margin: a message with less than this left before its deadline is dropped, not started; 0 means max(2×cost, deadline/5), negative disables")
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
	quick := fs.Bool("quick", false, "a ~20 s smoke run: steps 1,2,10 of 2 s, shorter capacity, drop and backpressure modes")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if *quick {
		set := map[string]bool{}
		fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
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
	case c.mode != "steps" && c.mode != "drop" && c.mode != "backpressure" && c.mode != "isolation" && c.mode != "all":
		return c, fmt.Errorf("unknown -mode %q", c.mode)
	case c.isoLoad <= 0 || c.isoRounds <= 0 || c.isoDur <= 0:
		return c, errors.New("-iso-load, -iso-rounds and -iso-duration must be > 0")
	case c.bpRate <= 0 || c.bpWorkers <= 0 || c.bpCost <= 0 || c.bpQueue <= 0 || c.dropQueue <= 0 || c.dropLoad <= 0 || c.dropHigh <= 0 || c.dropHigh >= 1:
		return c, errors.New("-bp-*, -drop-queue and -drop-load must be > 0, -drop-critical in (0, 1)")
	}
	if c.window == 0 {
		c.window = 2 * c.workers
	}
	if c.margin == 0 {
		c.margin = max(2*c.cost, c.deadline/5)
	}
	if c.margin < 0 {
		c.margin = 0
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
}

type stepResult struct {
	load             float64
	base, withSluice result
}

// runLab runs cfg.mode and prints the tables to w (and to cfg.out).
func runLab(ctx context.Context, cfg config, w io.Writer) (*report, error) {
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
	fmt.Fprintf(w, "overloadlab: broker %s, %d workers × %v sleep, deadline %v, sluice window %d, start-by margin %v\n",
		b.name(), cfg.workers, cfg.cost, cfg.deadline, cfg.window, cfg.margin)
	needCap := cfg.mode != "backpressure"
	if needCap && rep.capacity == 0 {
		c, err := measureCapacity(ctx, b, cfg)
		if err != nil {
			return nil, fmt.Errorf("measuring capacity: %w", err)
		}
		rep.capacity = c
		fmt.Fprintf(w, "measured capacity: %.0f msg/s (nominal %.0f)\n", c, float64(cfg.workers)/cfg.cost.Seconds())
	}
	emit := func(file, text string) error {
		fmt.Fprintln(w)
		fmt.Fprint(w, text)
		if cfg.out == "" {
			return nil
		}
		return os.WriteFile(filepath.Join(cfg.out, file), []byte(text), 0o644)
	}
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

func (c config) spec(name string, k kind, rate float64) trialSpec {
	return trialSpec{
		name: name, kind: k, rate: rate, duration: c.stepDur,
		workers: c.workers, cost: c.cost, deadline: c.deadline,
		window: c.window, margin: c.margin, observer: c.observer, payload: c.payload,
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
// raw consumer and returns its rate.
func measureCapacity(ctx context.Context, b broker, cfg config) (float64, error) {
	nominal := float64(cfg.workers) / cfg.cost.Seconds()
	s := cfg.spec("capacity", baseline, 0)
	s.deadline = 0
	s.duration = cfg.capDur
	s.drain = 0
	s.prefill = int(nominal*cfg.capDur.Seconds()*1.5) + 100
	r, err := runTrial(ctx, b, s)
	if err != nil {
		return 0, err
	}
	if r.handled == 0 {
		return 0, errors.New("no message was handled")
	}
	return float64(r.handled) / r.elapsed.Seconds(), nil
}

func runSteps(ctx context.Context, b broker, cfg config, rep *report) error {
	for i, load := range cfg.steps {
		rate := load * rep.capacity
		sr := stepResult{load: load}
		var err error
		if sr.base, err = runTrial(ctx, b, cfg.spec(fmt.Sprintf("s%d_base", i), baseline, rate)); err != nil {
			return err
		}
		if sr.withSluice, err = runTrial(ctx, b, cfg.spec(fmt.Sprintf("s%d_sluice", i), protected, rate)); err != nil {
			return err
		}
		rep.steps = append(rep.steps, sr)
		if err := ctx.Err(); err != nil {
			return err
		}
	}
	return nil
}
