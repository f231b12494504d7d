package backpressure

import (
	"bufio"
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"strconv"
	"strings"
	"sync"
	"time"
)

// ResourceOptions configure a ResourceMonitor. The zero value is usable.
type ResourceOptions struct {
	// CPUTarget is the CPU use the process should stay at or under, as a
	// share of the cores available to it. 0 means 0.8.
	CPUTarget float64
	// GCTarget is the share of the process's CPU the garbage collector may
	// take before the process counts as pressed. 0 means 0.25.
	GCTarget float64
	// SchedLatencyTarget is the 99th percentile of the Go scheduler's
	// latency (time a runnable goroutine waits for a thread) above which
	// the process counts as pressed. 0 means 10 ms; negative turns the
	// scheduler signal off.
	SchedLatencyTarget time.Duration
	// MemoryTarget is the share of GOMEMLIMIT the Go heap may use before
	// the process counts as pressed; ignored without a limit. 0 means 0.9.
	MemoryTarget float64
	// Interval is the least time between two samples. 0 means 250 ms.
	Interval time.Duration
}

// ResourceUsage is what the process used over one interval.
type ResourceUsage struct {
	// CPU is the process's (or its cgroup's) CPU time over the interval
	// as a share of the cores available (1 = all of them).
	CPU float64
	// Cores is the CPU available: the cgroup's cpu.max quota where there
	// is one, else GOMAXPROCS.
	Cores float64
	// GC is the share of the Go runtime's CPU time spent in the garbage
	// collector over the interval.
	GC float64
	// SchedLatency is the 99th percentile of scheduler latency over the
	// interval.
	SchedLatency time.Duration
	// Memory is the Go runtime's memory against GOMEMLIMIT (0 without one).
	Memory float64
	// Source says where CPU came from: "cgroup", "proc" or "" (unknown).
	Source string
}

// ResourceMonitor samples the process's own resource use: CPU from the
// cgroup v2 cpu.stat of the process's cgroup when it has one of its own (a
// container; the root cgroup counts the whole machine and is not used),
// else from /proc/self/stat (on systems without /proc the CPU signal is
// 0); the garbage collector's share of CPU, the scheduler's latency and
// the heap against GOMEMLIMIT from runtime/metrics. Pressure reports the
// worst of them against its target, so 1 means "at the target". CPU reacts
// before latency does when a CPU-bound handler competes with the broker
// client and the GC for the same cores. Safe for concurrent use; sampling
// is lazy (at most once per Interval, on the caller's goroutine).
type ResourceMonitor struct {
	o ResourceOptions

	mu       sync.Mutex
	next     time.Time
	prev     resourceRaw
	have     bool
	usage    ResourceUsage
	pressure float64
	samples  []metrics.Sample
	cpuStat  string // the cgroup cpu.stat file, "" when the process has none of its own
	procStat string // /proc/self/stat
	cores    float64
}

// ResourceSignal is a process's resource pressure: its use against its
// target, 1 meaning at the target. ResourceMonitor is one; the consumer
// takes any (consumer.Options.Resource), so a test can supply its own.
type ResourceSignal interface {
	Pressure() float64
}

type resourceRaw struct {
	at       time.Time
	cpu      time.Duration // process or cgroup CPU time
	gcCPU    float64       // runtime's GC CPU seconds
	totalCPU float64       // runtime's total CPU seconds
	sched    *metrics.Float64Histogram
}

