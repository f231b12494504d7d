package kafkaadapter_test

import (
	"bytes"
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
)

// The drain benchmarks consume a backlog of b.N messages of 256 B on 4
// partitions with a no-op handler: BenchmarkDrainRaw with a tuned kafka-go
// group Reader (QueueCapacity 1000, CommitInterval 1 s, FetchMessage +
// CommitMessages), BenchmarkDrainSluice with a sluice route on a Source
// (window 1024 messages / 4 MiB, 4 workers, commits every 1 s, prefetch
// 4096 records / 4 MiB: each fetch brings at most the free prefetch slots,
// so with the default prefetch of one window, 1,024 records of 256 B, a
// real broker's round trip per ~260 records caps the rate at about half
// the Reader's; the Reader itself holds up to 1,000 queued messages plus a
// fetch of up to 1 MB per partition). Producing
// the backlog and joining the group are not timed: the clock runs from
// the first message to the last, so neither the join nor the Reader's
// Close (which waits out its long poll) is in the figure. Run them as
// interleaved pairs with scripts/kafka-benchpairs (medians of ns/op,
// cpu-ns/msg and their ratios):
//
//	scripts/kafka-benchpairs 7 200000x                      # kfake in process
//	KAFKA_BROKERS=127.0.0.1:PORT scripts/kafka-benchpairs 7 200000x
//
// cpu-ns/msg is the process's user+system CPU over the timed part per
// message; on kfake it includes the in-process broker.
func BenchmarkDrainRaw(b *testing.B)    { benchDrain(b, drainRaw) }
func BenchmarkDrainSluice(b *testing.B) { benchDrain(b, drainSluice) }

// BenchmarkDrainRawDefaults is the Reader with kafka-go's defaults (only
// Brokers, GroupID, Topic and StartOffset set: QueueCapacity 100, MaxWait
// 10 s, synchronous commits), committing the way a competent user of
// those defaults would: one CommitMessages per 1,000 messages (and the
// last), not per message. BenchmarkDrainSluiceDefaults is a route with
// sluice's defaults: no Window (the self-sizing one), DefaultWorkers, a
// Source with only Cluster, GroupID and Topics set. Both report B/op and
// allocs/op beside ns/op and cpu-ns/msg.
func BenchmarkDrainRawDefaults(b *testing.B)    { benchDrain(b, drainRawDefaults) }
func BenchmarkDrainSluiceDefaults(b *testing.B) { benchDrain(b, drainSluiceDefaults) }

const drainPartitions, drainSize = 4, 256

// drainFn consumes n messages of topic, calling first after the first one
// and returning once the last is handled.
type drainFn func(b *testing.B, topic string, n int, first func())

func benchDrain(b *testing.B, drain drainFn) {
	n := b.N
	topic := cluster.Topic(b, "drain", drainPartitions)
	produceN(b, topic, n, drainSize, nil)
	runtime.GC()
	var cpu0 time.Duration
	b.ReportAllocs()
	b.ResetTimer()
	b.StopTimer()
	drain(b, topic, n, func() {
		cpu0 = cpuTime()
		b.StartTimer()
	})
	b.StopTimer()
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/msg")
	// The timed part alone: a drain stops the timer after its last message,
	// before closing its client (the Reader's Close waits out a long poll).
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "msg/s")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func drainRaw(b *testing.B, topic string, n int, first func()) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: cluster.Brokers, GroupID: kafkatest.UniqueName("drain-raw"), Topic: topic,
		QueueCapacity: 1000, CommitInterval: time.Second, StartOffset: kafka.FirstOffset,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: time.Second, MaxWait: 250 * time.Millisecond,
	})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	for i := 0; i < n; i++ {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			b.Fatalf("raw consumed %d of %d: %v", i, n, err)
		}
		if i == 0 {
			first()
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
}

// rawCommitEvery is how many messages drainRawDefaults commits at once.
const rawCommitEvery = 1000

func drainRawDefaults(b *testing.B, topic string, n int, first func()) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: cluster.Brokers, GroupID: kafkatest.UniqueName("drain-rawdef"), Topic: topic,
		StartOffset: kafka.FirstOffset,
	})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	batch := make([]kafka.Message, 0, rawCommitEvery)
	for i := 0; i < n; i++ {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			b.Fatalf("raw consumed %d of %d: %v", i, n, err)
		}
		if i == 0 {
			first()
		}
		batch = append(batch, m)
		if len(batch) == rawCommitEvery || i == n-1 {
			if err := r.CommitMessages(ctx, batch...); err != nil {
				b.Fatal(err)
			}
			batch = batch[:0]
		}
	}
	b.StopTimer()
}

