package natsadapter

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// ErrAckUnconfirmed is the error a settlement completes with when the
// server's confirmation did not arrive (reply lost with a connection, a
// server restart, AckTimeout passed after every re-send). The broker still
// holds the message and redelivers it after AckWait unless the settlement
// did land; nothing is counted settled on a guess.
var ErrAckUnconfirmed = errors.New("natsadapter: settlement not confirmed by the server")

// settleKind is the JetStream ack protocol verb of a settlement.
type settleKind uint8

const (
	kindAck settleKind = iota
	kindNak
	kindTerm
)

var (
	bodyAck  = []byte("+ACK")
	bodyNak  = []byte("-NAK")
	bodyTerm = []byte("+TERM")
	bodyWPI  = []byte("+WPI")
)

// settleBody is the ack protocol payload of one settlement.
func settleBody(k settleKind, delay time.Duration, reason string) []byte {
	switch k {
	case kindNak:
		if delay <= 0 {
			return bodyNak
		}
		b := make([]byte, 0, 32)
		b = append(b, `-NAK {"delay": `...)
		b = strconv.AppendInt(b, int64(delay), 10)
		return append(b, '}')
	case kindTerm:
		if reason == "" {
			return bodyTerm
		}
		return []byte("+TERM " + reason)
	default:
		return bodyAck
	}
}

// pendingSettle is one settlement on its way to the server: queued for the
// writer, or written and waiting for the server's reply. Every delivery
// embeds one, so a settlement allocates nothing of its own.
type pendingSettle struct {
	subj    string // the delivery's $JS.ACK subject
	body    []byte
	kind    settleKind
	confirm bool   // wait for the server's reply
	seq     uint64 // the message's stream sequence (0: unknown)

	// Guarded by settler.mu once queued.
	id      uint64 // reply token, 0 when not confirmed
	ctx     context.Context
	sentAt  time.Time
	conns   uint64 // the connection's reconnect count when last sent
	resends int
	// d is told the outcome exactly once (d.settled), outside settler.mu.
	d *delivery
}

// settler writes the settlements of one Source. Workers hand it their
// settlement and return at once; one writer goroutine (started when there
// is work, gone when there is none) publishes everything queued back to
// back, so the client's flusher writes many acks per syscall whatever the
// number of workers, and workers never contend on the connection lock.
//
// Confirmed settlements carry a reply subject on the Source's own inbox
// (<inbox>.<token>): the server answers each one, the reply is matched to
// its settlement in pending, and only then is the settlement done. A reply
// that does not come (lost with a connection, a server restart) is handled
// by the sweep: Ack and Term are re-sent (both are idempotent on the
// server: an ack of an acknowledged message is answered and changes
// nothing), at once after a reconnect, else after AckTimeout; a Nak is not
// re-sent (the broker redelivers a message whose nak was lost anyway, and a
// late second nak could push back a later delivery of it). After the last
// re-send the settlement completes with ErrAckUnconfirmed: it is never
// counted settled on a guess, and the broker redelivers the message if the
// settlement really did not land.
type settler struct {
	nc      *nats.Conn
	timeout time.Duration
	resends int
	// flush: confirm by a PING after each batch of plain settlements
	// (ConfirmFlush) instead of a reply per settlement.
	flush bool
	// flushed is the writer's batch awaiting its PONG (writer only).
	flushed []*pendingSettle
	// replyBuf builds reply subjects (writer only).
	replyBuf []byte

	mu      sync.Mutex
	queue   []*pendingSettle
	spare   []*pendingSettle
	writing bool
	closed  bool
	inbox   string
	sub     *nats.Subscription
	nextID  uint64
	pending map[uint64]*pendingSettle
	sweep   *time.Timer
	// sweeping is true while a sweep is scheduled or running.
	sweeping bool

	resent, unconfirmed atomic.Uint64
}

func newSettler(nc *nats.Conn, timeout time.Duration, flush bool) *settler {
	return &settler{nc: nc, timeout: timeout, resends: 2, flush: flush, pending: map[uint64]*pendingSettle{}}
}

// sweepEvery is how often outstanding confirmations are checked for a
// reconnect, a cancelled ctx, or a timeout.
func (s *settler) sweepEvery() time.Duration { return min(s.timeout/5, 200*time.Millisecond) }

