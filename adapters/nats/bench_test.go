package natsadapter_test

import (
	"context"
	"fmt"
	"os"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/consumer"
)

// The Consume benchmarks share one shape: each iteration of b.N is one
// message (128 B or 1 KiB) published before the timer starts, then
// consumed with a no-op handler and acknowledged. The broker is a
// nats-server in a child process shared by the whole run (started on first
// use), so the consumer's CPU is measured apart from the broker's:
// cpu-ns/msg is this process (client + sluice), srv-cpu-ns/msg the
// broker's, both per message.
//
//   - BenchmarkConsumeRaw: jetstream Consume + plain Ack (fire-and-forget),
//     the handler inline on the Consume callback.
//   - BenchmarkConsumeRawDoubleAck: jetstream Consume handing messages to
//     8 worker goroutines, each calling DoubleAck (the server-confirmed
//     ack, one round trip per message on a worker): the fair baseline for
//     sluice's default, which also knows every ack landed.
//   - BenchmarkConsumeSluice: a route over adapters/nats with the default
//     settlement (ConfirmBatch: pipelined, the last ack of each write
//     batch answered by the server, confirming the batch).
//   - BenchmarkConsumeSluiceReply: the same route with ConfirmReply (each
//     settlement answered by the server).
//   - BenchmarkConsumeSluicePlainAck: the same route with ConfirmNone (the
//     plain Ack of the raw benchmark).
//
// Compare them as interleaved pairs (see docs/benchmarks.md):
//
//	scripts/benchpairs ./adapters/nats BenchmarkConsumeRaw/size=128 BenchmarkConsumeSluice/size=128/workers=8 7

var benchSizes = []int{128, 1024}

const benchWindow = 256

// benchJetStream connects to the shared broker process.
func benchJetStream(b *testing.B) (*nats.Conn, jetstream.JetStream) {
	b.Helper()
	nc, err := nats.Connect(sharedServer(b).url)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	return nc, js
}

var streamSeq atomic.Int64

// benchStream creates a memory stream with a fresh name, publishes n
// messages of size bytes to it, and deletes it in b.Cleanup.
func benchStream(b *testing.B, js jetstream.JetStream, n, size int) (context.Context, string, jetstream.Stream) {
	b.Helper()
	ctx := context.Background()
	name := "BENCH" + strconv.FormatInt(streamSeq.Add(1), 10)
	subj := strings.ToLower(name) + ".x"
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}, Storage: jetstream.MemoryStorage})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	payload := make([]byte, size)
	for i := 0; i < n; i += 512 {
		var futs []jetstream.PubAckFuture
		for j := i; j < min(i+512, n); j++ {
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
	return ctx, name, st
}

// cpuMeter measures the CPU time this process and the broker process
// spend between start and stop.
type cpuMeter struct {
	self, srv time.Duration
	writes    int64
	prof      *os.File
}

func (c *cpuMeter) start(b *testing.B) {
	c.self, c.srv, c.writes = selfCPU(), sharedServer(b).cpu(), selfWrites()
	if f := os.Getenv("SLUICE_BENCH_CPUPROFILE"); f != "" {
		// A profile of the timed part only (the publishing before it
		// would dominate -cpuprofile).
		out, err := os.Create(f)
		if err != nil {
			b.Fatal(err)
		}
		if err := pprof.StartCPUProfile(out); err != nil {
			b.Fatal(err)
		}
		c.prof = out
	}
}

func (c *cpuMeter) report(b *testing.B) {
	if c.prof != nil {
		pprof.StopCPUProfile()
		_ = c.prof.Close()
	}
	self, srv := selfCPU()-c.self, sharedServer(b).cpu()
	b.ReportMetric(float64(self.Nanoseconds())/float64(b.N), "cpu-ns/msg")
	if w := selfWrites(); w >= 0 && c.writes >= 0 {
		// Write syscalls per message: how well acks are batched.
		b.ReportMetric(float64(w-c.writes)/float64(b.N), "writes/msg")
	}
	if srv >= 0 {
		srv -= c.srv
		b.ReportMetric(float64(srv.Nanoseconds())/float64(b.N), "srv-cpu-ns/msg")
	}
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func BenchmarkConsumeRaw(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+strconv.Itoa(size), func(b *testing.B) { benchRaw(b, size, 0) })
	}
}

// BenchmarkConsumeRawDefaults is BenchmarkConsumeRaw with the client's
// defaults: a consumer with only Durable and explicit acks (MaxAckPending
// 1,000) and Consume without options (PullMaxMessages 500).
func BenchmarkConsumeRawDefaults(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+strconv.Itoa(size), func(b *testing.B) { benchRaw(b, size, -1) })
	}
}

func BenchmarkConsumeRawDoubleAck(b *testing.B) {
	for _, size := range benchSizes {
		b.Run("size="+strconv.Itoa(size), func(b *testing.B) { benchRaw(b, size, 8) })
	}
}

