package sluicetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/adapterkit"
)

// ConfirmMode says how the Source's settlements are confirmed.
type ConfirmMode int8

const (
	// ConfirmAtOnce: Settle returns nil; the settlement is done. The default.
	ConfirmAtOnce ConfirmMode = iota
	// ConfirmAsync: Settle returns consumer.ErrPending and the settlement
	// (applied in the order of the Settle calls) is confirmed from another
	// goroutine right away, as a pipelining adapter does.
	ConfirmAsync
	// ConfirmManual: Settle returns consumer.ErrPending and the settlement
	// waits until the test calls Source.ConfirmPending.
	ConfirmManual
)

// Source is an in-memory consumer.Source with a ledger of every delivery and
// settlement. Create it with NewSource; it serves one route.
type Source struct {
	// HonorDelay makes a Nak requeue only after its delay.
	HonorDelay bool
	// MaxDeliver, when > 0, plays JetStream's MaxDeliver: it is reported
	// in SourceInfo, and a Nak of a delivery whose attempt reached it drops
	// the message (Record.Dropped).
	MaxDeliver int
	// AckWait is reported in SourceInfo (the route keeps messages alive at
	// a third of it). 0 means none.
	AckWait time.Duration
	// Confirm says how settlements are confirmed.
	Confirm ConfirmMode
	// RedeliverFirst puts a nak'd message back ahead of the messages never
	// delivered (behind earlier nak'd ones), as a JetStream durable does,
	// instead of at the tail.
	RedeliverFirst bool

	mu        sync.Mutex
	queue     []*entry
	redo      int   // queue[:redo] are redeliveries (RedeliverFirst)
	published int64 // PublishMsg's sequence
	signal    chan struct{}
	closed    bool
	ledger    map[string]*Record
	errs      []string
	fetches   int
	asked     []Ask
	fail      func(n int) error
	limits    *consumer.RouteLimits
	awaiting  []*acker
}

// Ask records what one Fetch asked for.
type Ask struct {
	Messages int
	Bytes    int64
}

type entry struct {
	id      string
	key     []byte
	part    int32
	offset  int64
	origin  bool // Origin.Topic, Partition and Offset are set (PublishMsg)
	value   []byte
	headers consumer.Headers
	pub     time.Time
	attempt int
	size    int64
}

// Record is the ledger line of one message id.
type Record struct {
	Deliveries int
	Acks       int
	Naks       int
	Terms      int
	Reasons    []string
	NakDelays  []time.Duration
	InProgress int
	Pending    bool // delivered and not yet settled
	Dropped    bool // nak'd on its last delivery (MaxDeliver): gone
}

// Settled reports whether the message ended for good: acked or terminated.
func (r Record) Settled() bool { return r.Acks+r.Terms > 0 }

// NewSource returns an empty source.
func NewSource() *Source {
	return &Source{signal: make(chan struct{}, 1), ledger: map[string]*Record{}}
}

// Attach implements consumer.Source.
func (s *Source) Attach(l consumer.RouteLimits) (consumer.SourceInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limits != nil && s.limits.Route != l.Route {
		return consumer.SourceInfo{}, fmt.Errorf("%w: sluicetest.Source already serves route %q", consumer.ErrInvalidOption, s.limits.Route)
	}
	s.limits = &l
	return consumer.SourceInfo{AckWait: s.AckWait, MaxDeliver: s.MaxDeliver}, nil
}

// Limits returns what the route told the Source in Attach (zero before).
func (s *Source) Limits() consumer.RouteLimits {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.limits == nil {
		return consumer.RouteLimits{}
	}
	return *s.limits
}

// Publish queues a message. id must be unique; it is also the Key.
func (s *Source) Publish(id string, value []byte, headers consumer.Headers, published time.Time) {
	s.PublishSized(id, value, headers, published, 0)
}

// PublishSized queues a message whose window cost is size (0: computed).
func (s *Source) PublishSized(id string, value []byte, headers consumer.Headers, published time.Time, size int64) {
	s.mu.Lock()
	s.queue = append(s.queue, &entry{id: id, key: []byte(id), value: value, headers: headers, pub: published, attempt: 1, size: size})
	if _, ok := s.ledger[id]; !ok {
		s.ledger[id] = &Record{}
	}
	s.mu.Unlock()
	s.wake()
}