// settle queues p for the writer. p.d.settled is called exactly once: with
// the server's answer when p.confirm, else with the publish error (nil once
// the settlement is handed to the connection). It may run before settle
// returns.
func (s *settler) settle(ctx context.Context, p *pendingSettle) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		p.d.settled(fmt.Errorf("natsadapter: settle after Close: %w", nats.ErrConnectionClosed))
		return
	}
	if p.confirm {
		if s.sub == nil && !s.flush {
			if err := s.subscribeLocked(); err != nil {
				s.mu.Unlock()
				p.d.settled(err)
				return
			}
		}
		s.nextID++
		p.id = s.nextID
		p.ctx = ctx
		s.pending[p.id] = p
		if !s.sweeping {
			s.sweeping = true
			if s.sweep == nil {
				s.sweep = time.AfterFunc(s.sweepEvery(), s.doSweep)
			} else {
				s.sweep.Reset(s.sweepEvery())
			}
		}
	}
	s.queue = append(s.queue, p)
	if s.writing {
		s.mu.Unlock()
		return
	}
	s.writing = true
	s.mu.Unlock()
	go s.write()
}

// write publishes what is queued until the queue is empty. It first yields
// once, so workers that are running settle into the same batch: the
// client's flusher then writes them with one syscall.
func (s *settler) write() {
	runtime.Gosched()
	for {
		s.mu.Lock()
		q := s.queue
		if len(q) == 0 {
			s.writing = false
			s.mu.Unlock()
			return
		}
		s.queue, s.spare = s.spare[:0], q
		// Mark the batch sent now, under the one lock: an answer may come
		// back before the writer is done with the batch.
		now := time.Now()
		var conns uint64
		if len(s.pending) > 0 {
			conns = s.reconnects()
		}
		for _, p := range q {
			if p.id != 0 {
				p.sentAt, p.conns = now, conns
			}
		}
		inbox := s.inbox
		s.mu.Unlock()
		for i, p := range q {
			q[i] = nil
			if p.id == 0 {
				p.d.settled(s.publishErr(s.nc.Publish(p.subj, p.body)))
				continue
			}
			var err error
			if s.flush {
				err = s.nc.Publish(p.subj, p.body)
			} else {
				// One allocation for the reply subject: <inbox>.<id base 36>.
				s.replyBuf = strconv.AppendUint(append(append(s.replyBuf[:0], inbox...), '.'), p.id, 36)
				err = s.nc.PublishRequest(p.subj, string(s.replyBuf), p.body)
			}
			if err != nil {
				s.mu.Lock()
				_, ok := s.pending[p.id]
				delete(s.pending, p.id)
				s.mu.Unlock()
				if ok {
					p.d.settled(s.publishErr(err))
				}
				continue
			}
			if s.flush {
				s.flushed = append(s.flushed, p)
			}
		}
		if len(s.flushed) > 0 {
			s.confirmFlushed()
		}
	}
}

// confirmFlushed waits for the server's PONG to a PING sent after the
// batch in s.flushed and completes the batch's settlements: the server has
// read them. Meanwhile new settlements queue up for the next batch. When
// the PONG does not come (timeout, a lost connection), they stay pending
// for the sweep, which re-sends them.
func (s *settler) confirmFlushed() {
	b := s.flushed
	err := s.nc.FlushTimeout(s.timeout)
	if err == nil {
		s.mu.Lock()
		n := 0
		for _, p := range b {
			if s.pending[p.id] == p {
				delete(s.pending, p.id)
				b[n] = p
				n++
			}
		}
		s.mu.Unlock()
		for _, p := range b[:n] {
			p.d.settled(nil)
		}
	}
	clear(b)
	s.flushed = b[:0]
}

func (s *settler) publishErr(err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("natsadapter: settle: %w", err)
}

func (s *settler) reconnects() uint64 { return s.nc.Stats().Reconnects }

// subscribeLocked makes the reply subscription. s.mu is held.
func (s *settler) subscribeLocked() error {
	inbox := s.nc.NewInbox()
	sub, err := s.nc.Subscribe(inbox+".*", s.reply)
	if err != nil {
		return fmt.Errorf("natsadapter: ack reply subscription: %w", err)
	}
	// The server answers every settlement it gets; the window bounds how
	// many are outstanding, so the client's default limits never bind,
	// but a slow consumer must not drop replies silently: no limit.
	_ = sub.SetPendingLimits(-1, -1)
	s.inbox, s.sub = inbox, sub
	return nil
}

