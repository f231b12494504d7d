// A user of adapters/franz: an existing kgo group consumer's options as a
// Source, and a dead-letter topic through a kgo producer.
package main

import (
	"context"
	"log"

	"github.com/twmb/franz-go/pkg/kgo"

	franzadapter "github.com/sluice-go/sluice/adapters/franz"
	"github.com/sluice-go/sluice/consumer"
)

func run(ctx context.Context, brokers ...string) error {
	src, err := franzadapter.NewSource(franzadapter.Config{},
		kgo.SeedBrokers(brokers...), kgo.ConsumerGroup("orders"), kgo.ConsumeTopics("orders"))
	if err != nil {
		return err
	}
	defer src.Close()
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers...))
	if err != nil {
		return err
	}
	defer producer.Close()
	sink, err := franzadapter.NewDeadLetterSink(producer, "orders-dlq")
	if err != nil {
		return err
	}
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:       "orders",
		Source:     src,
		Handler:    func(ctx context.Context, m *consumer.Message) error { return nil },
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
	})
	if err != nil {
		return err
	}
	return c.Run(ctx)
}

func main() {
	if err := run(context.Background(), "127.0.0.1:9092"); err != nil {
		log.Fatal(err)
	}
}
