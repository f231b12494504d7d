// A user of adapters/kafka: a group Source and a dead-letter topic.
package main

import (
	"context"
	"log"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/consumer"
)

func run(ctx context.Context, cluster *kafkaadapter.Cluster) error {
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{Cluster: cluster, GroupID: "orders", Topics: []string{"orders"}})
	if err != nil {
		return err
	}
	defer src.Close()
	sink, err := kafkaadapter.NewDeadLetterSink(cluster, "orders-dlq")
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
	if err := run(context.Background(), &kafkaadapter.Cluster{Brokers: []string{"127.0.0.1:9092"}}); err != nil {
		log.Fatal(err)
	}
}
