package saramaadapter_test

import (
	"context"
	"fmt"
	"log"

	"github.com/IBM/sarama"

	saramaadapter "github.com/sluice-go/sluice/adapters/sarama"
	"github.com/sluice-go/sluice/consumer"
)

// An existing sarama consumer group loop, with a sluice route in place of
// the application's own ConsumerGroupHandler: the loop keeps its shape.
func ExampleHandler() {
	brokers, group, topics := []string{"localhost:9092"}, "orders-service", []string{"orders"}

	sc := sarama.NewConfig()
	sc.Consumer.Offsets.Initial = sarama.OffsetOldest
	client, err := sarama.NewClient(brokers, sc)
	if err != nil {
		log.Fatal(err)
	}
	defer client.Close()
	cg, err := sarama.NewConsumerGroupFromClient(group, client)
	if err != nil {
		log.Fatal(err)
	}

	// GroupID and Client let a claim read the settled map its commit carries.
	h, err := saramaadapter.NewHandler(saramaadapter.Config{GroupID: group, Client: client})
	if err != nil {
		log.Fatal(err)
	}
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name: "orders", Source: h, Workers: 16,
		Window: consumer.WindowPolicy{Messages: 256, Bytes: 8 << 20},
		Handler: func(ctx context.Context, m *consumer.Message) error {
			fmt.Printf("order %s\n", m.Key)
			return nil
		},
	})
	if err != nil {
		log.Fatal(err)
	}

	ctx, stop := context.WithCancel(context.Background()) // signal.NotifyContext in a service
	defer stop()
	groupCtx, stopGroup := context.WithCancel(context.Background())
	loop := make(chan struct{})
	go func() {
		defer close(loop)
		for groupCtx.Err() == nil { // the application's loop, unchanged
			if err := cg.Consume(groupCtx, topics, h); err != nil {
				log.Print(err)
			}
		}
	}()

	err = c.Run(ctx) // returns once the route settled what it held
	stopGroup()      // then the claims mark their final offsets,
	<-loop
	_ = cg.Close() // and sarama commits them
	_ = h.Close()
	if err != nil {
		log.Print(err)
	}
}
