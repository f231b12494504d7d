package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
)

// errUnsupported is returned for a queue bound the broker cannot enforce;
// the mode then reports that row as not available.
var errUnsupported = errors.New("overloadlab: not supported by this broker")

// kafkaBroker runs the lab on Kafka: an in-process kfake cluster, or the
// brokers in $KAFKA_BROKERS (for example the docker-compose Kafka at
// 127.0.0.1:9092). Each trial gets its own one-partition topic; sluice
// reads it through adapters/kafka (a consumer group), the unprotected
// consumer through a plain kafka-go Reader into the unbounded FIFO. Kafka
// topics have no message-count bound, so the broker-limit rows of the drop
// and backpressure modes are not available.
type kafkaBroker struct {
	brokers []string
	kind    string
	client  *kafka.Client
	stop    func()
	payload int
}

// newKafkaBroker uses $KAFKA_BROKERS, or starts kfake: in a child process
// of the lab (so the heap figures exclude the broker) unless inProcess.
func newKafkaBroker(inProcess bool, payload int) (*kafkaBroker, error) {
	b := &kafkaBroker{kind: "kafka", payload: payload, stop: func() {}}
	if env := strings.TrimSpace(os.Getenv(kafkatest.EnvBrokers)); env != "" {
		b.brokers = strings.Split(env, ",")
	} else if inProcess {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(0))
		if err != nil {
			return nil, err
		}
		b.kind, b.brokers, b.stop = "kfake", c.ListenAddrs(), c.Close
	} else {
		line, stop, err := startChild(kfakeEnv + "=1")
		if err != nil {
			return nil, err
		}
		b.kind, b.brokers, b.stop = "kfake", strings.Split(line, ","), stop
	}
	b.client = &kafka.Client{Addr: kafka.TCP(b.brokers...), Transport: &kafka.Transport{}, Timeout: 10 * time.Second}
	return b, nil
}

func (b *kafkaBroker) name() string { return b.kind }

func (b *kafkaBroker) close() {
	b.client.Transport.(*kafka.Transport).CloseIdleConnections()
	b.stop()
}

// createTopic creates a one-partition topic and waits for its leader.
func (b *kafkaBroker) createTopic(ctx context.Context, topic string) error {
	res, err := b.client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: 1, ReplicationFactor: 1,
	}}})
	if err != nil {
		return err
	}
	if err := res.Errors[topic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return err
	}
	for {
		md, err := b.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == 1 &&
			md.Topics[0].Partitions[0].Leader.Host != "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("overloadlab: topic %s not ready: %w", topic, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func (b *kafkaBroker) queue(ctx context.Context, name string, lim limits) (queue, error) {
	if lim.maxMsgs > 0 {
		return nil, fmt.Errorf("%w: Kafka topics have no message-count limit", errUnsupported)
	}
	topic := kafkatest.UniqueName("lab-" + name)
	if err := b.createTopic(ctx, topic); err != nil {
		return nil, err
	}
	q := &kafkaQueue{b: b, topic: topic}
	q.w = &kafka.Writer{
		Addr: kafka.TCP(b.brokers...), Topic: topic, Balancer: &kafka.RoundRobin{},
		RequiredAcks: kafka.RequireOne, Async: true,
		BatchSize: 1000, BatchTimeout: time.Millisecond, Transport: &kafka.Transport{},
		Completion: func(msgs []kafka.Message, err error) {
			if err != nil {
				q.rejected.Add(int64(len(msgs)))
			}
			q.pending.Add(-int64(len(msgs)))
		},
	}
	return q, nil
}

type kafkaQueue struct {
	b         *kafkaBroker
	topic     string
	w         *kafka.Writer
	pending   atomic.Int64
	rejected  atomic.Int64
	published atomic.Int64
	settled   atomic.Int64 // by the raw consumer
	src       *kafkaadapter.Source
}

func (q *kafkaQueue) msg(m labMsg) kafka.Message {
	var hs []kafka.Header
	for k, vs := range m.headers() {
		for _, v := range vs {
			hs = append(hs, kafka.Header{Key: k, Value: []byte(v)})
		}
	}
	return kafka.Message{Value: m.encode(q.b.payload), Headers: hs}
}

func (q *kafkaQueue) publish(ctx context.Context, m labMsg) error {
	q.pending.Add(1)
	q.published.Add(1)
	if err := q.w.WriteMessages(ctx, q.msg(m)); err != nil {
		q.pending.Add(-1)
		q.published.Add(-1)
		return err
	}
	return nil
}

func (q *kafkaQueue) put(context.Context, labMsg) error {
	return fmt.Errorf("%w: Kafka cannot refuse a write to a full topic", errUnsupported)
}

func (q *kafkaQueue) flush(ctx context.Context) int {
	for q.pending.Load() > 0 && ctx.Err() == nil {
		time.Sleep(time.Millisecond)
	}
	n := q.rejected.Swap(0)
	q.published.Add(-n)
	return int(n)
}

func (q *kafkaQueue) source(ctx context.Context, o srcOpts) (consumer.Source, error) {
	cfg := kafkaadapter.Config{
		Cluster: &kafkaadapter.Cluster{Brokers: q.b.brokers}, GroupID: q.topic + "-sluice", Topics: []string{q.topic},
	}
	if o.tuned {
		cfg.FetchMaxWait, cfg.PollWait, cfg.CommitInterval = 20*time.Millisecond, 100*time.Millisecond, 200*time.Millisecond
		cfg.SessionTimeout, cfg.HeartbeatInterval = 6*time.Second, 500*time.Millisecond
	}
	src, err := kafkaadapter.NewSource(cfg)
	if err != nil {
		return nil, err
	}
	q.src = src
	return src, nil
}

// ready waits for the Source's partition assignment (it joins its group
// when its route attaches it), so a trial's clock does not run while the
// group forms.
func (q *kafkaQueue) ready(ctx context.Context) error {
	if q.src == nil {
		return nil
	}
	return q.src.Ready(ctx)
}

func (q *kafkaQueue) raw(ctx context.Context, deliver func(rawDelivery)) (func(), error) {
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: q.b.brokers, Topic: q.topic, Partition: 0,
		MinBytes: 1, MaxBytes: 10 << 20, MaxWait: 20 * time.Millisecond,
	})
	if err := r.SetOffset(kafka.FirstOffset); err != nil {
		r.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := r.ReadMessage(ctx)
			if err != nil {
				return
			}
			lm, ok := decode(m.Value)
			if !ok {
				continue
			}
			deliver(rawDelivery{msg: lm, ack: func() { q.settled.Add(1) }})
		}
	}()
	return func() { cancel(); <-done; _ = r.Close() }, nil
}

func (q *kafkaQueue) depth(context.Context) (int, error) {
	settled := q.settled.Load()
	if q.src != nil {
		settled += q.src.Stats().Settled
	}
	return int(q.published.Load() - settled), nil
}

func (q *kafkaQueue) close() {
	_ = q.w.Close()
	if t, ok := q.w.Transport.(*kafka.Transport); ok {
		t.CloseIdleConnections()
	}
	// A long run (the grid) makes hundreds of topics: drop each when its
	// trial is done, so the broker does not carry them all.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, _ = q.b.client.DeleteTopics(ctx, &kafka.DeleteTopicsRequest{Topics: []string{q.topic}})
}
