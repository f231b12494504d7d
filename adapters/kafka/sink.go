package kafkaadapter

import (
	"context"
	"fmt"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
)

// DeadLetterSink is a dlq.Sink writing letters to a Kafka topic: the
// original key and value, the original headers, and the envelope headers of
// dlq.Letter (error, class, attempts, first and last failure, origin topic,
// partition and offset, group, route). Write returns only after all in-sync
// replicas have the letter (RequiredAcks all); an error means it was not
// stored, and the consumer keeps the original.
//
// A retried Write of the same letter can store it twice: Kafka has no
// per-message deduplication outside transactions. dlq.Decode reads a
// letter back.
type DeadLetterSink struct {
	w         *kafka.Writer
	transport *kafka.Transport
}

var _ dlq.Sink = (*DeadLetterSink)(nil)

// NewDeadLetterSink returns a sink writing to topic on brokers, with a
// Transport of its own (closed by Close). The topic must exist unless the
// brokers create topics on first use.
func NewDeadLetterSink(brokers []string, topic string) (*DeadLetterSink, error) {
	if len(brokers) == 0 || topic == "" {
		return nil, fmt.Errorf("%w: dead-letter sink needs brokers and a topic", consumer.ErrInvalidOption)
	}
	t := &kafka.Transport{}
	return &DeadLetterSink{w: newWriter(brokers, topic, t), transport: t}, nil
}

// Topic returns the dead-letter topic.
func (s *DeadLetterSink) Topic() string { return s.w.Topic }

// Write stores l and waits for the acknowledgement of all replicas.
func (s *DeadLetterSink) Write(ctx context.Context, l *dlq.Letter) error {
	msg := kafka.Message{Key: l.Key, Value: l.Value, Headers: kafkaHeaders(l.EnvelopeHeaders(), "")}
	if err := s.w.WriteMessages(ctx, msg); err != nil {
		return fmt.Errorf("kafkaadapter: dead letter to %s: %w", s.w.Topic, err)
	}
	return nil
}

// Close flushes and closes the writer and its connections.
func (s *DeadLetterSink) Close() error {
	err := s.w.Close()
	s.transport.CloseIdleConnections()
	return err
}
