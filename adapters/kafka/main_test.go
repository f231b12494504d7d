package kafkaadapter_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/sluicetest"
)

// cluster is the package's broker: kfake in process, or $KAFKA_BROKERS.
var cluster *kafkatest.Cluster

type withCluster struct{ m *testing.M }

func (w withCluster) Run() int {
	c, err := kafkatest.New()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	cluster = c
	defer c.Close()
	fmt.Fprintf(os.Stderr, "kafka adapter suite on %s %v\n", c.Kind(), c.Brokers)
	if err := warmUp(c); err != nil {
		fmt.Fprintln(os.Stderr, "warm-up:", err)
		return 1
	}
	return w.m.Run()
}

// warmUp joins a group once: the first join on a fresh broker (creating
// the offsets topic, the coordinator) is slow, and no test should pay it.
func warmUp(c *kafkatest.Cluster) error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	topic := kafkatest.UniqueName("warmup")
	if err := c.CreateTopic(ctx, topic, 1); err != nil {
		return err
	}
	if err := c.Produce(ctx, topic, []kafka.Message{{Value: []byte("x")}}); err != nil {
		return err
	}
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{
		Cluster: c.Kafka(), GroupID: kafkatest.UniqueName("warmup"), Topics: []string{topic},
		SessionTimeout: 6 * time.Second,
	})
	if err != nil {
		return err
	}
	defer src.Close()
	if _, err := src.Attach(consumer.RouteLimits{Route: "warmup", Messages: 10, Bytes: 1 << 20}); err != nil {
		return err
	}
	msgs, err := src.Fetch(ctx, 10, 1<<20)
	for len(msgs) == 0 && err == nil {
		msgs, err = src.Fetch(ctx, 10, 1<<20)
	}
	for _, m := range msgs {
		_ = sluicetest.Settle(ctx, m, consumer.Settlement{Op: consumer.SettleAck})
	}
	return err
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(withCluster{m}) }
