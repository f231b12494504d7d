package brokerstory_test

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/otelsluice/internal/storytest"
)

// The story on kfake (or $KAFKA_BROKERS): the first failure goes to the
// retry topic as a copy of the record (its traceparent with it), the
// second to the dead-letter topic, and the replay writes back to the
// origin topic.
func TestStoryKafka(t *testing.T) {
	cluster := kafkatest.Start(t)
	topic := cluster.Topic(t, "orders", 1)
	retryTopic := cluster.Topic(t, "orders-retry", 1)
	dlqTopic := cluster.Topic(t, "orders-dlq", 1)
	group := kafkatest.UniqueName("orders")
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{
		Cluster: cluster.Kafka(), GroupID: group, Topics: []string{topic},
		RetryTopic: retryTopic, LocalRetryMaxDelay: time.Nanosecond, // every retry goes through the retry topic
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 250 * time.Millisecond, CommitInterval: 100 * time.Millisecond,
		FetchMaxWait: 100 * time.Millisecond, PollWait: 200 * time.Millisecond, RevokeGrace: 500 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	sink, err := kafkaadapter.NewDeadLetterSink(cluster.Kafka(), dlqTopic)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	target, err := kafkaadapter.NewReplayTarget(cluster.Kafka(), kafkaadapter.ReplayTargetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	storytest.Run(t, storytest.NewTracing(t), storytest.Broker{
		System: "kafka",
		Topic:  topic,
		Source: src,
		Sink:   sink,
		Publish: func(ctx context.Context, h map[string][]string, v []byte) error {
			var hs []kafka.Header
			for k, vs := range h {
				for _, s := range vs {
					hs = append(hs, kafka.Header{Key: k, Value: []byte(s)})
				}
			}
			return cluster.Produce(ctx, topic, []kafka.Message{{Value: v, Headers: hs}})
		},
		Letters: func(ctx context.Context) (dlq.Source, func()) {
			ls, err := kafkaadapter.NewLetterSource(ctx, kafkaadapter.LetterSourceConfig{Cluster: cluster.Kafka(), Topic: dlqTopic,
				Group: kafkatest.UniqueName("replay")})
			if err != nil {
				t.Fatal(err)
			}
			return ls, func() { _ = ls.Close(context.Background()) }
		},
		Target: target,
		Where: func(t *testing.T, s sdktrace.ReadOnlySpan) {
			// Both attempts name the original record, the second one read
			// from the retry topic.
			storytest.WantAttrs(t, s, map[attribute.Key]string{"messaging.destination.partition.id": "0",
				"messaging.kafka.offset": "0", "messaging.consumer.group.name": group})
		},
	})
	if st := src.Stats(); st.RetryWrites == 0 {
		t.Errorf("no retry went through the retry topic: %+v", st)
	}
}
