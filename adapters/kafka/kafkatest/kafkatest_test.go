package kafkatest_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestClusterTopicProduceCommitted(t *testing.T) {
	c := kafkatest.Start(t)
	if a, b := kafkatest.UniqueName("x"), kafkatest.UniqueName("x"); a == b {
		t.Fatalf("names clash: %s", a)
	}
	topic := c.Topic(t, "helper", 3)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := c.Produce(ctx, topic, []kafka.Message{{Value: []byte("a")}, {Value: []byte("b")}, {Value: []byte("c")}}); err != nil {
		t.Fatal(err)
	}
	got, err := c.Committed(ctx, kafkatest.UniqueName("nobody"), topic, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0] != -1 {
		t.Fatalf("committed offsets of a group that never committed: %v", got)
	}
	t.Logf("cluster %s at %v", c.Kind(), c.Brokers)
}
