package natsadapter_test

import (
	"context"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
)

// idleCost runs n routes (window 64, one worker each) on one connection
// to a broker in a child process, lets each settle one message (so the
// reply subscription of its confirmed acks exists, as on a route that was
// busy before), then measures them idle: live heap and goroutines per
// route above what the process had before, and the share of one core the
// process uses over cpuFor (0: not measured).
func idleCost(tb testing.TB, n int, cpuFor time.Duration) (heapPerRoute float64, goroutinesPerRoute float64, coreShare float64) {
	tb.Helper()
	url := startServerProcess(tb)
	nc, err := nats.Connect(url)
	if err != nil {
		tb.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "IDLE", Subjects: []string{"idle.>"}}); err != nil {
		tb.Fatal(err)
	}
	heap0, g0 := liveHeap(), runtime.NumGoroutine()

	const window = 64
	routes := make([]consumer.Route, n)
	for i := range routes {
		subj := "idle." + strconv.Itoa(i)
		src, err := natsadapter.NewSourceFor(ctx, js, "IDLE", jetstream.ConsumerConfig{Durable: "r" + strconv.Itoa(i), FilterSubject: subj}, natsadapter.SourceOptions{})
		if err != nil {
			tb.Fatal(err)
		}
		routes[i] = consumer.Route{
			Expiry:  expiry.Policy{IgnoreHeader: true}, // not about deadlines: run every message publish made
			Name:    "r" + strconv.Itoa(i),
			Source:  src,
			Workers: 1,
			Handler: func(context.Context, *consumer.Message) error { return nil },
			Window:  consumer.WindowPolicy{Messages: window, Bytes: 1 << 20},
		}
		if _, err := js.Publish(ctx, subj, []byte("x")); err != nil {
			tb.Fatal(err)
		}
	}
	c, err := consumer.New(consumer.Options{}, routes...)
	if err != nil {
		tb.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			tb.Error(err)
		}
		for _, r := range routes {
			_ = r.Source.(*natsadapter.Source).Close()
		}
	}()
	deadline := time.Now().Add(30 * time.Second)
	for {
		done := 0
		for _, s := range c.Stats() {
			if s.Settled[consumer.OutcomeSucceeded] == 1 && s.Held == 0 {
				done++
			}
		}
		if done == n {
			break
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%d of %d routes settled their message", done, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The goroutine calling Run is the caller's, not the routes'.
	heap1, g1 := liveHeap(), runtime.NumGoroutine()-1
	if cpuFor > 0 {
		t0 := time.Now()
		c0 := selfCPU()
		time.Sleep(cpuFor)
		coreShare = float64(selfCPU()-c0) / float64(time.Since(t0))
	}
	return float64(heap1-heap0) / float64(n), float64(g1-g0) / float64(n), coreShare
}

func liveHeap() int64 {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestIdleRouteCost checks issue 16's idle budget: 100 idle routes cost at
// most 32 KiB of heap and 4 goroutines each. With one worker a route has
// four: the fetch loop, the worker and the keep-alive loop of the
// consumer, and the Source's ack reply subscription (nats.go runs one
// goroutine per callback subscription; the pull replies arrive on a
// channel the fetch loop reads, and the settlement writer exists only
// while it writes).
func TestIdleRouteCost(t *testing.T) {
	heap, g, _ := idleCost(t, 100, 0)
	t.Logf("per idle route: %.1f KiB heap, %.2f goroutines", heap/1024, g)
	if heap > 32<<10 || g > 4 {
		t.Fatalf("per idle route: %.1f KiB heap (budget 32), %.2f goroutines (budget 4)", heap/1024, g)
	}
}

// BenchmarkIdleRoutes reports what 100 idle routes cost: heap and
// goroutines per route, and the share of one core the consumer process
// uses while they wait (pull requests expire every PollWait, 1 s).
//
//	go test ./adapters/nats -run '^$' -bench IdleRoutes -benchtime 1x -count 3
func BenchmarkIdleRoutes(b *testing.B) {
	const n = 100
	for range b.N {
		heap, g, share := idleCost(b, n, 5*time.Second)
		b.ReportMetric(heap/1024, "heap-KiB/route")
		b.ReportMetric(g, "goroutines/route")
		b.ReportMetric(100*share, "%core/100routes")
		if testing.Verbose() {
			fmt.Printf("idle: %.1f KiB, %.2f goroutines per route, %.3f%% of a core for %d routes\n", heap/1024, g, 100*share, n)
		}
	}
}
