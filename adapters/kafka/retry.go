package kafkaadapter

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/internal/kafkacore"
)

// Headers of a retry-topic record (kafkacore's, shared by sluice's Kafka
// adapters). The original key, value and headers are kept; these say when
// and what it retries.
const (
	RetryHeaderPrefix       = kafkacore.RetryHeaderPrefix
	HeaderNotBefore         = kafkacore.HeaderNotBefore // RFC 3339, UTC
	HeaderAttempt           = kafkacore.HeaderAttempt   // the attempt the retry is
	HeaderFirstFailure      = kafkacore.HeaderFirstFailure
	HeaderOriginTopic       = kafkacore.HeaderOriginTopic
	HeaderOriginPartition   = kafkacore.HeaderOriginPartition
	HeaderOriginOffset      = kafkacore.HeaderOriginOffset
	HeaderOriginPublishedAt = kafkacore.HeaderOriginPublishedAt
)

// newWriter returns a synchronous writer on the cluster's transport that
// waits for all in-sync replicas and partitions by key with murmur2, the
// default of the Java client (and librdkafka's murmur2_random): a key lands
// where a Java producer would put it. topic "" means each message names its
// own.
func newWriter(c *Cluster, rt kafka.RoundTripper, topic string) *kafka.Writer {
	return &kafka.Writer{
		Addr:         c.addr(),
		Topic:        topic,
		Balancer:     &kafka.Murmur2Balancer{},
		RequiredAcks: kafka.RequireAll,
		BatchTimeout: time.Millisecond,
		BatchSize:    100,
		MaxAttempts:  3,
		WriteTimeout: 10 * time.Second,
		Transport:    rt,
	}
}

// writeRetry writes r to the retry topic to be handed out again at
// notBefore as the next attempt, and returns once all replicas have it.
func (s *feed) writeRetry(ctx context.Context, r *record, now, notBefore time.Time) error {
	rt := r.retryView()
	hs := kafkacore.RetryHeaders(&rt, now, notBefore, []kafka.Header(nil))
	if err := s.retryW.WriteMessages(ctx, kafka.Message{Key: r.key, Value: r.value, Headers: hs}); err != nil {
		return fmt.Errorf("kafka source: retry topic %s: %w", s.cfg.RetryTopic, err)
	}
	return nil
}

func isRetryHeader(k string) bool { return kafkacore.IsRetryHeader(k) }

// retryParse is what parseRetry found untrustworthy in a retry record.
type retryParse struct {
	clamped bool // its not-before was further out than the route's longest delay
	refused bool // it named an origin topic the Source does not read
}

// retryView is r as the core's retry helpers see it.
func (r *record) retryView() kafkacore.Retry {
	return kafkacore.Retry{Headers: r.headers, Time: r.time, Due: r.due, Attempt: r.attempt,
		FirstFailure: r.firstFailure, Origin: r.origin}
}

// parseRetry reads the retry headers of a retry-topic record into r and
// removes them from the headers the handler sees (kafkacore.ParseRetry:
// the not-before is clamped to maxDelay after the record was written,
// and an origin topic not among topics is ignored).
func parseRetry(r *record, now, seen time.Time, maxDelay time.Duration, topics []string) retryParse {
	rt := r.retryView()
	res := kafkacore.ParseRetry(&rt, now, seen, maxDelay, topics)
	r.headers, r.time, r.due, r.attempt, r.firstFailure, r.origin = rt.Headers, rt.Time, rt.Due, rt.Attempt, rt.FirstFailure, rt.Origin
	return retryParse{clamped: res.Clamped, refused: res.Refused}
}
