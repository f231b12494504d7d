package consumer

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/adapterkit"
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

// SettleOp is what a settlement tells the broker.
type SettleOp int8

const (
	// SettleAck: the delivery is done; never redeliver it.
	SettleAck SettleOp = iota + 1
	// SettleNak: redeliver it after at least Settlement.Delay.
	SettleNak
	// SettleTerm: never redeliver it; Settlement.Reason says why.
	SettleTerm
)

var settleOpNames = [...]string{"", "ack", "nak", "term"}

// String returns "ack", "nak" or "term".
func (o SettleOp) String() string {
	if o < SettleAck || o > SettleTerm {
		return "none"
	}
	return settleOpNames[o]
}

// Settlement is one settlement of a delivery on its broker.
type Settlement struct {
	Op SettleOp
	// Delay is the least time before a SettleNak'd delivery comes back.
	Delay time.Duration
	// Reason says why a delivery was terminated (SettleTerm), for the
	// broker's advisories.
	Reason string
}

// ErrPending is returned by Acker.Settle when the settlement was sent and
// the broker's answer will be reported later through Confirm.
var ErrPending = errors.New("sluice: settlement sent, awaiting confirmation")

// Acker settles one delivery on its broker. Adapters implement it; handlers
// never see it (the consumer settles every message from its handler's
// result).
//
// The consumer calls Settle exactly once per delivery, and InProgress any
// number of times before it (possibly concurrently with Settle: an adapter
// ignores InProgress once the delivery is settled).
type Acker interface {
	// Settle performs s on the broker. It returns nil when the broker has
	// it (confirmed, or sent when the adapter does not confirm), an error
	// when it could not be done (the broker redelivers the message later),
	// or ErrPending when it was sent and the broker's answer will come
	// through Confirm(m, err): exactly once, from any goroutine, possibly
	// before Settle returns. Until then the message keeps its window
	// capacity and counts as in flight. ctx is bounded once the consumer
	// shuts down; Settle must honour it.
	Settle(ctx context.Context, s Settlement) error
	// InProgress extends the broker's ack deadline while a handler runs.
	InProgress(ctx context.Context) error
}

// Message is one delivery handed to a Handler. Adapters create it with
// NewMessage (or InitMessage) and fill the exported fields; the consumer
// owns the rest and settles it from the Handler's result. A Handler must not
// retain the Message after it returns.
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
	// Origin identifies the delivery for dead letters and logs; adapters
	// fill the stream or partition and the consumer group or durable.
	Origin dlq.Origin
	// FirstFailure, when the adapter knows it (for example from a retry
	// header), is when this message first failed. Otherwise the consumer
	// tracks it in memory for redeliveries it has seen.
	FirstFailure time.Time

	acker     Acker
	route     *route
	state     atomic.Int32 // msgState
	confirm   error        // Confirm's result when it came before Settle returned
	verdict   verdict      // what the settling party decided (set before stateClaimed ends)
	deadline  time.Time
	startBy   int64  // unix nanos (route clock) after which it cannot start in time; 0: none
	freshAt   int64  // unix nanos (route clock) of its latest fresh start (fresh.go); 0: none
	stale     bool   // startBy is the standing queue's bound, not its deadline's (fresh.go)
	units     int32  // what it costs against the window and queue (Window.Cost); 1 without
	costClass string // its CostPolicy.Class key, when the route learns costs
	fetchedAt time.Time
	touched   atomic.Int64 // unix nanos of the last InProgress or fetch
	charged   atomic.Int64 // bytes charged to the window; -1: none
	slot      int32
	crit      backpressure.Criticality
	late      bool            // succeeded after its deadline
	hctx      context.Context // what the route's MessageHook.Held returned
	okey      *keyState       // its key on an ordered route (order.go); nil: none
	retries   int             // times an ordered route held it back to run again (Attempt counts them)
}

// NewMessage returns a Message settled through a. Adapters call it (or
// InitMessage) for every delivery.
func NewMessage(a Acker) *Message {
	m := &Message{}
	InitMessage(m, a)
	return m
}

// InitMessage prepares m, which the adapter allocated (typically embedded in
// its own delivery type, to spend one allocation per delivery), to be
// settled through a. It panics when a is nil or m was initialised before.
func InitMessage(m *Message, a Acker) {
	if a == nil {
		panic("consumer: InitMessage with a nil Acker")
	}
	if m.acker != nil {
		panic("consumer: InitMessage on a Message already initialised")
	}
	m.acker = a
}

func init() {
	adapterkit.AckerOf = func(v any) any {
		if m, ok := v.(*Message); ok && m != nil && m.acker != nil {
			return m.acker
		}
		return nil
	}
}

// Deadline returns the message's deadline (skew included) and whether it has
// one. The handler's context carries the same deadline.
func (m *Message) Deadline() (time.Time, bool) { return m.deadline, !m.deadline.IsZero() }

// Criticality returns the message's class: the route's, or lower when the
// producer's header asked for less.
func (m *Message) Criticality() backpressure.Criticality { return m.crit }

// InProgress tells the broker the handler is still working on m, so a long
// handler is not redelivered. The consumer also does this by itself when
// the Source reports an AckWait (see SourceInfo), so handlers rarely need it.
func (m *Message) InProgress(ctx context.Context) error {
	if m.acker == nil || msgState(m.state.Load()) > stateClaimed {
		return nil
	}
	m.touched.Store(time.Now().UnixNano())
	return m.acker.InProgress(ctx)
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
	return max(n, 1)
}
