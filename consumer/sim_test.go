package consumer_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
)

// TestSimulation runs whole Consumers in a deterministic simulation, one per
// seed: the seed draws 1–4 routes with every feature (ordering, windows by
// count, bytes and cost, queue policies, predictive expiry, retries and
// their budget, MaxDeliver, dead-letter policies, keep-alive, a resource
// cap, adaptive limits, a shared Budget), their traffic, the handlers'
// behaviour, the Source's, the broker's and the dead-letter store's faults,
// and the moment of shutdown; it runs in a testing/synctest bubble (virtual
// time) and the checker (sim_check_test.go) asserts the settlement contract
// of the package documentation.
//
//	go test ./consumer -run TestSimulation -v                      # the CI budget: seeds 1..2000
//	SLUICE_SIM_SEEDS=100000 go test ./consumer -run TestSimulation -timeout 2h
//	SLUICE_SIM_START=5000 SLUICE_SIM_SEEDS=1000 ...                # seeds 5000..5999
//	SLUICE_SIM_SEED=1234 go test ./consumer -run TestSimulation -v # replay one seed, with its configuration
//	SLUICE_SIM_SEED=1234 SLUICE_SIM_LIMITS='routes=0001,msgs=3,faults=0x40' ... # replay it shrunk
//
// A failing seed prints the command that replays it and a shrunk
// configuration: the fewest routes, messages and fault kinds that still fail.
// A crash of the test binary (a panic in consumer code inside a seed's
// bubble cannot be recovered) prints "sim: the test binary crashed while
// running seed(s) …" after the panic (sim_crash_test.go).
func TestSimulation(t *testing.T) {
	if s := os.Getenv("SLUICE_SIM_SEED"); s != "" {
		seed, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		lim := fullLimits
		if l := os.Getenv("SLUICE_SIM_LIMITS"); l != "" {
			if lim, err = parseLimits(l); err != nil {
				t.Fatalf("SLUICE_SIM_LIMITS: %v", err)
			}
		}
		cfg := genConfig(seed, lim)
		t.Logf("seed %d (%v):\n%v", seed, lim, cfg)
		simTrace = func(s string) { t.Log(s) }
		defer func() { simTrace = nil }()
		if vs := simulate(t, seed, lim); len(vs) > 0 {
			for _, v := range vs {
				t.Errorf("%s: %s (known bug: %q)", v.invariant, v.detail, v.known)
			}
			if os.Getenv("SLUICE_SIM_SHRINK") != "" {
				simTrace = nil
				l := shrink(t, seed, vs[0].invariant)
				t.Logf("shrunk: SLUICE_SIM_SEED=%d SLUICE_SIM_LIMITS='%v' go test ./consumer -run TestSimulation -v\n%v", seed, l, genConfig(seed, l))
			}
		}
		return
	}
	seeds := envInt("SLUICE_SIM_SEEDS", simDefaultSeeds)
	first := envInt("SLUICE_SIM_START", 1)
	survey := os.Getenv("SLUICE_SIM_SURVEY") != ""
	strict := os.Getenv("SLUICE_SIM_STRICT") != ""
	progress := os.Getenv("SLUICE_SIM_PROGRESS") != ""
	known := map[string]simFailure{}
	knownSeeds := map[string]int{}
	begin := time.Now()
	var next, failed atomic.Int64
	var mu sync.Mutex
	var failures []simFailure
	crash := newSimCrashWatch(t) // names the seeds a crash interrupts
	defer crash.close()
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(seeds) || failed.Load() >= 3 && !survey {
					return
				}
				seed := uint64(first) + uint64(i) - 1
				if progress {
					fmt.Fprintf(os.Stderr, "seed %d\n", seed)
				}
				crash.begin(seed)
				vs := simulate(t, seed, fullLimits)
				crash.end(seed)
				if len(vs) == 0 {
					continue
				}
				mu.Lock()
				if bug := knownOnly(vs); bug != "" && !strict {
					if _, ok := known[bug]; !ok {
						known[bug] = simFailure{seed: seed, count: int(i), vs: vs}
					}
					knownSeeds[bug]++
				} else {
					failed.Add(1)
					failures = append(failures, simFailure{seed: seed, count: int(i), vs: vs})
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	ran := min(int(next.Load()), seeds)
	t.Logf("%d seeds (%d..%d) in %v, %d failed; the short-queue rule settled stale messages in %d", ran, first, first+ran-1, time.Since(begin).Round(time.Millisecond), len(failures), simStaleSeeds.Load())
	for bug, f := range known {
		t.Logf("known bug %s (%s): %d seeds, first the %d-th (seed %d): %s: %s\n  replay: SLUICE_SIM_SEED=%d SLUICE_SIM_STRICT=1 go test ./consumer -run TestSimulation -v",
			bug, knownBugs[bug], knownSeeds[bug], f.count, f.seed, f.vs[0].invariant, f.vs[0].detail, f.seed)
	}
	slices.SortFunc(failures, func(a, b simFailure) int { return a.count - b.count })
	if survey {
		for _, f := range failures {
			t.Errorf("seed %d: %s: %s", f.seed, f.vs[0].invariant, f.vs[0].detail)
		}
		return
	}
	for _, f := range failures {
		report(t, f)
	}
}

// knownOnly returns the known bug every violation in vs shows, or "".
func knownOnly(vs []violation) string {
	bug := vs[0].known
	for _, v := range vs {
		if v.known == "" {
			return ""
		}
	}
	return bug
}

// simTrace, when set (a replayed seed), receives the run's deliveries.
var simTrace func(string)

type simFailure struct {
	seed  uint64
	count int // how many seeds ran up to it (its position in the run)
	vs    []violation
}

func report(t *testing.T, f simFailure) {
	lim := shrink(t, f.seed, f.vs[0].invariant)
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d (the %d-th seed run) breaks %q:\n", f.seed, f.count, f.vs[0].invariant)
	for _, v := range f.vs {
		fmt.Fprintf(&b, "  %s: %s\n", v.invariant, v.detail)
	}
	fmt.Fprintf(&b, "replay: SLUICE_SIM_SEED=%d go test ./consumer -run TestSimulation -v\n", f.seed)
	fmt.Fprintf(&b, "shrunk: SLUICE_SIM_SEED=%d SLUICE_SIM_LIMITS='%v' go test ./consumer -run TestSimulation -v\n%v",
		f.seed, lim, genConfig(f.seed, lim))
	t.Error(b.String())
}

// shrink returns the smallest limits found under which seed still breaks
// invariant: fewer routes, then fewer messages, then fewer fault kinds.
// Runs are deterministic in what they draw, not in how goroutines
// interleave, so a candidate counts as failing if one of two runs fails.
func shrink(t *testing.T, seed uint64, invariant string) simLimits {
	fails := func(l simLimits) bool {
		for range 2 {
			for _, v := range simulate(t, seed, l) {
				if v.invariant == invariant {
					return true
				}
			}
		}
		return false
	}
	lim := fullLimits
	full := genConfig(seed, lim)
	lim.routes = 0
	for _, r := range full.Routes {
		lim.routes |= 1 << r.Index
	}
	lim.faults = full.Faults
	for _, r := range full.Routes {
		if l := lim; l.routes&^(1<<r.Index) != 0 {
			l.routes &^= 1 << r.Index
			if fails(l) {
				lim = l
			}
		}
	}
	most := 0
	for _, r := range genConfig(seed, lim).Routes {
		most = max(most, len(r.Msgs))
	}
	lim.msgs = most
	for improved := true; improved && lim.msgs > 1; {
		improved = false
		for _, n := range []int{1, 2, lim.msgs / 8, lim.msgs / 4, lim.msgs / 2, lim.msgs * 3 / 4, lim.msgs - 1} {
			if n < 1 || n >= lim.msgs {
				continue
			}
			l := lim
			l.msgs = n
			if fails(l) {
				lim, improved = l, true
				break
			}
		}
	}
	// Then single messages, in chunks (delta debugging), within a budget
	// of runs.
	budget := 200
	for _, r := range genConfig(seed, lim).Routes {
		var ids, gone []int
		for _, m := range r.Msgs {
			ids = append(ids, m.ID)
		}
		for chunk := len(ids) / 2; chunk >= 1 && budget > 0; chunk /= 2 {
			for start := 0; start < len(ids) && budget > 0; {
				end := min(start+chunk, len(ids))
				try := slices.Concat(gone, ids[start:end])
				slices.Sort(try)
				l := lim
				l.drop[r.Index] = idList(try)
				budget--
				if fails(l) {
					lim, gone = l, try
					ids = slices.Delete(ids, start, end)
					continue
				}
				start = end
			}
		}
	}
	for i := range nFaultKinds {
		if lim.faults&(1<<i) == 0 {
			continue
		}
		l := lim
		l.faults &^= 1 << i
		if fails(l) {
			lim = l
		}
	}
	return lim
}

func envInt(name string, def int) int {
	if s := os.Getenv(name); s != "" {
		if n, err := strconv.Atoi(s); err == nil {
			return n
		}
	}
	return def
}

// simulate runs seed under lim in its own bubble and returns what the
// checker found.
func simulate(t *testing.T, seed uint64, lim simLimits) (vs []violation) {
	cfg := genConfig(seed, lim)
	if len(cfg.Routes) == 0 {
		return nil
	}
	synctest.Test(t, func(t *testing.T) {
		w := newWorld(cfg)
		w.run()
		w.mu.Lock()
		w.classify()
		vs = w.violations
		w.mu.Unlock()
		if simTrace != nil {
			simTrace(w.dump())
		}
	})
	return vs
}

// routes builds the Consumer's options and routes from the configuration.
func (w *simWorld) build() (consumer.Options, []consumer.Route) {
	cfg := w.cfg
	opts := consumer.Options{ShutdownGrace: cfg.Grace}
	if cfg.Hook {
		opts.Hook = simHook{w}
	}
	if cfg.Resource {
		opts.Resource = simResource{w}
	}
	if cfg.Budget > 0 {
		b, err := backpressure.NewBudget(cfg.Budget)
		if err != nil {
			panic(err)
		}
		opts.Budget, w.budget = b, b
	}
	newBudget := func() *backpressure.RetryBudget {
		b, err := backpressure.NewRetryBudget(backpressure.RetryBudgetOptions{MinRetries: 2, Window: time.Second})
		if err != nil {
			panic(err)
		}
		return b
	}
	shared := newBudget()
	var routes []consumer.Route
	for _, b := range w.routes {
		r := b.r
		rt := consumer.Route{Name: "r" + itoa(r.Index), Source: b, Handler: w.handler, Workers: r.Workers, Ordering: r.Ordering,
			Window:    consumer.WindowPolicy{Messages: r.WinMsgs, Bytes: r.WinBytes},
			Retry:     consumer.RetryPolicy{MaxAttempts: r.MaxAttempts, BaseDelay: r.BaseDelay, MaxDelay: r.MaxDelay},
			KeepAlive: r.KeepAlive,
		}
		if r.Batch {
			rt.Handler, rt.BatchHandler = nil, w.batchHandler
			rt.Batch = consumer.BatchPolicy{MaxMessages: r.BatchMax, MaxBytes: r.BatchBytes, Linger: r.BatchLinger}
		}
		if r.Cost {
			rt.Window.Cost = consumer.CostPolicy{Header: consumer.CostHeader, MaxRunning: r.CostMaxRunning}
		}
		if r.NoExpiry {
			rt.Expiry = expiry.Policy{IgnoreHeader: true}
		}
		if r.Sink {
			rt.DeadLetter.Sink = simSink{w}
		}
		rt.DeadLetter.OnExpired, rt.DeadLetter.OnOversize, rt.DeadLetter.OnOverloaded = r.OnExpired, r.OnOversize, r.OnOverloaded
		o := &rt.Overload
		o.Criticality = backpressure.Criticality(r.Crit)
		o.ReservedBytes = r.Reserved
		o.ShedNearDeadline, o.OnShed, o.ShedDelay = r.ShedNear, r.OnShed, r.ShedDelay
		o.Queue = consumer.QueuePolicy{Order: r.QueueOrder, MaxLength: r.MaxLength, MaxCost: r.MaxCost, DropWhenFull: r.Drop, Target: r.QueueTarget}
		switch r.RetryBudget {
		case 1:
			o.RetryBudget = shared
		case 2:
			o.RetryBudget = newBudget()
		}
		if r.Adaptive {
			a, err := backpressure.NewAdaptiveLimit(backpressure.AdaptiveLimitOptions{Min: 1, Max: 16, Interval: 50 * time.Millisecond, MinSamples: 3})
			if err != nil {
				panic(err)
			}
			o.AdaptiveLimit = a
		}
		routes = append(routes, rt)
	}
	return opts, routes
}

// run is one seed's run, inside its bubble.
func (w *simWorld) run() {
	cfg := w.cfg
	opts, routes := w.build()
	c, err := consumer.New(opts, routes...)
	if err != nil {
		w.failf("New accepts the simulation's configuration", "%v", err)
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	var ranUntil time.Time // when Run returned
	go func() {
		err := c.Run(ctx)
		ranUntil = time.Now()
		done <- err
	}()

	// Run until the stop time, checking the ledger at quiet moments.
	stopAt := w.start.Add(cfg.StopAt)
	step := 3*time.Millisecond + time.Duration(cfg.Seed%13)*time.Millisecond
	var prev []consumer.RouteStats
	var runErr error
	returned := false
	for !returned && time.Now().Before(stopAt) {
		time.Sleep(min(step, time.Until(stopAt)))
		synctest.Wait()
		select {
		case runErr = <-done:
			returned = true // every Source closed
		default:
		}
		prev = w.checkStats(c, prev, false)
	}
	// Shutdown: Run's ctx ends, or began when the last Source closed.
	begin := time.Now()
	w.mu.Lock()
	var lastClose time.Time
	for _, b := range w.routes {
		if !b.closed {
			lastClose = time.Time{}
			break
		}
		if b.closeAt.After(lastClose) {
			lastClose = b.closeAt
		}
	}
	if !lastClose.IsZero() && lastClose.Before(begin) {
		begin = lastClose
	}
	w.stopAt = begin
	w.mu.Unlock()
	if !returned {
		cancel()
	}
	ok, stuckAtLimit := true, -1
	if !returned {
		limit := time.NewTimer(time.Until(begin.Add(cfg.Grace + consumer.ShutdownSlack + time.Millisecond)))
		select {
		case runErr = <-done:
		case <-limit.C:
			// Too late already: heal every fault and see whether it returns at all.
			w.mu.Lock()
			stuckAtLimit = w.ignoring
			w.hungExpiredLetters = w.hungExpired
			w.mu.Unlock()
			w.healAll()
			select {
			case runErr = <-done:
			case <-time.After(time.Hour):
				ok = false
			}
		}
	}
	took := time.Since(begin)
	if ok {
		took = ranUntil.Sub(begin)
	}
	w.mu.Lock()
	w.returnedAt = time.Now()
	stuck := w.ignoring
	if stuckAtLimit >= 0 {
		stuck = stuckAtLimit
	}
	w.mu.Unlock()
	w.checkRun(runErr, took, ok, stuck)
	w.healAll()
	if !ok {
		// Run is stuck for good: wait for nothing more, the bubble reports
		// the goroutines left behind.
		return
	}
	time.Sleep(time.Hour)
	synctest.Wait()
	w.noGoroutineOutlivesRun()
	w.checkStats(c, prev, true)
	w.checkDeliveries(runErr)
	w.checkOutcomeCounts(c)
}

func (w *simWorld) healAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.healed {
		w.healed = true
		close(w.heal)
	}
}

// checkOutcomeCounts: RouteStats.Settled counts the outcomes the Hook saw.
func (w *simWorld) checkOutcomeCounts(c *consumer.Consumer) {
	if !w.cfg.Hook {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, s := range c.Stats() {
		var seen [16]uint64
		for _, d := range w.all {
			if "r"+itoa(d.lg.route) == s.Name && d.settled != nil {
				seen[d.settled.e.Outcome]++
			}
		}
		for o, n := range s.Settled {
			if seen[o] != n {
				w.failf(invOneOutcome, "route %s: %d %v counted, %d seen", s.Name, n, consumer.Outcome(o), seen[o])
			}
		}
	}
}

// dump describes every delivery of the run, for a replayed seed.
func (w *simWorld) dump() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	var b strings.Builder
	at := func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.Sub(w.start).String()
	}
	fmt.Fprintf(&b, "stop at %s, Run returned at %s\n", at(w.stopAt), at(w.returnedAt))
	for _, d := range w.all {
		fmt.Fprintf(&b, "  %s fetched %s (seq %d) attempt %d last=%v deadline=%s", d.id, at(d.fetched), d.fetchSeq, d.attempt, d.last, at(d.deadline))
		for _, r := range d.runs {
			fmt.Fprintf(&b, " | run %s..%s #%d %s %v", at(r.start), at(r.end), r.attempt, r.action, r.err)
		}
		for _, s := range d.settles {
			fmt.Fprintf(&b, " | settle %s %v/%v %v", at(s.at), s.s.Op, s.s.Delay, s.err)
		}
		if d.letterTries > 0 {
			fmt.Fprintf(&b, " | letters %d ok=%v %s", d.letterTries, d.lettered != 0, d.letterClass)
		}
		for _, e := range d.events {
			if e.e.Kind == consumer.EventSettled {
				fmt.Fprintf(&b, " | settled %s %v", at(e.at), e.e.Outcome)
			} else {
				fmt.Fprintf(&b, " | %v %s", e.e.Kind, at(e.at))
			}
		}
		if len(d.keepAlives) > 0 {
			fmt.Fprintf(&b, " | %d keep-alives, last %s", len(d.keepAlives), at(d.keepAlives[len(d.keepAlives)-1]))
		}
		b.WriteString("\n")
	}
	return b.String()
}
