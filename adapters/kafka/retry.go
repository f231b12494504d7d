package kafkaadapter

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// Headers of a retry-topic record. The original key, value and headers are
// kept; these say when and what it retries.
const (
	RetryHeaderPrefix       = "Sluice-Retry-"
	HeaderNotBefore         = "Sluice-Retry-Not-Before" // RFC 3339, UTC
	HeaderAttempt           = "Sluice-Retry-Attempt"    // the attempt the retry is
	HeaderFirstFailure      = "Sluice-Retry-First-Failure"
	HeaderOriginTopic       = "Sluice-Retry-Origin-Topic"
	HeaderOriginPartition   = "Sluice-Retry-Origin-Partition"
	HeaderOriginOffset      = "Sluice-Retry-Origin-Offset"
	HeaderOriginPublishedAt = "Sluice-Retry-Published-At"
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
	first := r.firstFailure
	if first.IsZero() {
		first = now
	}
	hs := wireHeaders(r.headers, RetryHeaderPrefix, nil)
	add := func(k, v string) { hs = append(hs, kafka.Header{Key: k, Value: []byte(v)}) }
	add(HeaderNotBefore, notBefore.UTC().Format(time.RFC3339Nano))
	add(HeaderAttempt, strconv.Itoa(r.attempt+1))
	add(HeaderFirstFailure, first.UTC().Format(time.RFC3339Nano))
	add(HeaderOriginTopic, r.origin.Topic)
	add(HeaderOriginPartition, strconv.Itoa(int(r.origin.Partition)))
	add(HeaderOriginOffset, strconv.FormatInt(r.origin.Offset, 10))
	if !r.time.IsZero() {
		add(HeaderOriginPublishedAt, r.time.UTC().Format(time.RFC3339Nano))
	}
	if err := s.retryW.WriteMessages(ctx, kafka.Message{Key: r.key, Value: r.value, Headers: hs}); err != nil {
		return fmt.Errorf("kafka source: retry topic %s: %w", s.cfg.RetryTopic, err)
	}
	return nil
}

func isRetryHeader(k string) bool { return strings.HasPrefix(k, RetryHeaderPrefix) }

// retryParse is what parseRetry found untrustworthy in a retry record.
type retryParse struct {
	clamped bool // its not-before was further out than the route's longest delay
	refused bool // it named an origin topic the Source does not read
}

// parseRetry reads the retry headers of a retry-topic record into r and
// removes them from the headers the handler sees. A record without them
// (written by someone else) is delivered as it is, due now.
//
// The headers are untrusted (anyone who can write the retry topic, a
// producer with a skewed clock): a not-before later than maxDelay (the
// longest delay the route can ask for) after the record was written is
// clamped to that, so one record cannot hold back its partition's later
// retries. When it was written is the earliest of the record's own
// timestamp, seen (when the Source first read it; zero: not before) and
// now: the clamp is anchored there, not at now, so re-reading a clamped
// record does not push it further out; an origin topic
// that is not one of topics (the Source's own) is ignored and the record
// keeps the retry topic as its origin, so nothing read from a retry
// record decides where a dead letter or a replay of it goes.
func parseRetry(r *record, now, seen time.Time, maxDelay time.Duration, topics []string) (res retryParse) {
	get := func(k string) string {
		if v := r.headers[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	written := now
	for _, t := range []time.Time{r.time, seen} {
		if !t.IsZero() && t.Before(written) {
			written = t
		}
	}
	r.due = now
	if t, err := time.Parse(time.RFC3339Nano, get(HeaderNotBefore)); err == nil {
		r.due = t
		if latest := written.Add(maxDelay); r.due.After(latest) {
			r.due, res.clamped = latest, true
		}
	}
	if n, err := strconv.Atoi(get(HeaderAttempt)); err == nil && n > 0 {
		r.attempt = n
	}
	if t, err := time.Parse(time.RFC3339Nano, get(HeaderFirstFailure)); err == nil {
		r.firstFailure = t
	}
	if t, err := time.Parse(time.RFC3339Nano, get(HeaderOriginPublishedAt)); err == nil {
		r.time = t
	}
	if topic := get(HeaderOriginTopic); topic != "" && slices.Contains(topics, topic) {
		r.origin.Topic = topic
		if p, err := strconv.ParseInt(get(HeaderOriginPartition), 10, 32); err == nil && p >= 0 {
			r.origin.Partition = int32(p)
		}
		if o, err := strconv.ParseInt(get(HeaderOriginOffset), 10, 64); err == nil && o >= 0 {
			r.origin.Offset = o
		}
	} else if topic != "" {
		res.refused = true
	}
	for k := range r.headers {
		if isRetryHeader(k) {
			delete(r.headers, k)
		}
	}
	if len(r.headers) == 0 || len(r.headers) == 1 && r.headers[HeaderOrder] != nil {
		r.headers = nil
	}
	return res
}
