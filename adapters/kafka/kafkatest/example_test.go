package kafkatest_test

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
)

// A Kafka cluster for a test or an example: an in-process kfake broker, or
// the real brokers named in $KAFKA_BROKERS, so one suite runs on both. In a
// test, Start and Topic do the same and clean up with the test.
func ExampleNew() {
	cluster, err := kafkatest.New()
	if err != nil {
		panic(err)
	}
	defer cluster.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic := kafkatest.UniqueName("orders")
	if err := cluster.CreateTopic(ctx, topic, 3); err != nil {
		panic(err)
	}
	msgs := []kafka.Message{{Key: []byte("a"), Value: []byte("1")}, {Key: []byte("b"), Value: []byte("2")}}
	if err := cluster.Produce(ctx, topic, msgs); err != nil {
		panic(err)
	}
	fmt.Println("produced:", len(msgs))
	// Output: produced: 2
}
