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
	// plain: sent without a reply subject, confirmed by the answer to a
	// later settlement (ConfirmBatch). Set by the writer under settler.mu.
	plain bool

	// Guarded by settler.mu once queued.
	id      uint64 // reply token, 0 when not confirmed
	ctx     context.Context
	sentAt  time.Time
	conns   uint64 // the connection's reconnect count when last sent
	sendSeq uint64 // the writer's send order when last sent
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
//
// With batch (ConfirmBatch) only the last Ack or Term of each batch the
// writer sends carries a reply subject; the others go as plain acks. A
// JetStream consumer processes the acks it receives in order (one queue
// per consumer), and one connection delivers them in the order written, so
// the answer to a settlement confirms every settlement sent before it on
// the same connection. Two guards keep that true: a settlement is sent
// plain only once a settlement sent on the current connection has been
// answered (right after a (re)connect the server may not have loaded the
// consumer yet, and it drops plain acks to an unloaded consumer silently),
// and an answer covers earlier settlements only when no reconnect happened
// since they were sent. Naks always ask for their own answer.
type settler struct {
	nc      *nats.Conn
	timeout time.Duration
	resends int
	// batch: ConfirmBatch (see above).
	batch bool
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
	// sendSeq numbers sends in the order the writer makes them.
	sendSeq uint64
	// sent lists (batch) the confirmed settlements in send order, for an
	// answer to cover those sent before it. Entries whose settlement was
	// completed or re-sent since are skipped when reached.
	sent []sentRef
	// answered says (batch) that a settlement sent on connection
	// answeredConns was answered: the consumer takes plain acks there.
	answered      bool
	answeredConns uint64

	resent, unconfirmed, covered atomic.Uint64
}

// sentRef is one send of a settlement: p as it was when sent with
// sequence seq (p.sendSeq changes when p is re-sent).
type sentRef struct {
	p   *pendingSettle
	seq uint64
}

func newSettler(nc *nats.Conn, timeout time.Duration, batch bool) *settler {
	return &settler{nc: nc, timeout: timeout, resends: 2, batch: batch, pending: map[uint64]*pendingSettle{}}
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
		if s.sub == nil {
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
		// The last Ack or Term of the batch asks for the answer that
		// confirms the plain ones before it.
		last := -1
		plain := s.batch && s.answered && s.answeredConns == conns
		if plain {
			for i := len(q) - 1; i >= 0; i-- {
				if q[i].id != 0 && q[i].kind != kindNak {
					last = i
					break
				}
			}
		}
		for i, p := range q {
			if p.id != 0 {
				s.sendSeq++
				p.sentAt, p.conns, p.sendSeq = now, conns, s.sendSeq
				p.plain = plain && i < last && p.kind != kindNak
				if s.batch {
					s.sent = append(s.sent, sentRef{p, p.sendSeq})
				}
			}
		}
		if s.batch && len(s.sent) > 2*len(s.pending)+64 {
			s.compactSentLocked()
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
			if p.plain {
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
			}
		}
	}
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
	if ok && rerr != nil && s.batch && !p.sentAt.IsZero() {
		// The plain acks sent before p met the same fate: re-send them at
		// the next sweep, each asking for its own answer.
		s.expediteLocked(p)
	}
	if ok && rerr != nil && m.Header.Get("Status") == "503" && p.kind != kindNak && p.resends < s.resends && !p.sentAt.IsZero() {
		// No consumer took it: right after a server restart the consumer
		// may not be loaded yet. Let the next sweep send it again.
		p.sentAt = time.Now().Add(-s.timeout)
		s.mu.Unlock()
		return
	}
	var covered []*pendingSettle
	if ok {
		delete(s.pending, id)
		if s.batch && rerr == nil && p.kind != kindNak && !p.sentAt.IsZero() {
			covered = s.coverLocked(p)
		}
	}
	s.mu.Unlock()
	if !ok {
		return // an answer to a re-sent settlement that was already completed
	}
	p.d.settled(rerr)
	for _, q := range covered {
		q.d.settled(nil)
	}
}

// compactSentLocked drops from s.sent the entries no answer needs any more
// (completed, or re-sent since): an answer to a Nak covers nothing, so a
// route that only naks would otherwise grow the list without end. s.mu is
// held.
func (s *settler) compactSentLocked() {
	n := 0
	for _, r := range s.sent {
		if r.p.sendSeq == r.seq && s.pending[r.p.id] == r.p {
			s.sent[n] = r
			n++
		}
	}
	clear(s.sent[n:])
	s.sent = s.sent[:n]
}

// expediteLocked handles an error answer to p (ConfirmBatch): the plain
// settlements sent before it on its connection did not land either (the
// consumer is gone, or not loaded yet), so they are marked for the next
// sweep to re-send (or give up on, after their last re-send) instead of
// waiting AckTimeout for an answer that will not come, and every
// settlement asks for its own answer until one is answered. s.mu is held.
func (s *settler) expediteLocked(p *pendingSettle) {
	s.answered = false
	past := time.Now().Add(-s.timeout)
	for _, r := range s.sent {
		if r.seq >= p.sendSeq {
			break
		}
		q := r.p
		if q.sendSeq == r.seq && q.plain && q.conns == p.conns && s.pending[q.id] == q {
			q.sentAt = past
		}
	}
}

// coverLocked removes from pending and returns the settlements the answer
// to p confirms: those sent before p on the same connection, when no
// reconnect happened since (then they are re-sent instead). It also notes
// that the consumer takes plain acks on this connection. s.mu is held.
func (s *settler) coverLocked(p *pendingSettle) []*pendingSettle {
	conns := s.reconnects()
	if p.conns != conns {
		return nil
	}
	s.answered, s.answeredConns = true, conns
	var covered []*pendingSettle
	n := 0
	for n < len(s.sent) && s.sent[n].seq <= p.sendSeq {
		r := s.sent[n]
		s.sent[n] = sentRef{}
		n++
		q := r.p
		if q == p || q.sendSeq != r.seq || q.conns != conns || s.pending[q.id] != q {
			continue // p itself, re-sent since, sent on an older connection, or done
		}
		delete(s.pending, q.id)
		covered = append(covered, q)
	}
	s.sent = s.sent[n:]
	s.covered.Add(uint64(len(covered)))
	if len(s.pending) == 0 {
		clear(s.sent)
		s.sent = s.sent[:0]
	}
	return covered
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
	s.sent = nil
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
