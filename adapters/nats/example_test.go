package natsadapter_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/consumer"
)

func Example() {
	dir, _ := os.MkdirTemp("", "sluice-example")
	defer os.RemoveAll(dir)
	srv, err := natstest.Run(dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	for i := range 3 {
		js.Publish(ctx, "orders.new", []byte(fmt.Sprint("order-", i)))
	}

	const window = 16
	src, err := natsadapter.NewSourceFor(ctx, js, "ORDERS", jetstream.ConsumerConfig{Durable: "orders"}, natsadapter.SourceOptions{PollWait: 100 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return
	}
	sink, _ := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	done := make(chan struct{}, 3)
	c, _ := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "orders",
		Source:  src,
		Workers: 1,
		Handler: func(_ context.Context, m *consumer.Message) error {
			fmt.Println(m.Topic, string(m.Value), "attempt", m.Attempt)
			done <- struct{}{}
			return nil
		},
		Window:     consumer.WindowPolicy{Messages: window, Bytes: 1 << 20},
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
	})
	runCtx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	for range 3 {
		<-done
	}
	stop()
	fmt.Println("run:", <-errc)
	// Output:
	// orders.new order-0 attempt 1
	// orders.new order-1 attempt 1
	// orders.new order-2 attempt 1
	// run: <nil>
}

// Wrapping a pull consumer you already run: sluice takes over its pulls and
// settlement; the consumer's configuration stays yours.
func ExampleNewSource() {
	dir, _ := os.MkdirTemp("", "sluice-example")
	defer os.RemoveAll(dir)
	srv, err := natstest.Run(dir)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	js.CreateStream(ctx, jetstream.StreamConfig{Name: "EVENTS", Subjects: []string{"events.>"}})
	js.Publish(ctx, "events.signup", []byte("ada"))

	// Yours, created elsewhere.
	cons, _ := js.CreateOrUpdateConsumer(ctx, "EVENTS", jetstream.ConsumerConfig{
		Durable: "mailer", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 100, AckWait: time.Minute,
	})

	src, err := natsadapter.NewSource(js, cons, natsadapter.SourceOptions{PollWait: 100 * time.Millisecond})
	if err != nil {
		fmt.Println(err)
		return
	}
	done := make(chan struct{})
	c, _ := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "mailer",
		Source:  src,
		Workers: 2,
		Handler: func(_ context.Context, m *consumer.Message) error {
			fmt.Printf("%s %s (stream %s, seq %d)\n", m.Topic, m.Value, m.Origin.Stream, m.Origin.Sequence)
			close(done)
			return nil
		},
		Window: consumer.WindowPolicy{Messages: 32, Bytes: 1 << 20},
	})
	runCtx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	<-done
	stop()
	fmt.Println("run:", <-errc)
	// Output:
	// events.signup ada (stream EVENTS, seq 1)
	// run: <nil>
}

// A durable with MaxDeliver: the route dead-letters the last delivery
// instead of nak'ing it away, and the Source, by default, dead-letters into
// the route's sink what the server gave up on while no process could settle
// it (a stop with the store down, a kill): see "Last deliveries" in the
// package doc. SourceOptions.Recover names another sink; NoRecover turns
// it off.
func ExampleSourceOptions_recover() {
	ctx := context.Background()
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		fmt.Println(err)
		return
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	src, err := natsadapter.NewSourceFor(ctx, js, "ORDERS",
		jetstream.ConsumerConfig{Durable: "orders", MaxDeliver: 5},
		natsadapter.SourceOptions{})
	if err != nil {
		fmt.Println(err)
		return
	}
	defer src.Close()
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:       "orders",
		Source:     src,
		Handler:    func(context.Context, *consumer.Message) error { return nil },
		Retry:      consumer.RetryPolicy{MaxAttempts: 5},
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println(c.Run(ctx))
}
