// A user of adapters/sarama: an existing sarama consumer group loop running
// a sluice route.
package main

import (
	"context"
	"log"

	"github.com/IBM/sarama"

	saramaadapter "github.com/sluice-go/sluice/adapters/sarama"
	"github.com/sluice-go/sluice/consumer"
)

func run(ctx context.Context, brokers []string) error {
	client, err := sarama.NewClient(brokers, sarama.NewConfig())
	if err != nil {
		return err
	}
	defer client.Close()
	cg, err := sarama.NewConsumerGroupFromClient("orders", client)
	if err != nil {
		return err
	}
	defer cg.Close()
	h, err := saramaadapter.NewHandler(saramaadapter.Config{GroupID: "orders", Client: client})
	if err != nil {
		return err
	}
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name: "orders", Source: h,
		Handler: func(ctx context.Context, m *consumer.Message) error { return nil },
	})
	if err != nil {
		return err
	}
	go func() {
		for ctx.Err() == nil {
			_ = cg.Consume(ctx, []string{"orders"}, h)
		}
	}()
	return c.Run(ctx)
}

func main() {
	if err := run(context.Background(), []string{"127.0.0.1:9092"}); err != nil {
		log.Fatal(err)
	}
}
