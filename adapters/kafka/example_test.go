package kafkaadapter_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
)

// A partition's messages finish out of order; only the offset below which
// everything is settled may be committed.
func ExampleWatermark() {
	w := kafkaadapter.NewWatermark()
	for off := int64(10); off < 15; off++ {
		w.Deliver(off)
	}
	w.Settle(11)
	w.Settle(12)
	p, _ := w.Point()
	fmt.Println("after 11, 12:", p) // 10 is still running
	w.Settle(10)
	p, _ = w.Point()
	fmt.Println("after 10:", p)
	w.Settle(13)
	w.Settle(14)
	p, _ = w.Point()
	fmt.Println("all done:", p)
	// Output:
	// after 11, 12: 10
	// after 10: 13
	// all done: 15
}

// A consumer group under a sluice route. The window numbers go to both the
// route and the Source, which sizes its prefetch from them.
func ExampleNewSource() {
	c, err := kafkatest.New() // kfake in process, or $KAFKA_BROKERS
	if err != nil {
		panic(err)
	}
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic := kafkatest.UniqueName("orders")
	if err := c.CreateTopic(ctx, topic, 2); err != nil {
		panic(err)
	}
	if err := c.Produce(ctx, topic, []kafka.Message{{Value: []byte("a")}, {Value: []byte("b")}, {Value: []byte("c")}}); err != nil {
		panic(err)
	}

	src, err := kafkaadapter.NewSource(kafkaadapter.Config{
		Cluster: c.Kafka(), GroupID: kafkatest.UniqueName("orders"), Topics: []string{topic},
		SessionTimeout: 6 * time.Second,
	})
	if err != nil {
		panic(err)
	}
	defer src.Close()

	var handled atomic.Int64
	runCtx, stop := context.WithCancel(ctx)
	cons, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "orders",
		Source:  src,
		Workers: 4,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			if handled.Add(1) == 3 {
				stop()
			}
			return nil
		},
		Window: consumer.WindowPolicy{Messages: 64, Bytes: 1 << 20}, // the Source sizes its prefetch from it
	})
	if err != nil {
		panic(err)
	}
	if err := cons.Run(runCtx); err != nil {
		panic(err)
	}
	fmt.Println("handled", handled.Load(), "messages")
	// Output: handled 3 messages
}
