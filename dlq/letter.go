package dlq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Version is written into every dead letter.
const Version = "0.1.0"

// Header names of the envelope. See the package doc.
const (
	HeaderPrefix          = "Sluice-Dlq-"
	HeaderError           = "Sluice-Dlq-Error"
	HeaderClass           = "Sluice-Dlq-Class"
	HeaderAttempts        = "Sluice-Dlq-Attempts"
	HeaderFirstFailure    = "Sluice-Dlq-First-Failure"
	HeaderLastFailure     = "Sluice-Dlq-Last-Failure"
	HeaderOriginTopic     = "Sluice-Dlq-Origin-Topic"
	HeaderOriginStream    = "Sluice-Dlq-Origin-Stream"
	HeaderOriginPartition = "Sluice-Dlq-Origin-Partition"
	HeaderOriginOffset    = "Sluice-Dlq-Origin-Offset"
	HeaderOriginSequence  = "Sluice-Dlq-Origin-Sequence"
	HeaderGroup           = "Sluice-Dlq-Group"
	HeaderRoute           = "Sluice-Dlq-Route"
	HeaderVersion         = "Sluice-Dlq-Version"
	HeaderReplays         = "Sluice-Dlq-Replays"
	// HeaderParkReason says why a Replayer parked the letter instead of
	// republishing it (loop guard, destination refused).
	HeaderParkReason = "Sluice-Dlq-Park-Reason"
	// HeaderTruncated says what was cut to make the letter fit its store
	// (see Letter.Encode); a truncated letter is never replayed.
	HeaderTruncated = "Sluice-Dlq-Truncated"
	// HeaderPackedHeaders, when present, says the original headers did not
	// fit the broker's header limit and take the first N bytes of the
	// stored value instead (see Letter.Encode); Decode moves them back.
	HeaderPackedHeaders = "Sluice-Dlq-Packed-Headers"
	// HeaderTracePrefix starts the headers that carry Letter.Trace: the
	// trace context of the processing that dead-lettered the message
	// ("Sluice-Dlq-Trace-traceparent" for W3C Trace Context).
	HeaderTracePrefix = "Sluice-Dlq-Trace-"
)

// Error classes written in HeaderClass.
const (
	ClassPermanent = "permanent" // the handler returned a Permanent error
	ClassExhausted = "exhausted" // retryable, but out of attempts
	ClassOversize  = "oversize"  // larger than the route's byte window, by policy
	ClassPanic     = "panic"     // the handler panicked on every attempt
	ClassExpired   = "expired"   // its deadline passed, by policy (consumer.ExpiredDeadLetter)
)

// ErrMalformed is returned by Decode for a message that is not a dead letter
// or whose metadata cannot be read.
var ErrMalformed = errors.New("sluice: malformed dead letter")

// Origin says where a message was consumed from. Fields that do not apply to
// a broker are left zero; Partition is -1 when unknown.
type Origin struct {
	Topic     string // Kafka topic or NATS subject
	Stream    string // JetStream stream
	Partition int32
	Offset    int64
	Sequence  uint64 // JetStream stream sequence
	Group     string // Kafka group or JetStream durable
}

// Letter is one dead letter: the original message and why it died.
type Letter struct {
	Key     []byte
	Value   []byte
	Headers map[string][]string // the original headers, never modified

	Route        string
	Err          string
	Class        string
	Attempts     int
	FirstFailure time.Time
	LastFailure  time.Time
	Origin       Origin
	Replays      int
	// ParkReason says why a replay parked the letter ("" unless parked).
	ParkReason string
	// Truncated says what was cut when the letter was stored because it
	// did not fit ("" when nothing was). A Replayer refuses to republish a
	// truncated letter: it is not the original message any more.
	Truncated string
	// Version is the sluice version that wrote the letter, as read by
	// Decode. EnvelopeHeaders always writes the running Version.
	Version string
	// Trace is the trace context of the processing that dead-lettered the
	// message, as a propagator's fields ("traceparent" -> "00-..."): a
	// tracing hook sets it (package otelsluice), so a replay can link back
	// to the failure. The producer's own context stays in Headers. Each
	// field travels as HeaderTracePrefix + name; at most MaxTraceFields
	// fields whose names and values fit MaxTraceField bytes are written and
	// read back, the rest are left out. nil when the consumer was not
	// traced.
	Trace map[string]string
}

