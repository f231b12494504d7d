package natsadapter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
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
	id      uint64 // the settlement's key in settler.pending, 0 when not confirmed
	ctx     context.Context
	sentAt  time.Time
	conns   uint64 // the connection's reconnect count when last sent
	sendSeq uint64 // the writer's send order when last sent
	resends int
	// sends are the sends that asked for an answer, oldest first: each
	// carries its own reply subject (<inbox>.<id>.<send>), so an answer
	// names the send it answers and covers only what was sent before that
	// send, on that send's connection.
	sends  [maxSends]sendMark
	nsends int
	// d is told the outcome exactly once (d.settled), outside settler.mu.
	d settleDone
}

// maxSends bounds pendingSettle.sends: the first send and its re-sends.
const maxSends = 4

// sendMark is one send of a settlement that asked for an answer.
type sendMark struct {
	seq   uint64 // settler.sendSeq of the send
	conns uint64 // the connection's reconnect count when sent
}

// settleDone is told the outcome of a settlement (a *delivery; the
// simulation's own messages in tests).
type settleDone interface {
	settled(err error)
	// generation is the consumer generation the message was delivered by.
	generation() uint32
}

// settleConn is what the settler uses of the connection. natsConn is the
// real one; the simulation (settle_sim_test.go) supplies a simulated
// connection and server, so it drives the writer without a network.
type settleConn interface {
	Publish(subj string, data []byte) error
	PublishRequest(subj, reply string, data []byte) error
	NewInbox() string
	IsConnected() bool
	// reconnects counts the connection's reconnects: it changes before
	// anything written after a reconnect reaches the server.
	reconnects() uint64
	// subscribe delivers the messages on subj to cb, in order.
	subscribe(subj string, cb nats.MsgHandler) (unsubscribe func() error, err error)
}

// settleClock is the settler's time: the wall clock, or the simulation's.
type settleClock struct {
	now       func() time.Time
	afterFunc func(time.Duration, func()) settleTimer
	// spawn starts the writer goroutine.
	spawn func(func())
}

// settleTimer is the part of *time.Timer the sweep uses.
type settleTimer interface {
	Reset(time.Duration) bool
	Stop() bool
}

var wallClock = settleClock{
	now:       time.Now,
	afterFunc: func(d time.Duration, f func()) settleTimer { return time.AfterFunc(d, f) },
	spawn:     func(f func()) { go f() },
}

type natsConn struct{ *nats.Conn }

func (c natsConn) reconnects() uint64 { return c.Stats().Reconnects }

