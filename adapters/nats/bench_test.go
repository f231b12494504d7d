package natsadapter_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/natstest"
)

// The two benchmarks below share one shape: each iteration of b.N is one
// 128 B message published before the timer starts, then consumed with a
// no-op handler and acked. Compare them side by side in one run:
//
//	go test ./adapters/nats -run '^$' -bench 'Consume' -benchmem -count 6
//
// Raw uses jetstream Consume + Ack (fire-and-forget). Sluice uses a route
// with AckAsync (the same plain Ack) and, separately, the default DoubleAck.

func benchStream(b *testing.B) (context.Context, jetstream.JetStream, jetstream.Stream) {
	b.Helper()
	js := natstest.JetStream(b)
	ctx := context.Background()
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}, Storage: jetstream.MemoryStorage})
	if err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 128)
	for i := 0; i < b.N; i += 512 {
		var futs []jetstream.PubAckFuture
		for j := i; j < min(i+512, b.N); j++ {
			f, err := js.PublishAsync("bench.x", payload)
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
	return ctx, js, st
}

func BenchmarkConsumeRaw(b *testing.B) {
	ctx, _, st := benchStream(b)
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 256})
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	done := make(chan struct{})
	b.ReportAllocs()
	b.ResetTimer()
	cc, err := cons.Consume(func(m jetstream.Msg) {
		_ = m.Ack()
		if n.Add(1) == int64(b.N) {
			close(done)
		}
	}, jetstream.PullMaxMessages(256))
	if err != nil {
		b.Fatal(err)
	}
	<-done
	b.StopTimer()
	cc.Stop()
	<-cc.Closed()
}

func benchSluice(b *testing.B, async bool) {
	ctx, js, _ := benchStream(b)
	src, err := natsadapter.NewSourceFor(ctx, js, "BENCH", jetstream.ConsumerConfig{Durable: "sluice"}, 256,
		natsadapter.SourceOptions{AckAsync: async})
	if err != nil {
		b.Fatal(err)
	}
	var n atomic.Int64
	done := make(chan struct{})
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name: "bench", Source: src, Workers: 4, MaxInFlight: 256, MaxInFlightBytes: 8 << 20,
		Handler: func(context.Context, *consumer.Message) error {
			if n.Add(1) == int64(b.N) {
				close(done)
			}
			return nil
		},
	})
	if err != nil {
		b.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	b.ReportAllocs()
	b.ResetTimer()
	go func() { errc <- c.Run(runCtx) }()
	<-done
	// Wait for the settlements, which follow the handler.
	for c.Stats()[0].Settled[consumer.OutcomeSucceeded] < uint64(b.N) {
		time.Sleep(100 * time.Microsecond)
	}
	b.StopTimer()
	cancel()
	if err := <-errc; err != nil {
		b.Fatal(fmt.Errorf("run: %w", err))
	}
}

func BenchmarkConsumeSluiceAsyncAck(b *testing.B)  { benchSluice(b, true) }
func BenchmarkConsumeSluiceDoubleAck(b *testing.B) { benchSluice(b, false) }
