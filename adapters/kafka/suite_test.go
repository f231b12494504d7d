package kafkaadapter_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/adaptertest"
)

// TestAdapterSuite runs the cases every adapter passes, on kfake or on
// the broker in $KAFKA_BROKERS.
func TestAdapterSuite(t *testing.T) {
	adaptertest.Run(t, kafkaBroker{}, adaptertest.Features{RedeliveryDelay: time.Second})
}

type kafkaBroker struct{}

func (kafkaBroker) NewTopic(t *testing.T, name string) adaptertest.Topic {
	return &kafkaTopic{topic: cluster.Topic(t, name, 4)}
}

type kafkaTopic struct{ topic string }

func (tp *kafkaTopic) Publish(t *testing.T, msgs []adaptertest.Msg) {
	t.Helper()
	out := make([]kafka.Message, len(msgs))
	for i, m := range msgs {
		hs := []kafka.Header{{Key: "Id", Value: []byte(m.ID)}}
		for k, v := range m.Headers {
			hs = append(hs, kafka.Header{Key: k, Value: []byte(v)})
		}
		key := m.Key
		if key == "" {
			key = m.ID
		}
		out[i] = kafka.Message{Key: []byte(key), Value: m.Value, Headers: hs}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Partitioned by key, as Kafka's producers do, so a key's messages
	// share a partition, in publish order.
	w := cluster.Writer(tp.topic)
	w.Balancer = &kafka.Murmur2Balancer{}
	defer kafkatest.CloseWriter(w)
	for len(out) > 0 {
		k := min(len(out), 1000)
		if err := w.WriteMessages(ctx, out[:k]...); err != nil {
			t.Fatal(err)
		}
		out = out[k:]
	}
}

func (tp *kafkaTopic) Source(t *testing.T, group string) consumer.Source {
	t.Helper()
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{
		Cluster: cluster.Kafka(), GroupID: tp.topic + "-" + group, Topics: []string{tp.topic},
		SessionTimeout: 6 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	return src
}