func (c natsConn) subscribe(subj string, cb nats.MsgHandler) (func() error, error) {
	sub, err := c.Subscribe(subj, cb)
	if err != nil {
		return nil, err
	}
	// The server answers every settlement it gets; the window bounds how
	// many are outstanding, so the client's default limits never bind,
	// but a slow consumer must not drop replies silently: no limit.
	_ = sub.SetPendingLimits(-1, -1)
	return sub.Unsubscribe, nil
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
// since they were sent. Naks always ask for their own answer. Every send
// that asks for an answer has its own reply subject (<inbox>.<id>.<send>):
// a late answer to the first send of a settlement that was re-sent since
// confirms that settlement and covers only what went before that first
// send on its connection, never what was sent after it. A send answered
// with an error (503: the consumer is not loaded yet) is covered by no
// later answer: it is re-sent or completes with the error.
type settler struct {
	nc      settleConn
	clock   settleClock
	timeout time.Duration
	resends int
	// batch: ConfirmBatch (see above).
	batch bool
	// replyBuf builds reply subjects; seqs holds the send numbers of the
	// batch being written (writer only).
	replyBuf []byte
	seqs     []uint64

	mu      sync.Mutex
	queue   []*pendingSettle
	spare   []*pendingSettle
	writing bool
	closed  bool
	inbox   string
	unsub   func() error // the reply subscription's; nil until made
	nextID  uint64
	pending map[uint64]*pendingSettle
	sweep   settleTimer
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

func newSettler(nc settleConn, clock settleClock, timeout time.Duration, batch bool) *settler {
	return &settler{nc: nc, clock: clock, timeout: timeout, resends: 2, batch: batch, pending: map[uint64]*pendingSettle{}}
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
		if s.unsub == nil {
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
				s.sweep = s.clock.afterFunc(s.sweepEvery(), s.doSweep)
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
	s.clock.spawn(s.write)
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
		now := s.clock.now()
		var conns uint64
		if len(s.pending) > 0 {
			conns = s.nc.reconnects()
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
		s.seqs = s.seqs[:0]
		for i, p := range q {
			if p.id != 0 {
				s.sendSeq++
				p.sentAt, p.conns, p.sendSeq = now, conns, s.sendSeq
				p.plain = plain && i < last && p.kind != kindNak
				if !p.plain {
					if p.nsends == maxSends {
						copy(p.sends[:], p.sends[1:])
						p.nsends--
					}
					p.sends[p.nsends] = sendMark{seq: p.sendSeq, conns: conns}
					p.nsends++
				}
				if s.batch {
					s.sent = append(s.sent, sentRef{p, p.sendSeq})
				}
			}
			s.seqs = append(s.seqs, p.sendSeq)
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
				// One allocation for the reply subject:
				// <inbox>.<id base 36>.<send base 36>, the send as
				// numbered above (s.seqs: p.sendSeq may have moved on).
				b := strconv.AppendUint(append(append(s.replyBuf[:0], inbox...), '.'), p.id, 36)
				s.replyBuf = strconv.AppendUint(append(b, '.'), s.seqs[i], 36)
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

// subscribeLocked makes the reply subscription. s.mu is held.
func (s *settler) subscribeLocked() error {
	inbox := s.nc.NewInbox()
	unsub, err := s.nc.subscribe(inbox+".*.*", s.reply)
	if err != nil {
		return fmt.Errorf("natsadapter: ack reply subscription: %w", err)
	}
	s.inbox, s.unsub = inbox, unsub
	return nil
}

// parseReply reads the settlement key and the send of an answer's subject
// (<inbox>.<id>.<send>, base 36).
func parseReply(subj string) (id, send uint64, ok bool) {
	i := strings.LastIndexByte(subj, '.')
	if i < 0 {
		return 0, 0, false
	}
	j := strings.LastIndexByte(subj[:i], '.')
	if j < 0 {
		return 0, 0, false
	}
	id, err := strconv.ParseUint(subj[j+1:i], 36, 64)
	if err != nil {
		return 0, 0, false
	}
	send, err = strconv.ParseUint(subj[i+1:], 36, 64)
	if err != nil {
		return 0, 0, false
	}
	return id, send, true
}

// sendOf returns the send of p with sequence seq. s.mu is held.
func (p *pendingSettle) sendOf(seq uint64) (sendMark, bool) {
	for _, m := range p.sends[:p.nsends] {
		if m.seq == seq {
			return m, true
		}
	}
	return sendMark{}, false
}

// reply completes the settlement the server answered. The answer names the
// send it answers: an answer to an earlier send of a settlement that was
// re-sent since confirms the settlement (the server applied that send) and
// covers only what went before that send on its connection, never what was
// sent after it.
func (s *settler) reply(m *nats.Msg) {
	id, seq, ok := parseReply(m.Subject)
	if !ok {
		return
	}
	rerr := replyErr(m)
	s.mu.Lock()
	p, ok := s.pending[id]
	var send sendMark
	if ok {
		send, ok = p.sendOf(seq)
	}
	if !ok {
		s.mu.Unlock()
		return // an answer to a settlement already completed, or to no send of it
	}
	latest := seq == p.sendSeq && !p.sentAt.IsZero()
	if rerr != nil && s.batch {
		// The plain acks sent before this send met the same fate: re-send
		// them at the next sweep, each asking for its own answer.
		s.expediteLocked(send)
	}
	if rerr != nil && seq == p.sendSeq {
		// No answer covers a send that failed (p.sendSeq 0 matches no
		// send in s.sent): a consumer loaded since answers the
		// settlements sent after this one, not this one.
		p.sendSeq = 0
	}
	if rerr != nil && !latest {
		// An error to an earlier send: the settlement was sent again since
		// (or is queued to be), and that send gets its own answer.
		s.mu.Unlock()
		return
	}
	if rerr != nil && m.Header.Get("Status") == "503" && p.kind != kindNak && p.resends < s.resends {
		// No consumer took it: right after a server restart the consumer
		// may not be loaded yet. Let the next sweep send it again.
		p.sentAt = s.clock.now().Add(-s.timeout)
		s.mu.Unlock()
		return
	}
	var covered []*pendingSettle
	delete(s.pending, id)
	if s.batch && rerr == nil && p.kind != kindNak {
		covered = s.coverLocked(p, send)
	}
	s.mu.Unlock()
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

// expediteLocked handles an error answer to send (ConfirmBatch): the plain
// settlements sent before it on its connection did not land either (the
// consumer is gone, or not loaded yet), so they are marked for the next
// sweep to re-send (or give up on, after their last re-send) instead of
// waiting AckTimeout for an answer that will not come, and every
// settlement asks for its own answer until one is answered. s.mu is held.
func (s *settler) expediteLocked(send sendMark) {
	s.answered = false
	past := s.clock.now().Add(-s.timeout)
	for _, r := range s.sent {
		if r.seq >= send.seq {
			break
		}
		q := r.p
		// q.sentAt zero: queued to be re-sent already (marking it would let
		// the next sweep queue it a second time).
		if q.sendSeq == r.seq && q.plain && q.conns == send.conns && !q.sentAt.IsZero() && s.pending[q.id] == q {
			q.sentAt = past
		}
	}
}

// coverLocked removes from pending and returns the settlements the answer
// to send (of p) confirms: those sent before that send on the same
// connection, when no reconnect happened since (then they are re-sent
// instead). It also notes that the consumer takes plain acks on this
// connection. s.mu is held.
func (s *settler) coverLocked(p *pendingSettle, send sendMark) []*pendingSettle {
	conns := s.nc.reconnects()
	if send.conns != conns {
		return nil
	}
	s.answered, s.answeredConns = true, conns
	var covered []*pendingSettle
	n := 0
	for n < len(s.sent) && s.sent[n].seq <= send.seq {
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
	// Moved to the front rather than resliced: s.sent[n:] would lose the
	// array's first n slots for good, and the writer's appends would then
	// grow a new array every few answers (35 B per message in a profile).
	s.sent = append(s.sent[:0], s.sent[n:]...)
	clear(s.sent[len(s.sent):cap(s.sent)][:n])
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
	now := s.clock.now()
	var failed []*pendingSettle
	var causes []error
	s.mu.Lock()
	if s.closed {
		s.sweeping = false
		s.mu.Unlock()
		return
	}
	conns := s.nc.reconnects()
	connected := s.nc.IsConnected()
	var resend []*pendingSettle
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
		resend = append(resend, p)
	}
	// Re-send in the order first settled (the map's order is random, and
	// the simulation replays a seed exactly).
	slices.SortFunc(resend, func(a, b *pendingSettle) int { return cmp.Compare(a.id, b.id) })
	s.queue = append(s.queue, resend...)
	s.resent.Add(uint64(len(resend)))
	startWriter := len(resend) > 0 && !s.writing
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
		s.clock.spawn(s.write)
	}
	s.unconfirmed.Add(uint64(len(failed)))
	order := make([]int, len(failed))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return cmp.Compare(failed[a].id, failed[b].id) })
	for _, i := range order {
		failed[i].d.settled(causes[i])
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
		if p.d.generation() < gen {
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
	unsub := s.unsub
	s.unsub = nil
	s.sent = nil
	s.mu.Unlock()
	s.unconfirmed.Add(uint64(len(failed)))
	for _, p := range failed {
		p.d.settled(fmt.Errorf("%w: source closed", ErrAckUnconfirmed))
	}
	if unsub == nil {
		return nil
	}
	err := unsub()
	if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrBadSubscription) {
		return nil
	}
	return err
}