func drainSluiceDefaults(b *testing.B, topic string, n int, first func()) {
	cfg := kafkaadapter.Config{Cluster: cluster.Kafka(), GroupID: kafkatest.UniqueName("drain-def"), Topics: []string{topic}}
	drainSluiceConfig(b, cfg, 0, n, consumer.WindowPolicy{}, first)
}

func drainSluice(b *testing.B, topic string, n int, first func()) {
	drainSluiceWindow(b, topic, n, consumer.WindowPolicy{Messages: 1024, Bytes: 4 << 20}, first)
}

// drainSluiceWindow consumes n messages through a route with window w and
// returns the window plus the Source's bound in bytes.
func drainSluiceWindow(b *testing.B, topic string, n int, w consumer.WindowPolicy, first func()) int64 {
	cfg := testConfig(kafkatest.UniqueName("drain"), topic)
	cfg.CommitInterval = time.Second
	cfg.PrefetchMessages = max(w.Messages, 4096) // see BenchmarkDrainSluice
	return drainSluiceConfig(b, cfg, 4, n, w, first)
}

// drainSluiceConfig consumes n messages through a route on a Source made
// with cfg, with workers (0: the default) and window w, and returns the
// window plus the Source's bound in bytes.
func drainSluiceConfig(b *testing.B, cfg kafkaadapter.Config, workers, n int, w consumer.WindowPolicy, first func()) int64 {
	var done atomic.Int64
	started, finished := make(chan struct{}), make(chan struct{})
	src, err := kafkaadapter.NewSource(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "drain",
		Source:  src,
		Workers: workers,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			v := done.Add(1)
			if v == 1 {
				close(started)
			}
			if v == int64(n) {
				close(finished)
			}
			return nil
		},
		Window: w,
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	for _, ch := range []chan struct{}{started, finished} {
		select {
		case <-ch:
		case <-time.After(5 * time.Minute):
			b.Fatalf("sluice consumed %d of %d", done.Load(), n)
		}
		if ch == started {
			first()
		}
	}
	b.StopTimer()
	cancel()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	// The bound, checked in the run that measures the throughput: the
	// peak of what the Source held (records, and bytes with the room
	// reserved for fetches in flight) beside the figure.
	st := src.Stats()
	b.ReportMetric(float64(st.PeakBuffered), "peak-held-msgs")
	b.ReportMetric(float64(st.PeakBytes), "peak-held-B")
	b.ReportMetric(float64(st.FetchRequests), "fetches")
	if msgs, bytes := kafkaadapter.HeldBound(src, 2); st.PeakBuffered > msgs || st.PeakBytes > bytes {
		b.Fatalf("held %d records / %d bytes at peak, above the bound %d / %d", st.PeakBuffered, st.PeakBytes, msgs, bytes)
	}
	if testing.Verbose() {
		b.Logf("%d fetch requests, %.0f records each; peak held %d records", st.FetchRequests, float64(st.Fetched)/float64(max(st.FetchRequests, 1)), st.PeakBuffered)
	}
	return w.Bytes + src.Bound(0, 1)
}

// BenchmarkMemoryBacklog drains a backlog of 1 KiB messages with a no-op
// handler and reports the peak live heap growth over the live heap after
// producing (on kfake the broker's copy is in the baseline, and the growth
// also holds kfake's own fetch responses) next to the window plus the
// Source's bound. The growth should not depend on the backlog:
//
//	go test -run '^$' -bench MemoryBacklog -benchtime 1x ./adapters/kafka
func BenchmarkMemoryBacklog(b *testing.B) {
	for _, backlog := range []int{10000, 200000} {
		b.Run(fmt.Sprintf("backlog=%d", backlog), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				topic := cluster.Topic(b, "mem", 4)
				produceN(b, topic, backlog, 1024, nil)
				peak, base, stop := sampleLiveHeap()
				b.StartTimer()
				bound := drainSluiceWindow(b, topic, backlog, consumer.WindowPolicy{Messages: 512, Bytes: 1 << 20}, func() {})
				stop()
				b.ReportMetric(float64(int64(peak.Load())-int64(base))/(1<<20), "heap-growth-MiB")
				b.ReportMetric(float64(bound)/(1<<20), "window+bound-MiB")
			}
		})
	}
}

// sampleLiveHeap GCs often and samples the live heap every millisecond
// until stop: live heap, not HeapInuse, because with the broker's backlog
// in process (kfake) GOGC headroom alone would be hundreds of MiB.
func sampleLiveHeap() (peak *atomic.Uint64, base uint64, stop func()) {
	old := debug.SetGCPercent(5)
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	base = s[0].Value.Uint64()
	peak = new(atomic.Uint64)
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(time.Millisecond)
		defer t.Stop()
		s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
		for {
			select {
			case <-quit:
				return
			case <-t.C:
			}
			metrics.Read(s)
			if v := s[0].Value.Uint64(); v > peak.Load() {
				peak.Store(v)
			}
		}
	}()
	return peak, base, func() {
		close(quit)
		<-done
		debug.SetGCPercent(old)
	}
}

