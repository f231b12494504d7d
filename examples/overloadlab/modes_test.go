package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// runsEvery makes one run every gap from from to until, each of cost (ok,
// on time), degraded before degradedUntil.
func runsEvery(from, until time.Time, gap, cost time.Duration, degradedUntil time.Time) []runRec {
	var out []runRec
	for t := from; t.Before(until); t = t.Add(gap) {
		out = append(out, runRec{pub: t, start: t, end: t.Add(cost), cost: cost, ok: true, onTime: true, degraded: t.Before(degradedUntil)})
	}
	return out
}

func TestDegradeRow(t *testing.T) {
	cfg, err := parseFlags([]string{"-mode", "degrade", "-degrade-high-duration", "4s", "-degrade-low-duration", "3s"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	drop := t0.Add(4 * time.Second)
	// 600 runs/s during the burst, all degraded; 100/s after, degraded for
	// the first 700 ms.
	runs := runsEvery(t0, drop, time.Second/600, 4*time.Millisecond, drop)
	runs = append(runs, runsEvery(drop, drop.Add(3*time.Second), 10*time.Millisecond, 20*time.Millisecond, drop.Add(700*time.Millisecond))...)
	r := result{spec: trialSpec{kind: sluiceMinimal}, start: t0, runs: runs}
	row := degradeRowOf(r, 200, cfg)
	if math.Abs(row.highGood-600) > 2 || math.Abs(row.highGood/row.capacity-3) > 0.01 {
		t.Errorf("burst goodput %.1f/s (%.2f× of 200)", row.highGood, row.highGood/row.capacity)
	}
	if row.highShare != 1 {
		t.Errorf("burst degraded share %v", row.highShare)
	}
	if row.recovery < 680*time.Millisecond || row.recovery > 700*time.Millisecond {
		t.Errorf("recovery %v, want the last degraded start ~690 ms after the drop", row.recovery)
	}
	if math.Abs(row.lowGood-100) > 2 {
		t.Errorf("after-burst goodput %.1f/s", row.lowGood)
	}
}

func TestCostRow(t *testing.T) {
	p := costConfig{cheap: time.Millisecond, dear: 100 * time.Millisecond, cheapShare: 0.9}
	t0 := time.Unix(1000, 0)
	var runs []runRec
	// Over 2 s: cheap runs every 10 ms taking 5 ms from publish, dear runs
	// every 100 ms taking 300 ms.
	for i := range 200 {
		pub := t0.Add(time.Duration(i) * 10 * time.Millisecond)
		runs = append(runs, runRec{pub: pub, start: pub.Add(4 * time.Millisecond), end: pub.Add(5 * time.Millisecond), cost: p.cheap, ok: true, onTime: true})
	}
	for i := range 20 {
		pub := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		runs = append(runs, runRec{pub: pub, start: pub.Add(200 * time.Millisecond), end: pub.Add(300 * time.Millisecond), cost: p.dear, ok: true, onTime: true})
	}
	r := result{spec: trialSpec{kind: sluiceTuned, duration: 3 * time.Second, workers: 4}, start: t0, runs: runs}
	row := costRowOf(r, p, mixCapacity{units: 2})
	if row.cheapP99 != 5*time.Millisecond || row.dearP99 != 300*time.Millisecond {
		t.Errorf("cheap p99 %v, dear p99 %v", row.cheapP99, row.dearP99)
	}
	// 200×1 ms + 20×100 ms = 2.2 handler-s in a 3 s window.
	if math.Abs(row.units-2.2/3) > 1e-9 || row.cheapGood != 200 || row.dearGood != 20 {
		t.Errorf("units %.3f, cheap %d, dear %d", row.units, row.cheapGood, row.dearGood)
	}
	// Every run succeeded on time: 2.2 s of 4 workers × 3 s in runs, the
	// cheap ones 1 ms each, the dear 100 ms.
	if math.Abs(row.busy-2.2/12) > 1e-9 || row.onTimeBusy != row.busy || row.cheapRun != time.Millisecond || row.dearRun != 100*time.Millisecond {
		t.Errorf("busy %.3f, on time %.3f, runs %v / %v", row.busy, row.onTimeBusy, row.cheapRun, row.dearRun)
	}
}

func TestCPUShare(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var s []cpuSample
	// 2 cores: 1 core busy for 2 s, then both for 1 s.
	for i := range 31 {
		at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		cpu := time.Duration(i) * 100 * time.Millisecond
		if i > 20 {
			cpu = 2*time.Second + time.Duration(i-20)*200*time.Millisecond
		}
		s = append(s, cpuSample{at: at, cpu: cpu})
	}
	mean, peak := cpuShare(s, window{from: t0, until: t0.Add(4 * time.Second)}, 2)
	if math.Abs(mean-4.0/6) > 1e-9 || math.Abs(peak-1) > 1e-9 {
		t.Errorf("mean %.3f (want %.3f), peak %.3f (want 1)", mean, 4.0/6, peak)
	}
}

func TestGridTargetAndTable(t *testing.T) {
	mk := func(k kind, good, offered float64, p99 time.Duration, wasted int) result {
		return result{spec: trialSpec{kind: k}, goodput: good, offeredRate: offered, p99: p99, wasted: wasted}
	}
	over := gridCell{workers: 4, cost: 20 * time.Millisecond, deadline: 500 * time.Millisecond, capacity: 200, load: 5}
	over.res = []result{mk(unprotected, 10, 1000, 3*time.Second, 900), mk(sluiceMinimal, 195, 1000, 420*time.Millisecond, 0)}
	if over.meets(over.res[0]) || !over.meets(over.res[1]) {
		t.Error("5×: want unprotected to miss, minimal to meet")
	}
	if m := mk(sluiceMinimal, 195, 1000, 501*time.Millisecond, 0); over.meets(m) {
		t.Error("p99 over the deadline met the target")
	}
	if m := mk(sluiceMinimal, 195, 1000, 400*time.Millisecond, 1); over.meets(m) {
		t.Error("a wasted run met the target")
	}
	under := gridCell{workers: 4, cost: 20 * time.Millisecond, deadline: 500 * time.Millisecond, capacity: 200, load: 0.5}
	if !under.meets(mk(sluiceMinimal, 98, 100, 22*time.Millisecond, 0)) || under.meets(mk(sluiceMinimal, 90, 100, 22*time.Millisecond, 0)) {
		t.Error("0.5×: goodput against the offered load")
	}
	var cfg config
	if name := cfg.gridSpec(under, sluiceMinimal).name; strings.ContainsAny(name, ". ") {
		t.Errorf("trial name %q is not a valid JetStream stream name", name)
	}
	tbl := gridTable([]gridCell{over}, "nats")
	for _, want := range []string{"| 4×20ms ", "5% · 3000 ms", "98% · 420 ms", "900/0", "met", "meets the target in 1 of 1 cells", "| 5×   | 5% / 5%, 0 of 1, 900"} {
		if !strings.Contains(tbl, want) {
			t.Errorf("grid table lacks %q:\n%s", want, tbl)
		}
	}
}

// A grid written to CSV reads back as the same table, so a run split in
// parts (-grid-csv) renders as one.
func TestGridCSVRoundTrip(t *testing.T) {
	mk := func(k kind, good float64, p99 time.Duration, wasted int, failed string) result {
		return result{spec: trialSpec{kind: k}, goodput: good, offeredRate: 1000, p50: p99 / 2, p99: p99, wasted: wasted, failed: failed}
	}
	cells := []gridCell{
		{workers: 4, cost: 20 * time.Millisecond, deadline: 500 * time.Millisecond, capacity: 200, load: 5,
			res: []result{mk(unprotected, 10, 3*time.Second, 900, ""), mk(sluiceMinimal, 195, 420*time.Millisecond, 0, "")}},
		{workers: 4, cost: 20 * time.Millisecond, deadline: 500 * time.Millisecond, capacity: 200, load: 0.5,
			res: []result{mk(unprotected, 100, 21*time.Millisecond, 0, ""), mk(sluiceMinimal, 0, 0, 0, "broker gone")}},
	}
	file := filepath.Join(t.TempDir(), "grid.csv")
	if err := writeGridCSV(cells, "nats", file); err != nil {
		t.Fatal(err)
	}
	back, broker, err := readGridCSV(file)
	if err != nil {
		t.Fatal(err)
	}
	if want, got := gridTable(cells, "nats"), gridTable(back, broker); want != got {
		t.Fatalf("round trip changed the table:\n%s\n%s", want, got)
	}
	if !strings.Contains(gridTable(back, broker), "failed") {
		t.Error("a failed trial is not shown")
	}
}

// The degrade, cpu and cost plots render from their rows, and the
// timelines they draw count what the runs say.
func TestModePlots(t *testing.T) {
	cfg, err := parseFlags([]string{"-mode", "degrade", "-degrade-high-duration", "4s", "-degrade-low-duration", "3s", "-cpu-duration", "2s"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1000, 0)
	drop := t0.Add(4 * time.Second)
	runs := runsEvery(t0, drop, time.Second/600, 4*time.Millisecond, drop)
	runs = append(runs, runsEvery(drop, drop.Add(3*time.Second), 10*time.Millisecond, 20*time.Millisecond, drop)...)
	r := result{spec: trialSpec{kind: sluiceMinimal}, start: t0, runs: runs}
	tl := timelineOf(r, 7*time.Second)
	if len(tl) != 28 {
		t.Fatalf("%d bins, want 28", len(tl))
	}
	if b := tl[4]; math.Abs(b.good-600) > 8 || b.degraded != 1 {
		t.Errorf("burst bin: %+v", b)
	}
	if b := tl[20]; math.Abs(b.good-100) > 8 || b.degraded != 0 {
		t.Errorf("after-burst bin: %+v", b)
	}
	dir := t.TempDir()
	if d := os.Getenv("OVERLOADLAB_PLOTS"); d != "" {
		dir = d // to look at them
	}
	row := degradeRowOf(r, 200, cfg)
	row.burst, row.timeline = 4*time.Second, tl
	if err := plotDegrade([]degradeRow{row}, cfg, filepath.Join(dir, "degrade.png")); err != nil {
		t.Fatal(err)
	}

	// CPU: one core of two busy throughout, 100 on-time runs a second.
	var samples []cpuSample
	for i := range 21 {
		at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		samples = append(samples, cpuSample{at: at, cpu: time.Duration(i) * 100 * time.Millisecond})
	}
	cr := result{spec: trialSpec{kind: sluiceMinimal}, start: t0, runs: runsEvery(t0, t0.Add(2*time.Second), 10*time.Millisecond, time.Millisecond, t0)}
	use, good := cpuTimeline(cr, samples, 2, 2*time.Second)
	if len(use) == 0 || len(good) != 4 {
		t.Fatalf("%d CPU points, %d goodput points", len(use), len(good))
	}
	for _, xy := range use {
		if math.Abs(xy.Y-0.5) > 1e-9 {
			t.Errorf("CPU share %.3f at %.1f s, want 0.5", xy.Y, xy.X)
		}
	}
	if math.Abs(good[1].Y-100) > 2 {
		t.Errorf("goodput %.1f/s, want 100", good[1].Y)
	}
	rows := []cpuRow{{kind: sluiceMinimal, label: "sluice minimal", capacity: 300, cpuLine: use, goodLine: good},
		{kind: sluiceMinimal, label: "sluice minimal + resource signal", capacity: 300, cpuLine: use, goodLine: good}}
	if err := plotCPU(rows, cfg, filepath.Join(dir, "cpu.png")); err != nil {
		t.Fatal(err)
	}
	costRows := []costRow{{short: "by count", units: 3.6, capUnits: 4, cheapP99: 600 * time.Millisecond},
		{short: "by cost", units: 3.9, capUnits: 4, cheapP99: 12 * time.Millisecond}}
	if err := plotCost(costRows, filepath.Join(dir, "cost.png")); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"degrade.png", "cpu.png", "cost.png"} {
		if st, err := os.Stat(filepath.Join(dir, f)); err != nil || st.Size() == 0 {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// The loadstep mode's figures: per phase the goodput, the median sojourn
// (publish to start) and the p99 of successes; per 250 ms bin the same
// over the trial; and the default consumers are issue 26's three.
func TestLoadstepRow(t *testing.T) {
	cfg, err := parseFlags([]string{"-mode", "loadstep", "-ls-before", "2s", "-ls-during", "3s", "-ls-after", "2s", "-deadline", "500ms"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.kinds) != 3 || cfg.kinds[0] != unprotected || cfg.kinds[1] != boundedQueue || cfg.kinds[2] != sluiceMinimal {
		t.Fatalf("default consumers %v", cfg.kinds)
	}
	t0 := time.Unix(1000, 0)
	step, after := t0.Add(2*time.Second), t0.Add(5*time.Second)
	// 100 runs/s throughout: 10 ms from publish to start before and after
	// the step, 100 ms in it; each run takes 20 ms.
	var runs []runRec
	for at := t0; at.Before(t0.Add(7 * time.Second)); at = at.Add(10 * time.Millisecond) {
		wait := 10 * time.Millisecond
		if !at.Before(step) && at.Before(after) {
			wait = 100 * time.Millisecond
		}
		runs = append(runs, runRec{pub: at, start: at.Add(wait), end: at.Add(wait + 20*time.Millisecond), ok: true, onTime: true})
	}
	row := loadstepRowOf(result{spec: trialSpec{kind: sluiceMinimal}, start: t0, runs: runs}, cfg)
	if p := row.phases[1]; p.sojourn != 100*time.Millisecond || p.p99 != 120*time.Millisecond || math.Abs(p.goodput-100) > 2 {
		t.Errorf("step: sojourn %v, p99 %v, goodput %.1f/s", p.sojourn, p.p99, p.goodput)
	}
	if p := row.phases[2]; p.sojourn != 10*time.Millisecond || p.p99 != 30*time.Millisecond {
		t.Errorf("after: sojourn %v, p99 %v", p.sojourn, p.p99)
	}
	if n := len(row.timeline); n != 28 {
		t.Fatalf("%d bins over 7 s, want 28", n)
	}
	if b := row.timeline[12]; b.sojourn != 100*time.Millisecond {
		t.Errorf("bin 12 (3.0–3.25 s, in the step): sojourn %v", b.sojourn)
	}
	if b := row.timeline[2]; b.sojourn != 10*time.Millisecond || b.p99 != 30*time.Millisecond {
		t.Errorf("bin 2 (before the step): sojourn %v, p99 %v", b.sojourn, b.p99)
	}
}
