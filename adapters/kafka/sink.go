package kafkaadapter

import (
	"context"
	"fmt"
	"strconv"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/kafkacore"
)

// DeadLetterSink is a dlq.Sink writing letters to a Kafka topic: the
// original key and value, the original headers in their original order
// (duplicates kept), then the envelope headers of dlq.Letter (error, class,
// attempts, first and last failure, origin topic, partition and offset,
// group, route). Letters are partitioned by key with murmur2, like a Java
// producer. Write returns only after all in-sync replicas have the letter
// (RequiredAcks all); an error means it was not stored, and the consumer
// keeps the original.
//
// A retried Write of the same letter can store it twice: Kafka has no
// per-message deduplication outside transactions. dlq.Decode reads a
// letter back.
type DeadLetterSink struct {
	w       *kafka.Writer
	cluster *Cluster
	client  *kafka.Client
}

var _ dlq.Sink = (*DeadLetterSink)(nil)

// NewDeadLetterSink returns a sink writing to topic on c's shared
// transport. The topic must exist unless the brokers create topics on
// first use.
func NewDeadLetterSink(c *Cluster, topic string) (*DeadLetterSink, error) {
	if err := c.validate("dead-letter sink"); err != nil {
		return nil, err
	}
	if topic == "" {
		return nil, fmt.Errorf("%w: kafka dead-letter sink: no topic", dlq.ErrInvalidOption)
	}
	rt := c.acquire(topic)
	return &DeadLetterSink{w: newWriter(c, rt, topic), cluster: c, client: c.client(rt)}, nil
}

// Topic returns the dead-letter topic.
func (s *DeadLetterSink) Topic() string { return s.w.Topic }

// Write stores l and waits for the acknowledgement of all replicas. A
// letter larger than SinkMaxBytes (a record can be larger in its origin
// topic than the dead-letter topic takes) is cut to fit, with a
// Sluice-Dlq-Truncated marker (dlq.Letter.Encode).
func (s *DeadLetterSink) Write(ctx context.Context, l *dlq.Letter) error {
	key, value, env := l.Encode(dlq.Limits{MaxBytes: DeadLetterMaxBytes, HeaderSize: kafkaHeaderSize})
	hs := letterHeaders(env)
	if n := s.partitions(ctx, l.Origin.Topic); n > 0 && l.Origin.Partition >= 0 {
		hs = append(hs, kafka.Header{Key: HeaderOriginPartitions, Value: []byte(strconv.Itoa(n))})
	}
	msg := kafka.Message{Key: key, Value: value, Headers: hs}
	if err := s.w.WriteMessages(ctx, msg); err != nil {
		return fmt.Errorf("kafkaadapter: dead letter to %s: %w", s.w.Topic, err)
	}
	return nil
}

// DeadLetterMaxBytes is the most a dead letter takes on the wire (headers,
// key and value), below the 1 MiB a topic accepts by default
// (max.message.bytes) less the batch overhead. A larger letter is fitted
// by dlq.Letter.Encode: original headers packed into the value, or cut
// with a Sluice-Dlq-Truncated marker.
const DeadLetterMaxBytes = kafkacore.DeadLetterMaxBytes

// kafkaHeaderSize is the size of h in a Kafka record (kafkacore.HeaderSize).
func kafkaHeaderSize(h map[string][]string) int { return kafkacore.HeaderSize(h) }

// partitions returns how many partitions topic has (0: unknown), from the
// shared transport's metadata cache, which learns the topic on first use.
func (s *DeadLetterSink) partitions(ctx context.Context, topic string) int {
	if topic == "" {
		return 0
	}
	for try := 0; try < 2; try++ {
		md, err := s.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err != nil {
			return 0
		}
		for _, t := range md.Topics {
			if t.Name == topic && t.Error == nil && len(t.Partitions) > 0 {
				return len(t.Partitions)
			}
		}
		s.cluster.use(topic)
	}
	return 0
}

// letterHeaders orders a letter's headers for the wire: the original
// headers first, in their original order, then the envelope by name.
func letterHeaders(env map[string][]string) []kafka.Header {
	return kafkacore.LetterHeaders(env, make([]kafka.Header, 0, len(env)+4))
}

// Close flushes and closes the writer; the last user of the Cluster closes
// its connections.
func (s *DeadLetterSink) Close() error {
	err := s.w.Close()
	s.cluster.release()
	return err
}
