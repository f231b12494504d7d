package franzadapter_test

import (
	"context"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	franzadapter "github.com/sluice-go/sluice/adapters/franz"
	"github.com/sluice-go/sluice/consumer"
)

// The drain benchmarks consume a backlog of b.N messages of 256 B on 4
// partitions with a no-op handler, with the same commit guarantee (an
// offset is committed only once its record, and every record before it in
// its partition, is processed; commits every 1 s):
//
//   - BenchmarkDrainRawKgo: a tuned kgo PollFetches loop (kgo's defaults,
//     AutoCommitMarks with a 1 s interval, MarkCommitRecords after
//     processing each poll: one goroutine handles records in order);
//   - BenchmarkDrainSluiceKgo: a sluice route on a franz Source with the
//     same kgo options (window 1024 messages / 4 MiB, 4 workers, prefetch
//     4096 records, commits every 1 s).
//
// Producing the backlog and joining the group are not timed: the clock
// runs from the first message to the last. Run them as interleaved pairs:
//
//	scripts/benchpairs ./adapters/franz BenchmarkDrainRawKgo BenchmarkDrainSluiceKgo 7 200000x
//	KAFKA_BROKERS=127.0.0.1:PORT scripts/benchpairs ./adapters/franz BenchmarkDrainRawKgo BenchmarkDrainSluiceKgo 7 200000x
//
// cpu-ns/msg is the process's user+system CPU over the timed part per
// message; on kfake it includes the in-process broker.
func BenchmarkDrainRawKgo(b *testing.B)    { benchDrain(b, drainRawKgo) }
func BenchmarkDrainSluiceKgo(b *testing.B) { benchDrain(b, drainSluiceKgo) }

const drainPartitions, drainSize = 4, 256

func benchDrain(b *testing.B, drain func(b *testing.B, topic string, n int, first func())) {
	n := b.N
	topic := newTopic(b, "drain", drainPartitions)
	cl := client(b, kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(5*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	value := make([]byte, drainSize)
	for i := 0; i < n; i += 10000 {
		recs := make([]*kgo.Record, min(10000, n-i))
		for j := range recs {
			recs[j] = &kgo.Record{Value: value}
		}
		if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
			b.Fatal(err)
		}
	}
	cl.Close()
	var cpu0 time.Duration
	var t0 time.Time
	b.ResetTimer()
	b.StopTimer()
	drain(b, topic, n, func() {
		cpu0, t0 = cpuTime(), time.Now()
		b.StartTimer()
	})
	b.StopTimer()
	cpu := cpuTime() - cpu0
	b.ReportMetric(float64(cpu.Nanoseconds())/float64(n), "cpu-ns/msg")
	b.ReportMetric(float64(n)/time.Since(t0).Seconds(), "msg/s")
}

func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func drainOpts(topic string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(uniqueName("drain")), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.SessionTimeout(6 * time.Second),
	}
}

func drainRawKgo(b *testing.B, topic string, n int, first func()) {
	cl, err := kgo.NewClient(append(drainOpts(topic), kgo.AutoCommitMarks(), kgo.AutoCommitInterval(time.Second))...)
	if err != nil {
		b.Fatal(err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	var handled atomic.Int64 // what a handler would do: count it
	for got := 0; got < n; {
		fs := cl.PollFetches(ctx)
		if err := fs.Err0(); err != nil {
			b.Fatalf("raw consumed %d of %d: %v", got, n, err)
		}
		fs.EachRecord(func(*kgo.Record) {
			if got == 0 {
				first()
			}
			got++
			handled.Add(1)
		})
		cl.MarkCommitRecords(fs.Records()...)
	}
	b.StopTimer()
}

func drainSluiceKgo(b *testing.B, topic string, n int, first func()) {
	var done atomic.Int64
	started, finished := make(chan struct{}), make(chan struct{})
	src, err := franzadapter.NewSource(franzadapter.Config{CommitInterval: time.Second, PrefetchMessages: 4096}, drainOpts(topic)...)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "drain",
		Source:  src,
		Workers: 4,
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
		Window: consumer.WindowPolicy{Messages: 1024, Bytes: 4 << 20},
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
	if testing.Verbose() {
		st := src.Stats()
		b.Logf("%d polls, %.0f records each; peak held %d records", st.Polls, float64(st.Fetched)/float64(max(st.Polls, 1)), st.PeakBuffered)
	}
}