// Msg is a message for PublishMsg.
type Msg struct {
	// ID names the message in the ledger; it must be unique.
	ID string
	// Key is Message.Key; nil means ID.
	Key []byte
	// Partition is Message.Origin.Partition (with Origin.Topic "mem" and
	// Origin.Offset the publish sequence), for routes ordered ByPartition.
	Partition   int32
	Value       []byte
	Headers     consumer.Headers
	PublishedAt time.Time
	// Size is the window cost; 0 means computed.
	Size int64
}

// PublishMsg queues m.
func (s *Source) PublishMsg(m Msg) {
	key := m.Key
	if key == nil {
		key = []byte(m.ID)
	}
	s.mu.Lock()
	s.published++
	s.queue = append(s.queue, &entry{id: m.ID, key: key, part: m.Partition, offset: s.published, origin: true, value: m.Value,
		headers: m.Headers, pub: m.PublishedAt, attempt: 1, size: m.Size})
	if _, ok := s.ledger[m.ID]; !ok {
		s.ledger[m.ID] = &Record{}
	}
	s.mu.Unlock()
	s.wake()
}

// FailFetches makes Fetch call fn with the fetch number (1-based) and
// return its error when non-nil.
func (s *Source) FailFetches(fn func(n int) error) {
	s.mu.Lock()
	s.fail = fn
	s.mu.Unlock()
}

// Close makes Fetch return consumer.ErrClosed once the queue is empty.
func (s *Source) Close() {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.wake()
}

func (s *Source) wake() {
	select {
	case s.signal <- struct{}{}:
	default:
	}
}

// Fetch implements consumer.Source.
func (s *Source) Fetch(ctx context.Context, maxMessages int, maxBytes int64) ([]*consumer.Message, error) {
	for {
		s.mu.Lock()
		s.fetches++
		s.asked = append(s.asked, Ask{maxMessages, maxBytes})
		if s.fail != nil {
			if err := s.fail(s.fetches); err != nil {
				s.mu.Unlock()
				return nil, err
			}
		}
		var out []*consumer.Message
		var bytes int64
		for len(s.queue) > 0 && len(out) < maxMessages {
			e := s.queue[0]
			cost := e.size
			if cost == 0 {
				cost = int64(len(e.key) + len(e.value))
			}
			if bytes+cost > maxBytes && len(out) > 0 {
				break
			}
			s.queue = s.queue[1:]
			if s.redo > 0 {
				s.redo--
			}
			bytes += cost
			rec := s.ledger[e.id]
			rec.Deliveries++
			if rec.Pending {
				s.errs = append(s.errs, fmt.Sprintf("%s delivered while still pending", e.id))
			}
			rec.Pending = true
			a := &acker{s: s, e: e}
			m := &a.msg
			consumer.InitMessage(m, a)
			m.Topic, m.Key, m.Value, m.Headers = "mem", e.key, e.value, e.headers
			m.PublishedAt, m.Attempt, m.Size = e.pub, e.attempt, e.size
			if e.origin {
				m.Origin.Topic, m.Origin.Partition, m.Origin.Offset = "mem", e.part, e.offset
			}
			out = append(out, m)
			if cost > maxBytes {
				break // an oversized message travels alone
			}
		}
		closed := s.closed && len(s.queue) == 0
		s.mu.Unlock()
		if len(out) > 0 {
			return out, nil
		}
		if closed {
			return nil, consumer.ErrClosed
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.signal:
		}
	}
}

// Ledger returns a copy of the ledger and any protocol violations seen
// (double settlement, redelivery while pending).
func (s *Source) Ledger() (map[string]Record, []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make(map[string]Record, len(s.ledger))
	for k, v := range s.ledger {
		out[k] = *v
	}
	return out, append([]string(nil), s.errs...)
}

// Asks returns what each Fetch asked for.
func (s *Source) Asks() []Ask {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Ask(nil), s.asked...)
}

// Queued reports messages waiting to be fetched.
func (s *Source) Queued() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.queue)
}

// Awaiting reports settlements sent and not yet confirmed (ConfirmManual).
func (s *Source) Awaiting() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.awaiting)
}