// NewResourceMonitor validates o and finds the process's cgroup.
func NewResourceMonitor(o ResourceOptions) (*ResourceMonitor, error) {
	if o.CPUTarget == 0 {
		o.CPUTarget = 0.8
	}
	if o.GCTarget == 0 {
		o.GCTarget = 0.25
	}
	if o.SchedLatencyTarget == 0 {
		o.SchedLatencyTarget = 10 * time.Millisecond
	}
	if o.MemoryTarget == 0 {
		o.MemoryTarget = 0.9
	}
	if o.Interval == 0 {
		o.Interval = 250 * time.Millisecond
	}
	for _, f := range []float64{o.CPUTarget, o.GCTarget, o.MemoryTarget} {
		if !(f > 0 && f <= 1) {
			return nil, fmt.Errorf("%w: resource targets must be in (0, 1]", ErrInvalidOption)
		}
	}
	if o.Interval < 0 {
		return nil, fmt.Errorf("%w: resource monitor: negative duration", ErrInvalidOption)
	}
	m := &ResourceMonitor{o: o, samples: []metrics.Sample{
		{Name: "/cpu/classes/gc/total:cpu-seconds"},
		{Name: "/cpu/classes/total:cpu-seconds"},
		{Name: "/sched/latencies:seconds"},
		{Name: "/gc/gomemlimit:bytes"},
		{Name: "/memory/classes/total:bytes"},
	}}
	m.cpuStat, m.cores = findCgroup("/proc/self/cgroup", "/sys/fs/cgroup")
	m.procStat = "/proc/self/stat"
	return m, nil
}

// findCgroup returns the cpu.stat file of the process's own cgroup v2 and
// the cores it may use (cpu.max), or "" and GOMAXPROCS when the process is
// in the root cgroup (where cpu.stat counts the whole machine) or there is
// no cgroup v2.
func findCgroup(self, root string) (string, float64) {
	cores := float64(runtime.GOMAXPROCS(0))
	b, err := os.ReadFile(self)
	if err != nil {
		return "", cores
	}
	var rel string
	for _, line := range strings.Split(string(b), "\n") {
		if p, ok := strings.CutPrefix(line, "0::"); ok {
			rel = p
			break
		}
	}
	if rel == "" {
		return "", cores
	}
	dir := filepath.Join(root, filepath.Clean("/"+rel))
	// The root cgroup has no cpu.max: its cpu.stat is the machine's.
	max, err := os.ReadFile(filepath.Join(dir, "cpu.max"))
	if err != nil {
		return "", cores
	}
	if q, ok := parseCPUMax(string(max)); ok {
		cores = math.Min(cores, q)
	}
	stat := filepath.Join(dir, "cpu.stat")
	if _, ok := readCgroupUsage(stat); !ok {
		return "", cores
	}
	return stat, cores
}

// parseCPUMax reads "quota period" (cores = quota/period) or "max period".
func parseCPUMax(s string) (float64, bool) {
	f := strings.Fields(s)
	if len(f) != 2 || f[0] == "max" {
		return 0, false
	}
	q, err1 := strconv.ParseFloat(f[0], 64)
	p, err2 := strconv.ParseFloat(f[1], 64)
	if err1 != nil || err2 != nil || q <= 0 || p <= 0 {
		return 0, false
	}
	return q / p, true
}

// readCgroupUsage reads usage_usec from a cgroup v2 cpu.stat.
func readCgroupUsage(file string) (time.Duration, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "usage_usec "); ok {
			us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			if err != nil {
				return 0, false
			}
			return time.Duration(us) * time.Microsecond, true
		}
	}
	return 0, false
}

// clockTicks is USER_HZ, the unit of /proc/self/stat's times; 100 on every
// Linux architecture Go supports.
const clockTicks = 100

// readProcStat reads utime+stime of /proc/self/stat.
func readProcStat(file string) (time.Duration, bool) {
	b, err := os.ReadFile(file)
	if err != nil {
		return 0, false
	}
	// The command name (field 2) may hold spaces: fields count from the
	// last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, false
	}
	f := strings.Fields(string(b[i+1:]))
	// After ')': state is field 3, utime field 14, stime field 15.
	if len(f) < 13 {
		return 0, false
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, false
	}
	return time.Duration(u+s) * time.Second / clockTicks, true
}

func (m *ResourceMonitor) read(now time.Time) resourceRaw {
	r := resourceRaw{at: now}
	var ok bool
	if m.cpuStat != "" {
		r.cpu, ok = readCgroupUsage(m.cpuStat)
	}
	if !ok {
		r.cpu, _ = readProcStat(m.procStat)
	}
	metrics.Read(m.samples)
	if m.samples[0].Value.Kind() == metrics.KindFloat64 {
		r.gcCPU = m.samples[0].Value.Float64()
		r.totalCPU = m.samples[1].Value.Float64()
	}
	if m.samples[2].Value.Kind() == metrics.KindFloat64Histogram {
		h := m.samples[2].Value.Float64Histogram()
		r.sched = &metrics.Float64Histogram{Counts: append([]uint64(nil), h.Counts...), Buckets: h.Buckets}
	}
	return r
}

