package backpressure

import (
	"math"
	"os"
	"path/filepath"
	"runtime/metrics"
	"testing"
	"time"
)

func write(t *testing.T, file, text string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestResourceSources(t *testing.T) {
	dir := t.TempDir()
	// /proc/self/stat: the command may hold spaces and parentheses.
	stat := filepath.Join(dir, "stat")
	write(t, stat, "1234 (my (odd) cmd) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 100 0 0\n")
	if d, ok := readProcStat(stat); !ok || d != 3*time.Second {
		t.Errorf("proc stat: %v %v, want 3s (300 ticks)", d, ok)
	}
	cpuStat := filepath.Join(dir, "cpu.stat")
	write(t, cpuStat, "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n")
	if d, ok := readCgroupUsage(cpuStat); !ok || d != 1500*time.Millisecond {
		t.Errorf("cgroup usage: %v %v", d, ok)
	}
	for in, want := range map[string]float64{"150000 100000": 1.5, "max 100000": 0, "junk": 0} {
		if got, _ := parseCPUMax(in); got != want {
			t.Errorf("cpu.max %q: %v, want %v", in, got, want)
		}
	}
	// A process in the root cgroup: its cpu.stat counts the machine, so
	// none is used; in a container's own cgroup, cpu.stat and cpu.max are.
	root := filepath.Join(dir, "cgroup")
	write(t, filepath.Join(root, "cpu.stat"), "usage_usec 1\n")
	self := filepath.Join(dir, "self-cgroup")
	write(t, self, "0::/\n")
	if f, _ := findCgroup(self, root); f != "" {
		t.Errorf("root cgroup used: %s", f)
	}
	write(t, filepath.Join(root, "app", "cpu.max"), "150000 100000\n")
	write(t, filepath.Join(root, "app", "cpu.stat"), "usage_usec 7\n")
	write(t, self, "0::/app\n")
	if f, cores := findCgroup(self, root); f != filepath.Join(root, "app", "cpu.stat") || cores > 1.5 {
		t.Errorf("container cgroup: %s, %v cores", f, cores)
	}
}

func TestResourceUsageAndPressure(t *testing.T) {
	t0 := time.Unix(1000, 0)
	a := resourceRaw{at: t0, cpu: time.Second, gcCPU: 1, totalCPU: 10,
		sched: &metrics.Float64Histogram{Counts: []uint64{0, 0, 0}, Buckets: []float64{0, 0.001, 0.02, 0.1}}}
	b := resourceRaw{at: t0.Add(time.Second), cpu: 2600 * time.Millisecond, gcCPU: 1.4, totalCPU: 11.6,
		sched: &metrics.Float64Histogram{Counts: []uint64{90, 9, 1}, Buckets: []float64{0, 0.001, 0.02, 0.1}}}
	u := usageBetween(a, b, 2)
	if u.CPU != 0.8 || u.GC != 0.25 || u.SchedLatency != 20*time.Millisecond {
		t.Fatalf("usage %+v", u)
	}
	o := ResourceOptions{CPUTarget: 0.8, GCTarget: 0.5, SchedLatencyTarget: 40 * time.Millisecond, MemoryTarget: 0.9}
	if p := o.pressure(u); p != 1 {
		t.Errorf("at the CPU target: pressure %v", p)
	}
	u.Memory = 0.99
	if p := o.pressure(u); p < 1.0999 || p > 1.1001 {
		t.Errorf("heap at 99%% of GOMEMLIMIT: pressure %v", p)
	}
	if _, err := NewResourceMonitor(ResourceOptions{CPUTarget: 1.5}); err == nil {
		t.Error("a CPU target above 1 accepted")
	}
}

// On this machine the monitor reads the process's own CPU. The busy loop
// runs until the counter the monitor reads (cgroup usage or /proc ticks)
// has moved, not for a fixed wall time: on a machine busy with other work a
// 50 ms loop got too few clock ticks and the monitor read CPU 0 (a CI
// failure). The wall-clock bound only stops a machine without the counter.
func TestResourceMonitorReadsThisProcess(t *testing.T) {
	m, err := NewResourceMonitor(ResourceOptions{Interval: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc/self/stat: the CPU signal is off on this system")
	}
	t0 := time.Now()
	m.sample(t0) // the first sample: the baseline
	base := m.prev.cpu
	x := uint64(1)
	for end := t0.Add(30 * time.Second); m.read(time.Now()).cpu < base+3*time.Second/clockTicks && time.Now().Before(end); {
		for range 1 << 16 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
		}
	}
	m.next = time.Time{} // the next call samples, whatever the interval
	u, _ := m.sample(time.Now())
	if u.Source == "" || u.CPU <= 0 {
		t.Errorf("usage after a busy loop of three clock ticks: %+v (x %d)", u, x)
	}
	if u.Cores <= 0 {
		t.Errorf("cores %v", u.Cores)
	}
}

// A caller on a ticker of the monitor's Interval comes a little early about
// as often as late: each of its calls takes a fresh sample (before, one
// that came early read the previous interval's figures again, and a route's
// resource loop decided twice on every other sample), while a call well
// within the interval does not.
func TestResourceMonitorSamplesOnATickerOfItsInterval(t *testing.T) {
	m, err := NewResourceMonitor(ResourceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	m.sample(t0)
	m.sample(t0.Add(250 * time.Millisecond))
	at := m.prev.at
	m.sample(t0.Add(499 * time.Millisecond)) // a tick 1 ms early
	if !m.prev.at.After(at) {
		t.Error("a tick 1 ms before the interval's end read no new sample")
	}
	at = m.prev.at
	m.sample(t0.Add(600 * time.Millisecond))
	if !m.prev.at.Equal(at) {
		t.Error("a call 100 ms into the interval took a sample")
	}
}

// The scheduler-latency p99 is interpolated within its bucket: with the
// runtime's buckets a quarter of a power of two wide, the bucket's upper
// bound read a p99 in (8.4 ms, 10.5 ms] as 10.5 ms, over a 10 ms target,
// and the resource cap cut whenever one sample fell in that bucket.
func TestSchedLatencyQuantileInterpolates(t *testing.T) {
	buckets := []float64{0, 0.0083886080, 0.0104857600, math.Inf(1)}
	a := &metrics.Float64Histogram{Counts: []uint64{0, 0, 0}, Buckets: buckets}
	b := &metrics.Float64Histogram{Counts: []uint64{98, 2, 0}, Buckets: buckets}
	got := histQuantile(a, b, 0.99)
	if got < 9400*time.Microsecond || got > 9500*time.Microsecond {
		t.Errorf("p99 %v, want about 9.44 ms (half way through the bucket)", got)
	}
	// Past the last finite bound: its lower bound.
	b.Counts = []uint64{0, 0, 10}
	if got := histQuantile(a, b, 0.99); got != time.Duration(0.0104857600*float64(time.Second)) {
		t.Errorf("p99 in the open bucket %v, want its lower bound", got)
	}
}