// ConfirmPending confirms every settlement awaiting confirmation
// (ConfirmManual) with err, and returns how many it confirmed. With a nil
// err the settlements take effect; with an error they are dropped, as a
// broker that refused them (the message is redelivered).
func (s *Source) ConfirmPending(err error) int {
	s.mu.Lock()
	as := s.awaiting
	s.awaiting = nil
	s.mu.Unlock()
	for _, a := range as {
		if err == nil {
			a.apply()
		} else {
			a.requeue()
		}
		consumer.Confirm(&a.msg, err)
	}
	return len(as)
}

type acker struct {
	msg  consumer.Message
	s    *Source
	e    *entry
	op   consumer.Settlement
	done bool
}

// Settle implements consumer.Acker.
func (a *acker) Settle(_ context.Context, op consumer.Settlement) error {
	a.s.mu.Lock()
	if a.done {
		a.s.errs = append(a.s.errs, fmt.Sprintf("%s settled twice (%s)", a.e.id, op.Op))
	}
	a.done = true
	a.op = op
	mode := a.s.Confirm
	if mode == ConfirmManual {
		a.s.awaiting = append(a.s.awaiting, a)
	}
	a.s.mu.Unlock()
	switch mode {
	case ConfirmAsync:
		// The broker takes settlements in the order they are sent (a nak'd
		// message is redelivered in that order); only the answer is late.
		a.apply()
		go consumer.Confirm(&a.msg, nil)
		return consumer.ErrPending
	case ConfirmManual:
		return consumer.ErrPending
	}
	a.apply()
	return nil
}

// apply records the settlement in the ledger and requeues a nak'd message.
func (a *acker) apply() {
	a.s.mu.Lock()
	rec := a.s.ledger[a.e.id]
	rec.Pending = false
	switch a.op.Op {
	case consumer.SettleAck:
		rec.Acks++
	case consumer.SettleTerm:
		rec.Terms++
		rec.Reasons = append(rec.Reasons, a.op.Reason)
	case consumer.SettleNak:
		rec.Naks++
		rec.NakDelays = append(rec.NakDelays, a.op.Delay)
		if a.s.MaxDeliver > 0 && a.e.attempt >= a.s.MaxDeliver {
			rec.Dropped = true
			a.s.mu.Unlock()
			return
		}
		a.s.mu.Unlock()
		a.redeliver(a.op.Delay)
		return
	}
	a.s.mu.Unlock()
}

// requeue plays a settlement the broker refused: the delivery is pending
// until the broker redelivers it.
func (a *acker) requeue() {
	a.s.mu.Lock()
	a.s.ledger[a.e.id].Pending = false
	a.s.mu.Unlock()
	a.redeliver(0)
}

func (a *acker) redeliver(delay time.Duration) {
	next := *a.e
	next.attempt++
	if a.s.HonorDelay && delay > 0 {
		time.AfterFunc(delay, func() { a.s.requeue(&next) })
		return
	}
	a.s.requeue(&next)
}

func (s *Source) requeue(e *entry) {
	s.mu.Lock()
	if s.RedeliverFirst {
		s.queue = slices.Insert(s.queue, s.redo, e)
		s.redo++
	} else {
		s.queue = append(s.queue, e)
	}
	s.mu.Unlock()
	s.wake()
}

// InProgress implements consumer.Acker.
func (a *acker) InProgress(context.Context) error {
	a.s.mu.Lock()
	a.s.ledger[a.e.id].InProgress++
	a.s.mu.Unlock()
	return nil
}

// Settled counts the messages acked or terminated so far (a queue's depth
// is what was published minus this).
func (s *Source) Settled() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, r := range s.ledger {
		n += r.Acks + r.Terms
	}
	return n
}

// Settle settles m, a message any Source returned, the way a Consumer
// would. It is for tests and tools that drive a Source without a Consumer
// (a baseline consumer in a benchmark); code running under a Consumer never
// settles messages itself. A settlement the adapter confirms later
// (consumer.ErrPending) counts as done: outside a Consumer nobody waits for
// its confirmation.
func Settle(ctx context.Context, m *consumer.Message, s consumer.Settlement) error {
	a, ok := adapterkit.AckerOf(m).(consumer.Acker)
	if !ok {
		return fmt.Errorf("%w: message not built with consumer.NewMessage", consumer.ErrInvalidOption)
	}
	if err := a.Settle(ctx, s); !errors.Is(err, consumer.ErrPending) {
		return err
	}
	return nil
}
