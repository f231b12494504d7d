package memsource

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/sluice-go/sluice/consumer"
)

// Source hands out queued messages. Nak puts a message back at the tail
// with its attempt increased (the delay is ignored unless HonorDelay is set),
// so redelivery is deterministic.
type Source struct {
	// HonorDelay makes Nak requeue only after its delay.
	HonorDelay bool
	// DeliveryLimit, when > 0, plays JetStream's MaxDeliver: a Nak of a
	// delivery whose attempt reached it drops the message (Record.Dropped).
	DeliveryLimit int

	mu      sync.Mutex
	queue   []*entry
	signal  chan struct{}
	closed  bool
	ledger  map[string]*Record
	errs    []string
	fetches int
	asked   []Ask
	fail    func(n int) error
}

// Ask records what one Fetch asked for.
type Ask struct {
	Messages int
	Bytes    int64
}

type entry struct {
	id      string
	key     []byte
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
	InProgress int
	Pending    bool // delivered and not yet settled
	Dropped    bool // nak'd on its last delivery (DeliveryLimit): gone
}

// MaxDeliver implements consumer.DeliveryLimiter.
func (s *Source) MaxDeliver() int { return s.DeliveryLimit }

// New returns an empty source.
func New() *Source {
	return &Source{signal: make(chan struct{}, 1), ledger: map[string]*Record{}}
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
			bytes += cost
			rec := s.ledger[e.id]
			rec.Deliveries++
			if rec.Pending {
				s.errs = append(s.errs, fmt.Sprintf("%s delivered while still pending", e.id))
			}
			rec.Pending = true
			out = append(out, &consumer.Message{Topic: "mem", Key: e.key, Value: e.value, Headers: e.headers,
				PublishedAt: e.pub, Attempt: e.attempt, Size: e.size, Acker: &acker{s: s, e: e}})
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
// (double settlement, settlement after settlement, redelivery while pending).
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

type acker struct {
	s    *Source
	e    *entry
	done bool
}

func (a *acker) settle(kind string) *Record {
	a.s.mu.Lock()
	defer a.s.mu.Unlock()
	rec := a.s.ledger[a.e.id]
	if a.done {
		a.s.errs = append(a.s.errs, fmt.Sprintf("%s settled twice (%s)", a.e.id, kind))
	}
	a.done = true
	rec.Pending = false
	return rec
}

func (a *acker) Ack(context.Context) error {
	rec := a.settle("ack")
	a.s.mu.Lock()
	rec.Acks++
	a.s.mu.Unlock()
	return nil
}

func (a *acker) Term(_ context.Context, reason string) error {
	rec := a.settle("term")
	a.s.mu.Lock()
	rec.Terms++
	rec.Reasons = append(rec.Reasons, reason)
	a.s.mu.Unlock()
	return nil
}

func (a *acker) Nak(_ context.Context, delay time.Duration) error {
	rec := a.settle("nak")
	a.s.mu.Lock()
	rec.Naks++
	if a.s.DeliveryLimit > 0 && a.e.attempt >= a.s.DeliveryLimit {
		rec.Dropped = true
		a.s.mu.Unlock()
		return nil
	}
	next := *a.e
	next.attempt++
	if a.s.HonorDelay && delay > 0 {
		a.s.mu.Unlock()
		time.AfterFunc(delay, func() {
			a.s.mu.Lock()
			a.s.queue = append(a.s.queue, &next)
			a.s.mu.Unlock()
			a.s.wake()
		})
		return nil
	}
	a.s.queue = append(a.s.queue, &next)
	a.s.mu.Unlock()
	a.s.wake()
	return nil
}

func (a *acker) InProgress(context.Context) error {
	a.s.mu.Lock()
	a.s.ledger[a.e.id].InProgress++
	a.s.mu.Unlock()
	return nil
}
