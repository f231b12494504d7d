package kafkacore

import (
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice/dlq"
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

// IsRetryHeader reports whether k is one of the retry headers.
func IsRetryHeader(k string) bool { return strings.HasPrefix(k, RetryHeaderPrefix) }

// Retry is what a retry copy says about the message it retries, and what
// ParseRetry reads back into a record read from the retry topic.
type Retry struct {
	// Headers are the record's headers (consumer.Headers); ParseRetry
	// removes the retry headers from them (nil when nothing else is left).
	Headers map[string][]string
	// Time is the record's timestamp; ParseRetry sets it to the original's
	// publish time when the record names one.
	Time time.Time
	// Due is when the retry may run: its not-before, clamped (ParseRetry).
	Due          time.Time
	Attempt      int // the attempt this delivery is (1: the first)
	FirstFailure time.Time
	// Origin is where the message was first read: the retry record's own
	// position until ParseRetry finds an origin topic the Source reads.
	Origin dlq.Origin
}

// RetryParse is what ParseRetry found untrustworthy in a retry record.
type RetryParse struct {
	Clamped bool // its not-before was further out than the route's longest delay
	Refused bool // it named an origin topic the Source does not read
}

// ParseRetry reads the retry headers of a retry-topic record into r and
// removes them from r.Headers. A record without them (written by someone
// else) is delivered as it is, due now.
//
// The headers are untrusted (anyone who can write the retry topic, a
// producer with a skewed clock): a not-before later than maxDelay (the
// longest delay the route can ask for) after the record was written is
// clamped to that, so one record cannot hold back its partition's later
// retries. When it was written is the earliest of the record's own
// timestamp (r.Time), seen (when the Source first read it; zero: not
// before) and now: the clamp is anchored there, not at now, so re-reading
// a clamped record does not push it further out; an origin topic that is
// not one of topics (the Source's own) is ignored and the record keeps the
// retry topic as its origin, so nothing read from a retry record decides
// where a dead letter or a replay of it goes.
func ParseRetry(r *Retry, now, seen time.Time, maxDelay time.Duration, topics []string) (res RetryParse) {
	get := func(k string) string {
		if v := r.Headers[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	written := now
	for _, t := range []time.Time{r.Time, seen} {
		if !t.IsZero() && t.Before(written) {
			written = t
		}
	}
	r.Due = now
	if t, err := time.Parse(time.RFC3339Nano, get(HeaderNotBefore)); err == nil {
		r.Due = t
		if latest := written.Add(maxDelay); r.Due.After(latest) {
			r.Due, res.Clamped = latest, true
		}
	}
	if n, err := strconv.Atoi(get(HeaderAttempt)); err == nil && n > 0 {
		r.Attempt = n
	}
	if t, err := time.Parse(time.RFC3339Nano, get(HeaderFirstFailure)); err == nil {
		r.FirstFailure = t
	}
	if t, err := time.Parse(time.RFC3339Nano, get(HeaderOriginPublishedAt)); err == nil {
		r.Time = t
	}
	if topic := get(HeaderOriginTopic); topic != "" && slices.Contains(topics, topic) {
		r.Origin.Topic = topic
		if p, err := strconv.ParseInt(get(HeaderOriginPartition), 10, 32); err == nil && p >= 0 {
			r.Origin.Partition = int32(p)
		}
		if o, err := strconv.ParseInt(get(HeaderOriginOffset), 10, 64); err == nil && o >= 0 {
			r.Origin.Offset = o
		}
	} else if topic != "" {
		res.Refused = true
	}
	for k := range r.Headers {
		if IsRetryHeader(k) {
			delete(r.Headers, k)
		}
	}
	if len(r.Headers) == 0 || len(r.Headers) == 1 && r.Headers[HeaderOrder] != nil {
		r.Headers = nil
	}
	return res
}

// RetryHeaders returns the wire headers of a retry copy of r, to be
// handed out again at notBefore as attempt r.Attempt+1: r's own headers
// in their order (without earlier retry headers), then the retry headers.
// A zero r.FirstFailure is now.
func RetryHeaders[H Header](r *Retry, now, notBefore time.Time, out []H) []H {
	first := r.FirstFailure
	if first.IsZero() {
		first = now
	}
	out = WireHeaders(r.Headers, RetryHeaderPrefix, out)
	add := func(k, v string) { out = append(out, H(header{Key: k, Value: []byte(v)})) }
	add(HeaderNotBefore, notBefore.UTC().Format(time.RFC3339Nano))
	add(HeaderAttempt, strconv.Itoa(r.Attempt+1))
	add(HeaderFirstFailure, first.UTC().Format(time.RFC3339Nano))
	add(HeaderOriginTopic, r.Origin.Topic)
	add(HeaderOriginPartition, strconv.Itoa(int(r.Origin.Partition)))
	add(HeaderOriginOffset, strconv.FormatInt(r.Origin.Offset, 10))
	if !r.Time.IsZero() {
		add(HeaderOriginPublishedAt, r.Time.UTC().Format(time.RFC3339Nano))
	}
	return out
}
