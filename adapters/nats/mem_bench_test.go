package natsadapter_test

import (
	"context"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/consumer"
)

// startServerProcess runs nats-server in a child process (this test binary
// in serve mode) and returns its URL; it stops in tb.Cleanup.
func startServerProcess(tb testing.TB) string {
	tb.Helper()
	p, err := newServerProcess(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(p.stop)
	return p.url
}

// BenchmarkBacklogHeap drains a backlog of 1 KiB messages through a route
// with a 256-message / 256 KiB window and reports the consumer process's
// peak heap above its idle baseline. The broker runs in a child process, so
// only the client and sluice are measured. The figure should not grow with
// the backlog: the window bounds what is held, and the Source buffers
// nothing between pulls.
//
//	go test ./adapters/nats -run '^$' -bench BacklogHeap -benchtime 1x -count 3
func BenchmarkBacklogHeap(b *testing.B) {
	for _, backlog := range []int{10_000, 200_000} {
		b.Run("backlog="+strconv.Itoa(backlog), func(b *testing.B) { benchBacklogHeap(b, backlog) })
	}
}

func benchBacklogHeap(b *testing.B, backlog int) {
	const window, windowBytes = 256, 256 << 10
	url := startServerProcess(b)
	nc, err := nats.Connect(url)
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	var peakKiB, baseKiB float64
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		name := "MEM" + strconv.Itoa(i)
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}, Storage: jetstream.FileStorage}); err != nil {
			b.Fatal(err)
		}
		payload := make([]byte, 1024)
		subj := strings.ToLower(name) + ".x"
		for j := 0; j < backlog; j += 1024 {
			var futs []jetstream.PubAckFuture
			for k := j; k < min(j+1024, backlog); k++ {
				f, err := js.PublishAsync(subj, payload)
				if err != nil {
					b.Fatal(err)
				}
				futs = append(futs, f)
			}
			for _, f := range futs {
				select {
				case <-f.Ok():
				case err := <-f.Err():
					b.Fatal(err)
				}
			}
		}
		src, err := natsadapter.NewSourceFor(ctx, js, name, jetstream.ConsumerConfig{Durable: "mem"}, natsadapter.SourceOptions{Confirm: natsadapter.ConfirmNone})
		if err != nil {
			b.Fatal(err)
		}
		var n atomic.Int64
		c, err := consumer.New(consumer.Options{}, consumer.Route{
			Name:    "mem",
			Source:  src,
			Workers: 4,
			Handler: func(context.Context, *consumer.Message) error { n.Add(1); return nil },
			Window:  consumer.WindowPolicy{Messages: window, Bytes: windowBytes},
		})
		if err != nil {
			b.Fatal(err)
		}
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		base := ms.HeapInuse
		var peak atomic.Uint64
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ms runtime.MemStats
			t := time.NewTicker(5 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-stop:
					return
				case <-t.C:
					runtime.ReadMemStats(&ms)
					if ms.HeapInuse > peak.Load() {
						peak.Store(ms.HeapInuse)
					}
				}
			}
		}()
		runCtx, cancel := context.WithCancel(ctx)
		errc := make(chan error, 1)
		b.StartTimer()
		go func() { errc <- c.Run(runCtx) }()
		for n.Load() < int64(backlog) {
			time.Sleep(time.Millisecond)
		}
		b.StopTimer()
		cancel()
		if err := <-errc; err != nil {
			b.Fatal(err)
		}
		close(stop)
		wg.Wait()
		if s := c.Stats()[0]; s.Window.PeakBytes > windowBytes {
			b.Fatalf("window exceeded: %d bytes", s.Window.PeakBytes)
		}
		peakKiB = max(peakKiB, float64(peak.Load()-min(peak.Load(), base))/1024)
		baseKiB = float64(base) / 1024
	}
	b.ReportMetric(peakKiB, "peak-heap-KiB")
	b.ReportMetric(float64(windowBytes)/1024, "window-KiB")
	b.ReportMetric(baseKiB, "base-heap-KiB")
}