// Usage returns the last interval's usage, sampling first if Interval has
// passed.
func (m *ResourceMonitor) Usage() ResourceUsage {
	u, _ := m.sample(time.Now())
	return u
}

// Pressure returns the process's resource use against its targets, the
// worst of CPU, GC, scheduler latency and memory: 1 means at the target.
func (m *ResourceMonitor) Pressure() float64 {
	_, p := m.sample(time.Now())
	return p
}

func (m *ResourceMonitor) sample(now time.Time) (ResourceUsage, float64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	// A caller on a ticker of Interval (a route's resource loop) comes a
	// little early as often as late: an eighth of it early still samples,
	// so such a caller does not read every other sample twice.
	if now.Before(m.next.Add(-m.o.Interval / 8)) {
		return m.usage, m.pressure
	}
	m.next = now.Add(m.o.Interval)
	r := m.read(now)
	if !m.have {
		m.prev, m.have = r, true
		return m.usage, m.pressure
	}
	u := usageBetween(m.prev, r, m.cores)
	if m.cpuStat != "" {
		u.Source = "cgroup"
	} else if r.cpu > 0 {
		u.Source = "proc"
	}
	if lim := m.samples[3].Value; lim.Kind() == metrics.KindUint64 && lim.Uint64() < math.MaxInt64 {
		u.Memory = float64(m.samples[4].Value.Uint64()) / float64(lim.Uint64())
	}
	m.prev, m.usage = r, u
	m.pressure = m.o.pressure(u)
	return u, m.pressure
}

func usageBetween(a, b resourceRaw, cores float64) ResourceUsage {
	u := ResourceUsage{Cores: cores}
	if dt := b.at.Sub(a.at); dt > 0 && cores > 0 {
		u.CPU = float64(b.cpu-a.cpu) / float64(dt) / cores
	}
	if d := b.totalCPU - a.totalCPU; d > 0 {
		u.GC = (b.gcCPU - a.gcCPU) / d
	}
	if a.sched != nil && b.sched != nil && len(a.sched.Counts) == len(b.sched.Counts) {
		u.SchedLatency = histQuantile(a.sched, b.sched, 0.99)
	}
	return u
}

// histQuantile is the q-quantile of the observations b has beyond a,
// interpolated linearly within the bucket it falls in (the runtime's
// scheduler-latency buckets are a quarter of a power of two wide: their
// upper bound read a p99 of 8.5 ms as 10.5 ms, over a 10 ms target).
func histQuantile(a, b *metrics.Float64Histogram, q float64) time.Duration {
	var total uint64
	for i := range b.Counts {
		total += b.Counts[i] - a.Counts[i]
	}
	if total == 0 {
		return 0
	}
	want := q * float64(total)
	var n uint64
	for i := range b.Counts {
		c := b.Counts[i] - a.Counts[i]
		if c == 0 || float64(n+c) < want {
			n += c
			continue
		}
		lo, hi := b.Buckets[i], b.Buckets[i+1]
		switch {
		case math.IsInf(hi, 1):
			return time.Duration(lo * float64(time.Second))
		case math.IsInf(lo, -1):
			return time.Duration(hi * float64(time.Second))
		}
		f := (want - float64(n)) / float64(c)
		return time.Duration((lo + f*(hi-lo)) * float64(time.Second))
	}
	return 0
}

func (o ResourceOptions) pressure(u ResourceUsage) float64 {
	p := u.CPU / o.CPUTarget
	p = math.Max(p, u.GC/o.GCTarget)
	if o.SchedLatencyTarget > 0 && u.SchedLatency > 0 {
		p = math.Max(p, float64(u.SchedLatency)/float64(o.SchedLatencyTarget))
	}
	if u.Memory > 0 {
		p = math.Max(p, u.Memory/o.MemoryTarget)
	}
	return p
}
