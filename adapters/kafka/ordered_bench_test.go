package kafkaadapter_test

import (
	"context"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
)

// BenchmarkOrdered consumes b.N messages of one partition, on 10,000 keys,
// through the same route (16 workers, window 256, a handler sleeping 2 ms)
// ordered by=key or by=partition: ByKey runs different keys in parallel,
// ByPartition one message at a time. Every key has at least two messages,
// in random places of the partition (b.N >= 20,000: the 10,000 keys, each
// b.N/10,000 times; fewer messages: b.N/2 keys, twice each), and a checker
// records each key's sequence and fails the benchmark if a message ran
// before an earlier one of its key, twice, or while another of its key
// ran. ns/op is the time per message from the first message to the last
// (joining the group is not timed); "checked" is how many messages came
// after an earlier one of their key (the order the checker verified).
// Interleaved pairs, ByKey's throughput against ByPartition's (the figures
// of docs/benchmarks.md, on kfake and on a real broker):
//
//	scripts/benchpairs ./adapters/kafka BenchmarkOrdered/by=partition BenchmarkOrdered/by=key 5 20000x
//	KAFKA_BROKERS=127.0.0.1:PORT scripts/benchpairs ./adapters/kafka BenchmarkOrdered/by=partition BenchmarkOrdered/by=key 5 20000x
func BenchmarkOrdered(b *testing.B) {
	for _, by := range []consumer.Ordering{consumer.ByKey, consumer.ByPartition} {
		name := map[consumer.Ordering]string{consumer.ByKey: "key", consumer.ByPartition: "partition"}[by]
		b.Run("by="+name, func(b *testing.B) { benchOrdered(b, by) })
	}
}

const orderedKeys = 10_000

func benchOrdered(b *testing.B, by consumer.Ordering) {
	n := b.N
	topic := cluster.Topic(b, "ordered", 1)
	keys := make([]int, n)
	for i := range keys {
		keys[i] = i % max(1, min(orderedKeys, n/2))
	}
	rand.Shuffle(n, func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	produceKeyed(b, topic, n, func(i int) int { return keys[i] })
	runtime.GC()

	var (
		mu         sync.Mutex
		running    = map[string]bool{}
		last       = map[string]int{}
		violations int
		checked    int
		done       atomic.Int64
		t0         time.Time
	)
	finished := make(chan struct{})
	handler := func(_ context.Context, m *consumer.Message) error {
		key, seq := string(m.Key), seqOf(m)
		mu.Lock()
		if t0.IsZero() {
			t0 = time.Now()
			b.StartTimer()
		}
		l, ok := last[key]
		if running[key] || ok && seq <= l {
			violations++
		}
		if ok {
			checked++
		}
		running[key], last[key] = true, seq
		mu.Unlock()
		time.Sleep(2 * time.Millisecond)
		mu.Lock()
		running[key] = false
		mu.Unlock()
		if done.Add(1) == int64(n) {
			close(finished)
		}
		return nil
	}
	cfg := testConfig(kafkatest.UniqueName("ordered"), topic)
	cfg.CommitInterval = time.Second
	src, err := kafkaadapter.NewSource(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer src.Close()
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name: "ordered", Source: src, Handler: handler, Workers: 16, Ordering: by,
		Window: consumer.WindowPolicy{Messages: 256, Bytes: 4 << 20},
	})
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	b.StopTimer()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	select {
	case <-finished:
	case <-time.After(10 * time.Minute):
		b.Fatalf("%d of %d handled", done.Load(), n)
	}
	b.StopTimer()
	elapsed := time.Since(t0)
	cancel()
	if err := <-errc; err != nil {
		b.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if violations > 0 {
		b.Fatalf("%d runs out of order or concurrent with their key", violations)
	}
	b.ReportMetric(float64(n)/elapsed.Seconds(), "msg/s")
	b.ReportMetric(float64(len(last)), "keys")
	b.ReportMetric(float64(checked), "checked")
}