// reply completes the settlement the server answered.
func (s *settler) reply(m *nats.Msg) {
	i := strings.LastIndexByte(m.Subject, '.')
	if i < 0 {
		return
	}
	id, err := strconv.ParseUint(m.Subject[i+1:], 36, 64)
	if err != nil {
		return
	}
	rerr := replyErr(m)
	s.mu.Lock()
	p, ok := s.pending[id]
	if ok && rerr != nil && m.Header.Get("Status") == "503" && p.kind != kindNak && p.resends < s.resends && !p.sentAt.IsZero() {
		// No consumer took it: right after a server restart the consumer
		// may not be loaded yet. Let the next sweep send it again.
		p.sentAt = time.Now().Add(-s.timeout)
		s.mu.Unlock()
		return
	}
	if ok {
		delete(s.pending, id)
	}
	s.mu.Unlock()
	if !ok {
		return // an answer to a re-sent settlement that was already completed
	}
	p.d.settled(rerr)
}

// replyErr reads the server's answer to a settlement: empty on success, a
// status (503 no responders: the consumer is gone) otherwise.
func replyErr(m *nats.Msg) error {
	st := m.Header.Get("Status")
	if st == "" || len(m.Data) > 0 {
		return nil
	}
	if st == "503" {
		return fmt.Errorf("natsadapter: settle: %w (the consumer is gone)", nats.ErrNoResponders)
	}
	return fmt.Errorf("natsadapter: settle: status %s %s", st, m.Header.Get("Description"))
}

// doSweep re-sends or completes settlements whose reply has not come.
func (s *settler) doSweep() {
	now := time.Now()
	var failed []*pendingSettle
	var causes []error
	s.mu.Lock()
	if s.closed {
		s.sweeping = false
		s.mu.Unlock()
		return
	}
	conns := s.reconnects()
	connected := s.nc.IsConnected()
	resend := false
	for id, p := range s.pending {
		if p.sentAt.IsZero() {
			continue // still queued
		}
		if err := p.ctx.Err(); err != nil {
			delete(s.pending, id)
			failed = append(failed, p)
			causes = append(causes, fmt.Errorf("%w: %w", ErrAckUnconfirmed, err))
			continue
		}
		if !connected {
			continue // re-sent once the connection is back
		}
		if p.conns == conns && now.Sub(p.sentAt) < s.timeout {
			continue
		}
		if p.kind == kindNak || p.resends >= s.resends {
			delete(s.pending, id)
			failed = append(failed, p)
			causes = append(causes, ErrAckUnconfirmed)
			continue
		}
		p.resends++
		p.sentAt = time.Time{}
		s.queue = append(s.queue, p)
		s.resent.Add(1)
		resend = true
	}
	startWriter := resend && !s.writing
	if startWriter {
		s.writing = true
	}
	if len(s.pending) > 0 {
		s.sweep.Reset(s.sweepEvery())
	} else {
		s.sweeping = false
	}
	s.mu.Unlock()
	if startWriter {
		go s.write()
	}
	s.unconfirmed.Add(uint64(len(failed)))
	for i, p := range failed {
		p.d.settled(causes[i])
	}
}

// outstanding returns the body of an Ack or Term of stream message seq
// that is still waiting for the server's answer.
func (s *settler) outstanding(seq uint64) ([]byte, bool) {
	if seq == 0 {
		return nil, false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.pending {
		if p.seq == seq && p.kind != kindNak {
			return p.body, true
		}
	}
	return nil, false
}

// failOlder completes, with errOldConsumer, the outstanding settlements of
// deliveries older than generation gen.
func (s *settler) failOlder(gen uint32) {
	var failed []*pendingSettle
	s.mu.Lock()
	for id, p := range s.pending {
		if p.d.gen < gen {
			delete(s.pending, id)
			failed = append(failed, p)
		}
	}
	s.mu.Unlock()
	for _, p := range failed {
		p.d.settled(errOldConsumer)
	}
}

// close completes every outstanding settlement with ErrAckUnconfirmed and
// drops the reply subscription. Settlements after close fail at once.
func (s *settler) close() error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	s.closed = true
	var failed []*pendingSettle
	for id, p := range s.pending {
		delete(s.pending, id)
		failed = append(failed, p)
	}
	if s.sweep != nil {
		s.sweep.Stop()
	}
	sub := s.sub
	s.sub = nil
	s.mu.Unlock()
	s.unconfirmed.Add(uint64(len(failed)))
	for _, p := range failed {
		p.d.settled(fmt.Errorf("%w: source closed", ErrAckUnconfirmed))
	}
	if sub == nil {
		return nil
	}
	err := sub.Unsubscribe()
	if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrBadSubscription) {
		return nil
	}
	return err
}