// BenchmarkIdleRoutes starts 100 routes on one Cluster, each a Source of
// its own group on its own topic, among 400 other topics, waits until all
// are assigned and then idle, and reports per route the live heap and the
// goroutines they added (not counting kfake's), and the CPU the process spent idling
// (percent of one core, over 10 s after 5 s to settle; on kfake it
// includes the in-process broker):
//
//	go test -run '^$' -bench IdleRoutes -benchtime 1x ./adapters/kafka
func BenchmarkIdleRoutes(b *testing.B) {
	const routes, others = 100, 400
	for range b.N {
		b.StopTimer()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		var topics []string
		for i := range routes + others {
			topics = append(topics, kafkatest.UniqueName(fmt.Sprintf("idle%d", i)))
		}
		createTopics(b, ctx, topics, 1)
		runtime.GC()
		g0, h0 := clientGoroutines(), liveHeap()
		kc := &kafkaadapter.Cluster{Brokers: cluster.Brokers}
		var srcs []*kafkaadapter.Source
		for i := range routes {
			cfg := testConfig(kafkatest.UniqueName("idle"), topics[i])
			cfg.Cluster = kc
			cfg.HeartbeatInterval, cfg.FetchMaxWait, cfg.PollWait, cfg.CommitInterval = 0, 0, 0, 0 // the defaults
			srcs = append(srcs, attachedSource(b, cfg, consumer.WindowPolicy{Messages: 16, Bytes: consumer.DefaultWindowBytes}))
		}
		for _, src := range srcs {
			if err := src.Ready(ctx); err != nil {
				b.Fatal(err)
			}
		}
		time.Sleep(5 * time.Second) // settle: first fetches, metadata, the garbage of setting up
		runtime.GC()
		g1, h1 := clientGoroutines(), liveHeap()
		c0, t0 := cpuTime(), time.Now()
		b.StartTimer()
		time.Sleep(10 * time.Second)
		b.StopTimer()
		cpu := float64(cpuTime()-c0) / float64(time.Since(t0))
		for _, src := range srcs {
			_ = src.Close()
		}
		cancel()
		b.ReportMetric(float64(int64(h1)-int64(h0))/routes/1024, "heap-KiB/route")
		b.ReportMetric(float64(g1-g0)/routes, "goroutines/route")
		b.ReportMetric(100*cpu, "cpu-%core")
	}
}

// clientGoroutines counts the goroutines outside kfake (whose in-process
// broker runs two per client connection).
func clientGoroutines() int {
	var buf bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&buf, 1)
	n := 0
	for _, stack := range strings.Split(buf.String(), "\n\n") {
		var count int
		if _, err := fmt.Sscanf(stack, "%d @", &count); err == nil && !strings.Contains(stack, "pkg/kfake") {
			n += count
		}
	}
	return n
}

func liveHeap() uint64 {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

func createTopics(b *testing.B, ctx context.Context, topics []string, partitions int) {
	var cfgs []kafka.TopicConfig
	for _, t := range topics {
		cfgs = append(cfgs, kafka.TopicConfig{Topic: t, NumPartitions: partitions, ReplicationFactor: 1})
	}
	res, err := cluster.Client().CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: cfgs})
	if err != nil {
		b.Fatal(err)
	}
	for t, err := range res.Errors {
		if err != nil {
			b.Fatalf("create %s: %v", t, err)
		}
	}
}

// BenchmarkDrainHeap drains 200k messages of 256 B on 4 partitions (the
// drain benchmarks' backlog) with each consumer and reports the peak live
// heap growth over the live heap after producing (kfake's copy of the
// backlog is in the baseline; on kfake the growth also holds kfake's fetch
// responses), and for sluice the window plus the Source's bound:
//
//	go test -run '^$' -bench DrainHeap -benchtime 1x -count 3 ./adapters/kafka
func BenchmarkDrainHeap(b *testing.B) {
	const n = 200000
	for _, side := range []struct {
		name  string
		drain drainFn
	}{{"raw", drainRaw}, {"sluice", drainSluice}} {
		b.Run(side.name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				topic := cluster.Topic(b, "drainheap", drainPartitions)
				produceN(b, topic, n, drainSize, nil)
				peak, base, stop := sampleLiveHeap()
				side.drain(b, topic, n, func() {})
				stop()
				b.ReportMetric(float64(int64(peak.Load())-int64(base))/(1<<20), "heap-growth-MiB")
				if side.name == "sluice" {
					w := int64(4 << 20)                                            // drainSluice's window
					b.ReportMetric(float64(2*w+2<<20)/(1<<20), "window+bound-MiB") // window + prefetch + two responses in transit
				}
			}
		})
	}
}