// Bounds of Letter.Trace (its fields come from headers anyone who can
// write the dead-letter store chooses).
const (
	MaxTraceFields = 8
	MaxTraceField  = 1024
)

// Sink stores dead letters. Write returns only after the broker confirmed
// the letter; an error means it was not stored and the caller must keep the
// original. Implementations must be safe for concurrent use, and should make
// a retried Write of the same letter idempotent where the broker allows it
// (JetStream's Nats-Msg-Id).
type Sink interface {
	Write(ctx context.Context, l *Letter) error
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(ctx context.Context, l *Letter) error

// Write calls f.
func (f SinkFunc) Write(ctx context.Context, l *Letter) error { return f(ctx, l) }

const maxErrLen = 1024

// EnvelopeHeaders returns the original headers plus the envelope headers. It
// copies; l.Headers is not modified.
func (l *Letter) EnvelopeHeaders() map[string][]string {
	h := make(map[string][]string, len(l.Headers)+14)
	for k, v := range l.Headers {
		if strings.HasPrefix(k, HeaderPrefix) {
			continue // a replayed letter dying again gets fresh metadata
		}
		h[k] = append([]string(nil), v...)
	}
	e := cutString(l.Err, maxErrLen)
	set := func(k, v string) {
		if v != "" {
			h[k] = []string{v}
		}
	}
	set(HeaderError, e)
	set(HeaderClass, l.Class)
	set(HeaderAttempts, strconv.Itoa(l.Attempts))
	if !l.FirstFailure.IsZero() {
		set(HeaderFirstFailure, l.FirstFailure.UTC().Format(time.RFC3339Nano))
	}
	if !l.LastFailure.IsZero() {
		set(HeaderLastFailure, l.LastFailure.UTC().Format(time.RFC3339Nano))
	}
	set(HeaderOriginTopic, l.Origin.Topic)
	set(HeaderOriginStream, l.Origin.Stream)
	if l.Origin.Partition >= 0 && l.Origin.Stream == "" {
		set(HeaderOriginPartition, strconv.FormatInt(int64(l.Origin.Partition), 10))
		set(HeaderOriginOffset, strconv.FormatInt(l.Origin.Offset, 10))
	}
	if l.Origin.Sequence > 0 {
		set(HeaderOriginSequence, strconv.FormatUint(l.Origin.Sequence, 10))
	}
	set(HeaderGroup, l.Origin.Group)
	set(HeaderRoute, l.Route)
	set(HeaderVersion, Version)
	set(HeaderReplays, strconv.Itoa(max(l.Replays, replayCount(l.Headers))))
	set(HeaderParkReason, cutString(l.ParkReason, maxErrLen))
	set(HeaderTruncated, cutString(l.Truncated, maxErrLen))
	n := 0
	for k, v := range l.Trace {
		if n < MaxTraceFields && traceField(k, v) {
			set(HeaderTracePrefix+k, v)
			n++
		}
	}
	return h
}

// traceField reports whether a Letter.Trace field is within bounds: a name
// of printable ASCII without space or ':', a printable ASCII value, both
// non-empty and at most MaxTraceField bytes.
func traceField(k, v string) bool {
	printable := func(s string, space bool) bool {
		if s == "" || len(s) > MaxTraceField {
			return false
		}
		for i := 0; i < len(s); i++ {
			if c := s[i]; c < ' ' || c >= 0x7f || !space && (c == ' ' || c == ':') {
				return false
			}
		}
		return true
	}
	return printable(k, false) && printable(v, true)
}

// Decode reads a dead letter back from a stored message's key, value and
// headers. The envelope headers are removed from the returned Letter's
// Headers, which hold the original headers again.
func Decode(key, value []byte, headers map[string][]string) (*Letter, error) {
	get := func(k string) string {
		if v := headers[k]; len(v) > 0 {
			return v[0]
		}
		return ""
	}
	if get(HeaderClass) == "" && get(HeaderError) == "" {
		return nil, fmt.Errorf("%w: no %s header", ErrMalformed, HeaderClass)
	}
	l := &Letter{Key: key, Value: value, Headers: map[string][]string{},
		Err: get(HeaderError), Class: get(HeaderClass), Route: get(HeaderRoute), Version: get(HeaderVersion),
		ParkReason: get(HeaderParkReason), Truncated: get(HeaderTruncated)}
	for k, v := range headers {
		if !strings.HasPrefix(k, HeaderPrefix) {
			l.Headers[k] = v
		} else if f, ok := strings.CutPrefix(k, HeaderTracePrefix); ok && len(v) > 0 && len(l.Trace) < MaxTraceFields && traceField(f, v[0]) {
			if l.Trace == nil {
				l.Trace = make(map[string]string, 2)
			}
			l.Trace[f] = v[0]
		}
	}
	if s := get(HeaderPackedHeaders); s != "" {
		n, perr := strconv.Atoi(s)
		if perr != nil || n < 0 || n > len(value) {
			return nil, fmt.Errorf("%w: %s=%q with a value of %d bytes", ErrMalformed, HeaderPackedHeaders, s, len(value))
		}
		packed, perr := unpackHeaders(value[:n])
		if perr != nil {
			return nil, fmt.Errorf("%w: %s: %v", ErrMalformed, HeaderPackedHeaders, perr)
		}
		for k, v := range packed {
			l.Headers[k] = append(l.Headers[k], v...)
		}
		l.Value = value[n:]
	}
	var err error
	num := func(k string, bits int) int64 {
		s := get(k)
		if s == "" || err != nil {
			return 0
		}
		n, perr := strconv.ParseInt(s, 10, bits)
		if perr != nil {
			err = fmt.Errorf("%w: %s=%q", ErrMalformed, k, s)
		}
		return n
	}
	tm := func(k string) time.Time {
		s := get(k)
		if s == "" || err != nil {
			return time.Time{}
		}
		t, perr := time.Parse(time.RFC3339Nano, s)
		if perr != nil {
			err = fmt.Errorf("%w: %s=%q", ErrMalformed, k, s)
		}
		return t
	}
	l.Attempts = int(num(HeaderAttempts, 32))
	l.Replays = max(int(min(num(HeaderReplays, 32), MaxReplayCount)), replayCount(l.Headers))
	l.FirstFailure = tm(HeaderFirstFailure)
	l.LastFailure = tm(HeaderLastFailure)
	l.Origin = Origin{Topic: get(HeaderOriginTopic), Stream: get(HeaderOriginStream), Group: get(HeaderGroup), Partition: -1}
	if get(HeaderOriginPartition) != "" {
		l.Origin.Partition = int32(num(HeaderOriginPartition, 32))
		l.Origin.Offset = num(HeaderOriginOffset, 64)
	}
	if s := get(HeaderOriginSequence); s != "" {
		seq, perr := strconv.ParseUint(s, 10, 64)
		if perr != nil && err == nil {
			err = fmt.Errorf("%w: %s=%q", ErrMalformed, HeaderOriginSequence, s)
		}
		l.Origin.Sequence = seq
	}
	if err != nil {
		return nil, err
	}
	return l, nil
}

// replayCount reads HeaderReplayCount from a message's own headers: a
// replayed message that died again carries it there, and it wins over a
// Letter.Replays the consumer did not set.
func replayCount(h map[string][]string) int {
	v := h[HeaderReplayCount]
	if len(v) == 0 {
		return 0
	}
	return ParseReplayCount(v[0])
}

// MaxReplayCount caps a replay count read from a message: counts come from
// headers anyone can write, and one near the int limit would wrap to a
// negative when the next replay adds one.
const MaxReplayCount = 1 << 20

// ParseReplayCount reads a Sluice-Replay-Count (or Sluice-Dlq-Replays)
// value: unreadable or negative means 0, and it is capped at
// MaxReplayCount, so no header value can defeat the loop guard.
func ParseReplayCount(s string) int {
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 {
		return 0
	}
	return int(min(n, MaxReplayCount))
}

// cutString cuts s to at most n bytes without splitting a UTF-8 sequence.
func cutString(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
