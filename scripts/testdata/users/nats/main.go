// A user of adapters/nats: the README's route on a JetStream durable.
package main

import (
	"context"
	"log"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
)

func run(ctx context.Context, js jetstream.JetStream) error {
	src, err := natsadapter.NewSourceFor(ctx, js, "ORDERS",
		jetstream.ConsumerConfig{Durable: "orders", AckWait: 30 * time.Second}, natsadapter.SourceOptions{})
	if err != nil {
		return err
	}
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		return err
	}
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:       "orders",
		Source:     src,
		Handler:    func(ctx context.Context, m *consumer.Message) error { return nil },
		Workers:    8,
		Window:     consumer.WindowPolicy{Messages: 64, Bytes: 8 << 20},
		Retry:      consumer.RetryPolicy{MaxAttempts: 3},
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
		Overload:   consumer.OverloadPolicy{Criticality: backpressure.Critical},
	})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

func main() {
	nc, err := nats.Connect(nats.DefaultURL)
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	if err := run(context.Background(), js); err != nil {
		log.Fatal(err)
	}
}
