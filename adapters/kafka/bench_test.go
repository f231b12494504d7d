package kafkaadapter_test

import (
	"context"
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sort"
	"sync/atomic"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/kafkatest"
)

// BenchmarkConsume compares, side by side on the same broker, a sluice
// route (no-op handler) with a raw kafka-go group Reader (FetchMessage +
// CommitMessages, CommitInterval 1 s), consuming b.N messages of 128 B
// from 4 partitions (each run includes joining the group). Run with
// -count 5 and compare the medians of msg/s:
//
//	go test -run '^$' -bench 'Consume$' -benchtime 50000x -count 5 ./adapters/kafka
func BenchmarkConsume(b *testing.B) {
	b.Run("sluice", func(b *testing.B) { benchConsume(b, consumeSluice) })
	b.Run("raw", func(b *testing.B) { benchConsume(b, consumeRaw) })
}

// BenchmarkConsumePairs runs 5 interleaved pairs (sluice, then raw) of
// 50k messages each per iteration and reports the medians and their ratio:
//
//	go test -run '^$' -bench ConsumePairs -benchtime 1x ./adapters/kafka
func BenchmarkConsumePairs(b *testing.B) {
	const n, pairs = 50000, 5
	for range b.N {
		var sl, raw []float64
		for range pairs {
			for _, side := range []struct {
				fn  func(*testing.B, string, int)
				out *[]float64
			}{{consumeSluice, &sl}, {consumeRaw, &raw}} {
				b.StopTimer()
				topic := cluster.Topic(b, "pairs", 4)
				produceN(b, topic, n, 128, nil)
				b.StartTimer()
				start := time.Now()
				side.fn(b, topic, n)
				*side.out = append(*side.out, float64(n)/time.Since(start).Seconds())
			}
		}
		ms, mr := median(sl), median(raw)
		b.ReportMetric(ms, "sluice-msg/s")
		b.ReportMetric(mr, "raw-msg/s")
		b.ReportMetric(ms/mr, "ratio")
	}
}

func median(xs []float64) float64 {
	s := append([]float64(nil), xs...)
	sort.Float64s(s)
	return s[len(s)/2]
}

// BenchmarkMemoryBacklog consumes a backlog of 1 KiB messages with a no-op
// handler and reports the peak live heap growth over the live heap after
// producing (the broker's copy, in process on kfake, is in the baseline;
// on kfake the growth also holds kfake's own fetch responses) next to the
// window plus the Source's prefetch bound. The growth should not depend on
// the backlog:
//
//	go test -run '^$' -bench MemoryBacklog -benchtime 1x ./adapters/kafka
func BenchmarkMemoryBacklog(b *testing.B) {
	for _, backlog := range []int{10000, 200000} {
		b.Run(fmt.Sprintf("backlog=%d", backlog), func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				topic := cluster.Topic(b, "mem", 4)
				produceN(b, topic, backlog, 1024, nil)
				// Live heap, not HeapInuse: with the broker's backlog in
				// process, GOGC headroom alone would be hundreds of MiB of
				// garbage. GC often, and sample the heap marked live.
				old := debug.SetGCPercent(5)
				runtime.GC()
				live := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
				metrics.Read(live)
				base := live[0].Value.Uint64()
				var peak atomic.Uint64
				stop := make(chan struct{})
				sampled := make(chan struct{})
				go func() {
					defer close(sampled)
					t := time.NewTicker(time.Millisecond)
					defer t.Stop()
					s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
					for {
						select {
						case <-stop:
							return
						case <-t.C:
						}
						metrics.Read(s)
						if v := s[0].Value.Uint64(); v > peak.Load() {
							peak.Store(v)
						}
					}
				}()
				b.StartTimer()
				bound := consumeSluiceWindow(b, topic, backlog, kafkaadapter.Window{Messages: 512, Bytes: 1 << 20})
				b.StopTimer()
				close(stop)
				<-sampled
				debug.SetGCPercent(old)
				growth := int64(peak.Load()) - int64(base)
				b.ReportMetric(float64(growth)/(1<<20), "heap-growth-MiB")
				b.ReportMetric(float64(bound)/(1<<20), "window+prefetch-MiB")
			}
		})
	}
}

func benchConsume(b *testing.B, consume func(b *testing.B, topic string, n int)) {
	topic := cluster.Topic(b, "bench", 4)
	n := max(b.N, 1000)
	produceN(b, topic, n, 128, nil)
	b.SetBytes(128)
	b.ResetTimer()
	start := time.Now()
	consume(b, topic, n)
	b.ReportMetric(float64(n)/time.Since(start).Seconds(), "msg/s")
}

func consumeSluice(b *testing.B, topic string, n int) {
	consumeSluiceWindow(b, topic, n, kafkaadapter.Window{Messages: 1024, Bytes: 4 << 20})
}

// consumeSluiceWindow consumes n messages through a route with window w and
// returns the window plus the Source's prefetch bound in bytes.
func consumeSluiceWindow(b *testing.B, topic string, n int, w kafkaadapter.Window) int64 {
	var done atomic.Int64
	finished := make(chan struct{})
	cfg := testConfig(kafkatest.UniqueName("bench"), topic)
	cfg.Window = w
	cfg.CommitInterval = time.Second
	src, err := kafkaadapter.NewSource(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name: "bench", Source: src, Workers: 4, MaxInFlight: w.Messages, MaxInFlightBytes: w.Bytes,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			if done.Add(1) == int64(n) {
				close(finished)
			}
			return nil
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	select {
	case <-finished:
	case <-time.After(2 * time.Minute):
		b.Errorf("sluice consumed %d of %d", done.Load(), n)
	}
	cancel()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	return w.Bytes + src.Bound(0, 4)
}

func consumeRaw(b *testing.B, topic string, n int) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: cluster.Brokers, GroupID: kafkatest.UniqueName("bench-raw"), Topic: topic,
		CommitInterval: time.Second, SessionTimeout: 6 * time.Second, HeartbeatInterval: 250 * time.Millisecond,
		MaxWait: 100 * time.Millisecond, StartOffset: kafka.FirstOffset,
	})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := 0; i < n; i++ {
		m, err := r.FetchMessage(ctx)
		if err != nil {
			b.Fatalf("raw consumed %d of %d: %v", i, n, err)
		}
		if err := r.CommitMessages(ctx, m); err != nil {
			b.Fatal(err)
		}
	}
}