// benchRaw consumes with jetstream Consume. workers == 0: the handler runs
// on the Consume callback and acks with a plain Ack. workers > 0: the
// callback hands each message to one of workers goroutines, which call
// DoubleAck. workers < 0: as 0, with the client's defaults.
func benchRaw(b *testing.B, size, workers int) {
	_, js := benchJetStream(b)
	ctx, _, st := benchStream(b, js, b.N, size)
	cfg := jetstream.ConsumerConfig{Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: benchWindow}
	var opts []jetstream.PullConsumeOpt
	if workers < 0 {
		cfg.MaxAckPending = 0
	} else {
		opts = append(opts, jetstream.PullMaxMessages(benchWindow))
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	var ackErrs atomic.Int64
	done := make(chan struct{})
	count := func() {
		if n.Add(1) == int64(b.N) {
			close(done)
		}
	}
	handle := func(m jetstream.Msg) { _ = m.Ack(); count() }
	var wg sync.WaitGroup
	work := make(chan jetstream.Msg, benchWindow)
	if workers > 0 {
		for range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for m := range work {
					if err := m.DoubleAck(ctx); err != nil {
						ackErrs.Add(1)
					}
					count()
				}
			}()
		}
		handle = func(m jetstream.Msg) { work <- m }
	}
	var cpu cpuMeter
	b.ReportAllocs()
	b.ResetTimer()
	cpu.start(b)
	cc, err := cons.Consume(handle, opts...)
	if err != nil {
		b.Fatal(err)
	}
	<-done
	b.StopTimer()
	cpu.report(b)
	cc.Stop()
	<-cc.Closed()
	close(work)
	wg.Wait()
	if ackErrs.Load() > 0 {
		b.Fatalf("%d DoubleAck errors", ackErrs.Load())
	}
}

// The worker counts of the sluice benchmarks: 8 is the headline (the raw
// DoubleAck baseline has 8 workers too); the others show scaling.
var benchWorkers = []int{1, 4, 8, 16, 64}

func BenchmarkConsumeSluice(b *testing.B) { benchSluiceAll(b, natsadapter.ConfirmBatch) }

func BenchmarkConsumeSluiceReply(b *testing.B) { benchSluiceAll(b, natsadapter.ConfirmReply) }

func BenchmarkConsumeSluicePlainAck(b *testing.B) { benchSluiceAll(b, natsadapter.ConfirmNone) }

// BenchmarkConsumeSluiceDefaults is BenchmarkConsumeSluice with sluice's
// defaults: the route sets no Window (the self-sizing window) and the
// Source no options; only the worker count varies.
func BenchmarkConsumeSluiceDefaults(b *testing.B) {
	for _, size := range benchSizes {
		for _, w := range benchWorkers {
			b.Run(fmt.Sprintf("size=%d/workers=%d", size, w), func(b *testing.B) {
				benchSluiceWindow(b, size, w, natsadapter.ConfirmBatch, consumer.WindowPolicy{})
			})
		}
	}
}

func benchSluiceAll(b *testing.B, mode natsadapter.ConfirmMode) {
	for _, size := range benchSizes {
		for _, w := range benchWorkers {
			b.Run(fmt.Sprintf("size=%d/workers=%d", size, w), func(b *testing.B) { benchSluice(b, size, w, mode) })
		}
	}
}

func benchSluice(b *testing.B, size, workers int, mode natsadapter.ConfirmMode) {
	benchSluiceWindow(b, size, workers, mode, consumer.WindowPolicy{Messages: benchWindow, Bytes: 64 << 20})
}

func benchSluiceWindow(b *testing.B, size, workers int, mode natsadapter.ConfirmMode, window consumer.WindowPolicy) {
	_, js := benchJetStream(b)
	ctx, name, _ := benchStream(b, js, b.N, size)
	src, err := natsadapter.NewSourceFor(ctx, js, name, jetstream.ConsumerConfig{Durable: "sluice"},
		natsadapter.SourceOptions{Confirm: mode})
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	done := make(chan struct{})
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "bench",
		Source:  src,
		Workers: workers,
		Handler: func(context.Context, *consumer.Message) error {
			if n.Add(1) == int64(b.N) {
				close(done)
			}
			return nil
		},
		Window: window,
	})
	if err != nil {
		b.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	var cpu cpuMeter
	b.ReportAllocs()
	b.ResetTimer()
	cpu.start(b)
	go func() { errc <- c.Run(runCtx) }()
	<-done
	// The settlements follow the handler: wait for the last ones.
	for c.Stats()[0].Settled[consumer.OutcomeSucceeded] < uint64(b.N) {
		time.Sleep(50 * time.Microsecond)
	}
	b.StopTimer()
	cpu.report(b)
	cancel()
	if err := <-errc; err != nil {
		b.Fatal(fmt.Errorf("run: %w", err))
	}
	if s := c.Stats()[0]; s.Errors.Settle > 0 {
		b.Fatalf("%d settle errors", s.Errors.Settle)
	}
}

// selfWrites returns the number of write syscalls this process made (-1
// when unavailable).
func selfWrites() int64 {
	data, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "syscw: "); ok {
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				return -1
			}
			return n
		}
	}
	return -1
}

// procCPU reads a process's user + system CPU time from /proc (-1 when
// unavailable).
func procCPU(pid int) time.Duration {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return -1
	}
	// Fields after the command name (which is in parentheses and may
	// contain spaces): state is field 3, utime 14, stime 15.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return -1
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return -1
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return -1
	}
	const clkTck = 100 // USER_HZ on Linux
	return time.Duration(ut+st) * time.Second / clkTck
}
