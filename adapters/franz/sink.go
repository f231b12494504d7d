package franzadapter

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/kafkacore"
)

// HeaderOrder carries the wire order of a record's headers through sluice's
// map-shaped headers: the Source adds it when the order is not sorted by
// key, and everything this package writes puts the headers back in that
// order and drops it. It is the kafka-go adapter's header too.
const HeaderOrder = kafkacore.HeaderOrder

// HeaderOriginPartitions is a dead letter's envelope header written by the
// Kafka adapters: how many partitions the origin topic had when the letter
// was written.
const HeaderOriginPartitions = kafkacore.HeaderOriginPartitions

// DeadLetterMaxBytes is the most a dead letter takes on the wire; a larger
// letter is fitted by dlq.Letter.Encode.
const DeadLetterMaxBytes = kafkacore.DeadLetterMaxBytes

// DeadLetterSink is a dlq.Sink writing letters to a Kafka topic through a
// kgo client you built (a producer, or the Source's Client): the original
// key and value, the original headers in their original order (duplicates
// kept), then the envelope headers of dlq.Letter and
// HeaderOriginPartitions. Letters are partitioned by the client's
// partitioner (kgo's default hashes keys with murmur2, as a Java producer
// does). Write returns only after the client's acks (kgo's default: all
// in-sync replicas) have the letter; an error means it was not stored,
// and the consumer keeps the original. Letters are the kafka-go adapter's
// format: dlq.Decode reads either.
type DeadLetterSink struct {
	cl    *kgo.Client
	topic string
}

var _ dlq.Sink = (*DeadLetterSink)(nil)

// NewDeadLetterSink returns a sink writing to topic through cl. The sink
// does not close cl.
func NewDeadLetterSink(cl *kgo.Client, topic string) (*DeadLetterSink, error) {
	if cl == nil {
		return nil, fmt.Errorf("%w: franz dead-letter sink: no client", dlq.ErrInvalidOption)
	}
	if topic == "" {
		return nil, fmt.Errorf("%w: franz dead-letter sink: no topic", dlq.ErrInvalidOption)
	}
	return &DeadLetterSink{cl: cl, topic: topic}, nil
}

// Topic returns the dead-letter topic.
func (s *DeadLetterSink) Topic() string { return s.topic }

// Write stores l and waits for the acknowledgement. A letter larger than
// DeadLetterMaxBytes is cut to fit, with a Sluice-Dlq-Truncated marker
// (dlq.Letter.Encode).
func (s *DeadLetterSink) Write(ctx context.Context, l *dlq.Letter) error {
	key, value, env := l.Encode(dlq.Limits{MaxBytes: DeadLetterMaxBytes, HeaderSize: kafkacore.HeaderSize})
	hs := kafkacore.LetterHeaders(env, make([]kgo.RecordHeader, 0, len(env)+4))
	if n := partitions(ctx, s.cl, l.Origin.Topic); n > 0 && l.Origin.Partition >= 0 {
		hs = append(hs, kgo.RecordHeader{Key: HeaderOriginPartitions, Value: []byte(strconv.Itoa(n))})
	}
	rec := &kgo.Record{Topic: s.topic, Key: key, Value: value, Headers: hs}
	if err := s.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("franzadapter: dead letter to %s: %w", s.topic, err)
	}
	return nil
}

// partitions returns how many partitions topic has (0: unknown), from the
// client's cached metadata (at most a minute old).
func partitions(ctx context.Context, cl *kgo.Client, topic string) int {
	if topic == "" {
		return 0
	}
	req := kmsg.NewPtrMetadataRequest()
	req.AllowAutoTopicCreation = false // asking must not create it
	t := kmsg.NewMetadataRequestTopic()
	t.Topic = &topic
	req.Topics = append(req.Topics, t)
	resp, err := cl.RequestCachedMetadata(ctx, req, time.Minute)
	if err != nil {
		return 0
	}
	for _, mt := range resp.Topics {
		if mt.Topic != nil && *mt.Topic == topic && mt.ErrorCode == 0 {
			return len(mt.Partitions)
		}
	}
	return 0
}
