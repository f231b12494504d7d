package consumer

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/dlq"
)

// Headers are a message's headers. The type matches nats.Header, so a NATS
// adapter converts without copying; lookups are case-sensitive.
type Headers map[string][]string

// Get returns the first value of key, or "".
func (h Headers) Get(key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// Lookup returns the first value of key and whether the key is present.
func (h Headers) Lookup(key string) (string, bool) {
	v, ok := h[key]
	if !ok || len(v) == 0 {
		return "", false
	}
	return v[0], true
}

// Set replaces key's values with value.
func (h Headers) Set(key, value string) { h[key] = []string{value} }

// Acker settles one delivery on its broker. Each method returns once the
// adapter has done what it can to settle; the consumer calls exactly one of
// Ack, Nak or Term per delivery, and InProgress any number of times before.
type Acker interface {
	// Ack settles a processed delivery.
	Ack(ctx context.Context) error
	// Nak asks the broker to redeliver after at least delay (0: soon).
	Nak(ctx context.Context, delay time.Duration) error
	// Term settles a delivery that must never be redelivered.
	Term(ctx context.Context, reason string) error
	// InProgress extends the broker's ack deadline while a handler runs.
	InProgress(ctx context.Context) error
}

// Message is one delivery handed to a Handler. Adapters fill the exported
// fields; the consumer owns the rest. A Handler must not retain the Message
// after it returns, nor settle it: the consumer settles it from the
// Handler's result.
type Message struct {
	Topic       string // Kafka topic or NATS subject
	Key         []byte
	Value       []byte
	Headers     Headers
	PublishedAt time.Time // broker time; zero when unknown
	// Attempt is the delivery attempt, 1 for the first delivery. Adapters
	// take it from broker metadata (JetStream NumDelivered) or their own
	// retry headers; 0 is read as 1.
	Attempt int
	// Size is what the message costs against the byte window. 0 means
	// len(Key)+len(Value) plus header bytes.
	Size int64
	// Origin identifies the delivery for dead letters and logs.
	Origin dlq.Origin
	// FirstFailure, when the adapter knows it (for example from a retry
	// header), is when this message first failed. Otherwise the consumer
	// tracks it in memory for redeliveries it has seen.
	FirstFailure time.Time
	Acker        Acker

	route     *route
	deadline  time.Time
	fetchedAt time.Time
	touched   atomic.Int64 // unix nanos of the last InProgress or fetch
	charged   int64
	slot      int32
	settled   atomic.Bool
	crit      backpressure.Criticality
}

// Deadline returns the message's deadline (skew included) and whether it has
// one. The handler's context carries the same deadline.
func (m *Message) Deadline() (time.Time, bool) { return m.deadline, !m.deadline.IsZero() }

// Criticality returns the message's class: the route's, or lower when the
// producer's header asked for less.
func (m *Message) Criticality() backpressure.Criticality { return m.crit }

// InProgress tells the broker the handler is still working on m, so a long
// handler is not redelivered. The consumer also does this by itself when the
// route has a KeepAlive interval.
func (m *Message) InProgress(ctx context.Context) error {
	if m.settled.Load() || m.Acker == nil {
		return nil
	}
	m.touched.Store(time.Now().UnixNano())
	return m.Acker.InProgress(ctx)
}

func (m *Message) cost() int64 {
	if m.Size > 0 {
		return m.Size
	}
	n := int64(len(m.Key) + len(m.Value))
	for k, vs := range m.Headers {
		for _, v := range vs {
			n += int64(len(k) + len(v))
		}
	}
	return n
}

// Source hands over messages for one route. Fetch blocks until it can return
// at least one message, ctx is done, or its own poll interval ends (then it
// may return no messages and a nil error). It returns at most maxMessages
// messages whose sizes add up to at most maxBytes, with one exception: when
// the next message alone is larger than maxBytes the source may return it
// alone, and the consumer admits it by its oversize policy.
//
// Messages a Source has returned are the consumer's: it settles every one of
// them through its Acker, even when Fetch also returns an error.
type Source interface {
	Fetch(ctx context.Context, maxMessages int, maxBytes int64) ([]*Message, error)
}

// AckWaiter is implemented by sources whose broker redelivers a message not
// settled within a deadline (JetStream AckWait). The consumer then keeps
// in-flight messages alive with InProgress at a third of it.
type AckWaiter interface {
	AckWait() time.Duration
}

// DeliveryLimiter is implemented by sources whose broker gives up on a
// message after a number of deliveries (JetStream MaxDeliver). A Nak of the
// last delivery would then lose the message without a trace, so New refuses
// a route whose Retry.MaxAttempts is above the limit, and a delivery that is
// the broker's last is dead-lettered rather than nak'd when it is shed or
// overloaded (if the route has a DeadLetter sink). MaxDeliver <= 0 means
// unlimited.
type DeliveryLimiter interface {
	MaxDeliver() int
}

// Handler processes one message. Its ctx carries the message deadline, if
// any, and is cancelled on shutdown once the grace period is over. Return
// nil for success, Permanent(err) for an error retrying cannot fix,
// Overloaded(err) to shed without retrying at this layer, or any other error
// to retry.
type Handler func(ctx context.Context, m *Message) error

// Middleware wraps a Handler.
type Middleware func(Handler) Handler

// Chain wraps h in mw, the first middleware outermost: Chain(h, a, b) runs
// a, then b, then h.
func Chain(h Handler, mw ...Middleware) Handler {
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return h
}
