package main

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
)

// broker loads a fresh backlog of orders and hands out a Source for it.
type broker interface {
	// Load replaces the backlog with msgs.
	Load(ctx context.Context, msgs []payload) error
	// Source returns a new Source on the backlog and its close function.
	Source(ctx context.Context) (consumer.Source, func(), error)
}

// natsBroker is a JetStream stream ORDERS with a durable consumer.
type natsBroker struct {
	js jetstream.JetStream
}

func (b natsBroker) Load(ctx context.Context, msgs []payload) error {
	_ = b.js.DeleteStream(ctx, "ORDERS") // a fresh backlog each run
	if _, err := b.js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		return err
	}
	futs := make([]jetstream.PubAckFuture, 0, len(msgs))
	for _, p := range msgs {
		m := &nats.Msg{Subject: "orders.new", Data: p.Value, Header: nats.Header{}}
		if !p.Deadline.IsZero() {
			m.Header.Set(expiry.DefaultHeader, expiry.FormatDeadline(p.Deadline))
		}
		f, err := b.js.PublishMsgAsync(m, jetstream.WithStallWait(10*time.Second))
		if err != nil {
			return err
		}
		if futs = append(futs, f); len(futs) == 1000 {
			if err := waitAcks(ctx, futs); err != nil {
				return err
			}
			futs = futs[:0]
		}
	}
	return waitAcks(ctx, futs)
}

// waitAcks waits for the server's acks of async publishes.
func waitAcks(ctx context.Context, futs []jetstream.PubAckFuture) error {
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (b natsBroker) Source(ctx context.Context) (consumer.Source, func(), error) {
	src, err := natsadapter.NewSourceFor(ctx, b.js, "ORDERS", jetstream.ConsumerConfig{Durable: "bulkinsert"},
		natsadapter.SourceOptions{PollWait: 100 * time.Millisecond})
	if err != nil {
		return nil, nil, err
	}
	return src, func() {}, nil
}

// kafkaBroker is a topic of 4 partitions read by a consumer group.
type kafkaBroker struct {
	cl    *kafkatest.Cluster
	topic string
}

func (b *kafkaBroker) Load(ctx context.Context, msgs []payload) error {
	b.topic = kafkatest.UniqueName("orders")
	if err := b.cl.CreateTopic(ctx, b.topic, 4); err != nil {
		return err
	}
	km := make([]kafka.Message, len(msgs))
	for i, p := range msgs {
		km[i] = kafka.Message{Key: []byte(p.ID), Value: p.Value}
		if !p.Deadline.IsZero() {
			km[i].Headers = []kafka.Header{{Key: expiry.DefaultHeader, Value: []byte(expiry.FormatDeadline(p.Deadline))}}
		}
	}
	return b.cl.Produce(ctx, b.topic, km)
}

func (b *kafkaBroker) Source(ctx context.Context) (consumer.Source, func(), error) {
	if b.topic == "" {
		return nil, nil, fmt.Errorf("bulkinsert: nothing loaded")
	}
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{
		Cluster: b.cl.Kafka(), GroupID: kafkatest.UniqueName("bulkinsert"), Topics: []string{b.topic},
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		PollWait: 100 * time.Millisecond, RevokeGrace: time.Second,
	})
	if err != nil {
		return nil, nil, err
	}
	return src, func() { src.Close() }, nil
}
