package natsadapter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestSimulation is a deterministic model of the settlement writer
// (settle.go) against a simulated JetStream consumer answering on $JS.ACK:
// one seed is one reproducible run in which a route handles deliveries and
// settles them (Ack, Term, Nak) while the simulated world delays, drops,
// duplicates and reorders the server's answers, drops the connection
// (frames in flight are lost), restarts the server (the consumer is not
// loaded for a while: plain acks are dropped silently, requests answered
// 503), lets AckWait pass (redeliveries) and cancels settlement contexts.
// The server takes the frames of one connection in order, as a JetStream
// consumer does; answers keep their order per connection but those of an
// old connection may still be read after a reconnect (the client's
// subscription queue outlives the socket).
//
// The writer runs through its seam (settleConn, settleClock): no network,
// no goroutines, virtual time, so a seed replays exactly. Checked at every
// step and at the end:
//
//   - a settlement is counted confirmed only if the server applied it (an
//     Ack or Term: the message is acknowledged on the server; a Nak: the
//     server processed that nak);
//   - a redelivery of an acked message is never handled again (while the
//     Ack or Term of an earlier delivery is outstanding or confirmed, the
//     redelivery is settled by the Source, not handed to the route);
//   - every settlement completes exactly once, and none is left pending
//     once the world is calm; none waits in the writer's queue twice.
//
// SLUICE_SIM_SEED=n replays seed n; SLUICE_SIM_SEEDS=n runs n seeds
// (default 5,000, a few seconds; 100,000 take a few minutes). The default
// seeds include the first that found each bug the model found: a 503
// answer covered by a later answer (seed 98), a plain ack queued twice by
// an error answer and a sweep, its two sends sharing one reply subject
// (seed 39 fails on the queue check, 3,792 on a false confirmation).
func TestSimulation(t *testing.T) {
	seeds := uint64(5000)
	if v := os.Getenv("SLUICE_SIM_SEEDS"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SLUICE_SIM_SEEDS: %v", err)
		}
		seeds = n
	}
	first := uint64(1)
	if v := os.Getenv("SLUICE_SIM_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("SLUICE_SIM_SEED: %v", err)
		}
		first, seeds = n, 1
	}
	var total simTotals
	for seed := first; seed < first+seeds; seed++ {
		w := newSimWorld(seed)
		w.tracing = seeds == 1 // a replay prints the run's last steps
		if err := w.run(); err != nil {
			t.Fatalf("seed %d: %v\n%s\nreplay: SLUICE_SIM_SEED=%d go test ./adapters/nats -run 'TestSimulation$' -v",
				seed, err, w.tail(), seed)
		}
		total.add(w.totals)
	}
	t.Logf("%d seeds: %d settlements (%d confirmed, %d unconfirmed), %d covered by a later answer, %d re-sent, %d redeliveries settled by the Source, %d handled again after an unconfirmed settlement, %d server restarts, %d stale answers",
		seeds, total.settles, total.confirmed, total.failed, total.covered, total.resent, total.redeliveriesSettled, total.handledAgain, total.restarts, total.stale)
}

type simTotals struct {
	settles, confirmed, failed, covered, resent, redeliveriesSettled, handledAgain, restarts, stale uint64
}

func (a *simTotals) add(b simTotals) {
	a.settles += b.settles
	a.confirmed += b.confirmed
	a.failed += b.failed
	a.covered += b.covered
	a.resent += b.resent
	a.redeliveriesSettled += b.redeliveriesSettled
	a.handledAgain += b.handledAgain
	a.restarts += b.restarts
	a.stale += b.stale
}

// simFrame is a settlement on the wire, client to server.
type simFrame struct {
	subj, reply string
	body        []byte
}

// simAnswer is the server's answer to a request, on connection conn.
type simAnswer struct {
	m    *nats.Msg
	conn uint64
}

// simMsg is a stream message as the simulated server holds it.
type simMsg struct {
	applied bool // acknowledged (Ack or Term applied)
	out     bool // delivered, waiting for its settlement or AckWait
	dels    []*simDelivery
}

// simDelivery is one delivery handed to the route.
type simDelivery struct {
	w        *simWorld
	id       int
	seq      int
	p        pendingSettle
	kind     settleKind
	settling bool
	done     int   // settled calls
	err      error // outcome
	cancel   context.CancelFunc
}

func (d *simDelivery) generation() uint32 { return 0 }

func (d *simDelivery) settled(err error) {
	w := d.w
	d.done++
	d.err = err
	if d.done > 1 {
		w.fail("delivery %d (seq %d) settled %d times", d.id, d.seq, d.done)
		return
	}
	if err != nil {
		w.totals.failed++
		w.logf("settled d%d seq %d %v: %v", d.id, d.seq, d.kind, err)
		return
	}
	w.totals.confirmed++
	w.logf("settled d%d seq %d %v: confirmed", d.id, d.seq, d.kind)
	// A settlement is counted confirmed only if the server applied it.
	switch d.kind {
	case kindNak:
		if !w.nakApplied[d.id] {
			w.fail("nak of delivery %d (seq %d) counted confirmed, but the server never processed it", d.id, d.seq)
		}
	default:
		if !w.msgs[d.seq].applied {
			w.fail("%v of delivery %d (seq %d) counted confirmed, but the server never applied it", d.kind, d.id, d.seq)
		}
	}
}

func (k settleKind) String() string {
	switch k {
	case kindNak:
		return "nak"
	case kindTerm:
		return "term"
	}
	return "ack"
}

// simTimer is the sweep's timer in virtual time.
type simTimer struct {
	w     *simWorld
	at    time.Time
	armed bool
	f     func()
}

func (t *simTimer) Reset(d time.Duration) bool {
	was := t.armed
	t.at, t.armed = t.w.now.Add(d), true
	return was
}

func (t *simTimer) Stop() bool {
	was := t.armed
	t.armed = false
	return was
}

// simWorld is one seed's run: the route, the connection and the server.
type simWorld struct {
	rng *rand.Rand
	now time.Time
	set *settler

	// The connection.
	conns     uint64 // reconnect count
	connected bool
	inbound   []simFrame // written on the current connection, not yet read by the server
	buffered  []simFrame // written while disconnected: flushed on the next connection
	cb        nats.MsgHandler
	answers   map[uint64][]simAnswer // per connection, in order
	timer     *simTimer
	spawned   []func()

	// The server.
	loaded     bool // the consumer is loaded (false for a while after a restart)
	msgs       []simMsg
	nakApplied map[int]bool

	// The route.
	held       []*simDelivery // handled, not yet settled
	deliveries []*simDelivery

	totals  simTotals
	err     error
	tracing bool
	trace   []string
}

func newSimWorld(seed uint64) *simWorld {
	w := &simWorld{
		rng:        rand.New(rand.NewPCG(seed, seed^0x5eed)),
		now:        time.Unix(1_700_000_000, 0),
		connected:  true,
		loaded:     true,
		answers:    map[uint64][]simAnswer{},
		nakApplied: map[int]bool{},
	}
	w.msgs = make([]simMsg, 1+4+w.rng.IntN(40))
	timeout := time.Duration(50+w.rng.IntN(200)) * time.Millisecond
	w.set = newSettler(w, settleClock{
		now: func() time.Time { return w.now },
		afterFunc: func(d time.Duration, f func()) settleTimer {
			w.timer = &simTimer{w: w, at: w.now.Add(d), armed: true, f: f}
			return w.timer
		},
		spawn: func(f func()) { w.spawned = append(w.spawned, f) },
	}, timeout, w.rng.IntN(4) != 0)
	w.set.resends = w.rng.IntN(maxSends)
	return w
}

// settleConn, simulated.

func (w *simWorld) Publish(subj string, data []byte) error {
	return w.PublishRequest(subj, "", data)
}

func (w *simWorld) PublishRequest(subj, reply string, data []byte) error {
	f := simFrame{subj: subj, reply: reply, body: data}
	w.logf("client: %s on %s reply %q (%s)", data, subj, reply, map[bool]string{true: "sent", false: "buffered"}[w.connected])
	if w.connected {
		w.inbound = append(w.inbound, f)
	} else {
		w.buffered = append(w.buffered, f)
	}
	return nil
}

func (w *simWorld) NewInbox() string   { return "_INBOX.sim" }
func (w *simWorld) IsConnected() bool  { return w.connected }
func (w *simWorld) reconnects() uint64 { return w.conns }

func (w *simWorld) subscribe(subj string, cb nats.MsgHandler) (func() error, error) {
	if subj != "_INBOX.sim.*.*" {
		w.fail("reply subscription on %q", subj)
	}
	w.cb = cb
	return func() error { return nil }, nil
}

func (w *simWorld) logf(format string, args ...any) {
	if !w.tracing {
		return
	}
	if len(w.trace) == 400 {
		w.trace = w.trace[200:]
	}
	w.trace = append(w.trace, fmt.Sprintf("%s %s", w.now.Format("05.000"), fmt.Sprintf(format, args...)))
}

func (w *simWorld) tail() string {
	tr := w.trace
	if len(tr) > 60 {
		tr = tr[len(tr)-60:]
	}
	return strings.Join(tr, "\n")
}

func (w *simWorld) fail(format string, args ...any) {
	if w.err == nil {
		w.err = fmt.Errorf(format, args...)
	}
}

// run plays the seed: a random phase, then a calm one in which everything
// outstanding must complete.
func (w *simWorld) run() error {
	steps := 200 + w.rng.IntN(600)
	for i := 0; i < steps && w.err == nil; i++ {
		w.step()
		w.checkQueue()
	}
	// Calm: connected, consumer loaded, every answer delivered, time
	// passing, until nothing is outstanding.
	for _, d := range w.held {
		w.finish(d)
	}
	w.held = nil
	if !w.connected {
		w.reconnect()
	}
	w.loaded = true
	for i := 0; i < 1000 && w.err == nil; i++ {
		w.runWriters()
		w.serve(len(w.inbound))
		for w.deliverAnswer(false) {
		}
		w.set.mu.Lock()
		n := len(w.set.pending) + len(w.set.queue)
		w.set.mu.Unlock()
		if n == 0 && len(w.spawned) == 0 {
			break
		}
		w.tick(w.set.sweepEvery())
	}
	if w.err != nil {
		return w.err
	}
	for _, d := range w.deliveries {
		if d.settling && d.done != 1 {
			return fmt.Errorf("delivery %d (seq %d): settlement completed %d times after the calm phase", d.id, d.seq, d.done)
		}
	}
	w.totals.resent = w.set.resent.Load()
	w.totals.covered = w.set.covered.Load()
	return nil
}

// checkQueue: a settlement waits in the writer's queue at most once (a
// second entry is sent twice, and the second send's number overwrites the
// first's).
func (w *simWorld) checkQueue() {
	w.set.mu.Lock()
	defer w.set.mu.Unlock()
	q := w.set.queue
	for i, p := range q {
		for _, o := range q[:i] {
			if o == p {
				w.fail("settlement %d queued twice", p.id)
			}
		}
	}
}

func (w *simWorld) step() {
	switch r := w.rng.IntN(100); {
	case r < 18:
		w.deliver()
	case r < 36:
		if len(w.held) > 0 {
			i := w.rng.IntN(len(w.held))
			d := w.held[i]
			w.held = append(w.held[:i], w.held[i+1:]...)
			w.finish(d)
		}
	case r < 50:
		w.runWriters()
	case r < 64:
		w.serve(1 + w.rng.IntN(4))
	case r < 80:
		w.deliverAnswer(true)
	case r < 88:
		w.tick(time.Duration(w.rng.Int64N(int64(w.set.timeout))))
	case r < 91:
		w.ackWait()
	case r < 93:
		w.disconnect()
	case r < 97:
		if !w.connected {
			w.reconnect()
		}
	case r < 98:
		if !w.loaded {
			w.loaded = true
			w.logf("consumer loaded")
		}
	default:
		// Cancel the ctx of a settlement in flight.
		for _, d := range w.deliveries {
			if d.cancel != nil && d.settling && d.done == 0 && w.rng.IntN(3) == 0 {
				d.cancel()
				w.logf("ctx of d%d cancelled", d.id)
				break
			}
		}
	}
}

// deliver hands the route a message the server may deliver, as
// Source.take does: a redelivery whose Ack or Term is still outstanding is
// settled with it at once and not handed over.
func (w *simWorld) deliver() {
	var can []int
	for seq := 1; seq < len(w.msgs); seq++ {
		if m := &w.msgs[seq]; !m.applied && !m.out && w.loaded && w.connected {
			can = append(can, seq)
		}
	}
	if len(can) == 0 {
		return
	}
	seq := can[w.rng.IntN(len(can))]
	m := &w.msgs[seq]
	m.out = true
	d := &simDelivery{w: w, id: len(w.deliveries), seq: seq}
	w.deliveries = append(w.deliveries, d)
	subj := fmt.Sprintf("$JS.ACK.S.C.%d.%d", seq, d.id)
	if len(m.dels) > 0 {
		if body, ok := w.set.outstanding(uint64(seq)); ok {
			w.totals.redeliveriesSettled++
			w.logf("redelivery d%d of seq %d settled by the Source (%s)", d.id, seq, body)
			_ = w.Publish(subj, body)
			m.dels = append(m.dels, d)
			return
		}
		// A redelivery of an acked message is never handled again.
		for _, e := range m.dels {
			if e.settling && e.kind != kindNak && (e.done == 0 || e.err == nil) {
				w.fail("redelivery d%d of seq %d handed to the route while the %v of d%d is %s", d.id, seq, e.kind, e.id, map[bool]string{true: "outstanding", false: "confirmed"}[e.done == 0])
			}
		}
		w.totals.handledAgain++
	}
	m.dels = append(m.dels, d)
	d.p.subj = subj
	w.held = append(w.held, d)
	w.logf("delivered d%d seq %d", d.id, seq)
}

// finish settles a handled delivery.
func (w *simWorld) finish(d *simDelivery) {
	r := w.rng.IntN(10)
	d.kind = kindAck
	switch {
	case r == 0:
		d.kind = kindNak
	case r == 1:
		d.kind = kindTerm
	}
	var delay time.Duration
	if d.kind == kindNak && w.rng.IntN(2) == 0 {
		delay = time.Second
	}
	ctx := context.Background()
	if w.rng.IntN(10) == 0 {
		ctx, d.cancel = context.WithCancel(ctx)
	}
	d.settling = true
	d.p = pendingSettle{subj: d.p.subj, body: settleBody(d.kind, delay, "sim"), kind: d.kind, confirm: true, seq: uint64(d.seq), d: d}
	w.totals.settles++
	w.logf("settle d%d seq %d %v", d.id, d.seq, d.kind)
	w.set.settle(ctx, &d.p)
}

func (w *simWorld) runWriters() {
	for len(w.spawned) > 0 && w.err == nil {
		f := w.spawned[0]
		w.spawned = w.spawned[1:]
		f()
	}
}

// serve lets the server read up to n frames of the current connection, in
// order.
func (w *simWorld) serve(n int) {
	for ; n > 0 && len(w.inbound) > 0 && w.connected; n-- {
		f := w.inbound[0]
		w.inbound = w.inbound[1:]
		w.apply(f)
	}
}

func (w *simWorld) apply(f simFrame) {
	var seq, did int
	if _, err := fmt.Sscanf(f.subj, "$JS.ACK.S.C.%d.%d", &seq, &did); err != nil {
		w.fail("frame on %q: %v", f.subj, err)
		return
	}
	body := string(f.body)
	if !w.loaded {
		// No consumer: a plain ack is dropped silently, a request gets
		// 503 no responders.
		w.logf("server: consumer not loaded, %s of seq %d (d%d) dropped, reply %q", body, seq, did, f.reply)
		if f.reply != "" {
			m := &nats.Msg{Subject: f.reply, Header: nats.Header{"Status": []string{"503"}}}
			w.answers[w.conns] = append(w.answers[w.conns], simAnswer{m: m, conn: w.conns})
		}
		return
	}
	m := &w.msgs[seq]
	switch {
	case strings.HasPrefix(body, "+ACK"), strings.HasPrefix(body, "+TERM"):
		m.applied = true
		m.out = false
	case strings.HasPrefix(body, "-NAK"):
		w.nakApplied[did] = true
		if !m.applied && m.dels[len(m.dels)-1].id == did {
			m.out = false
		}
	}
	w.logf("server: applied %s of seq %d (d%d), reply %q", body, seq, did, f.reply)
	if f.reply != "" {
		w.answers[w.conns] = append(w.answers[w.conns], simAnswer{m: &nats.Msg{Subject: f.reply}, conn: w.conns})
	}
}

// deliverAnswer hands the client the first answer of a connection, chosen
// at random when random (else the oldest connection's). The answers of one
// connection stay in order; a few are delivered twice.
func (w *simWorld) deliverAnswer(random bool) bool {
	var conns []uint64
	for c, q := range w.answers {
		if len(q) > 0 {
			conns = append(conns, c)
		}
	}
	if len(conns) == 0 {
		return false
	}
	c := conns[0]
	for _, x := range conns {
		if x < c {
			c = x
		}
	}
	if random {
		// Map order is not deterministic: pick by sorted position.
		sortU64(conns)
		c = conns[w.rng.IntN(len(conns))]
	}
	a := w.answers[c][0]
	if random && w.rng.IntN(20) == 0 {
		w.logf("answer %s (conn %d) duplicated", a.m.Subject, c)
	} else {
		w.answers[c] = w.answers[c][1:]
	}
	if c != w.conns {
		w.totals.stale++
	}
	w.logf("answer %s status %q (conn %d, now conn %d)", a.m.Subject, a.m.Header.Get("Status"), c, w.conns)
	if w.cb == nil {
		w.fail("an answer without a reply subscription")
		return false
	}
	w.cb(a.m)
	return true
}

func sortU64(s []uint64) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j] < s[j-1]; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// tick advances virtual time by d and fires the sweep when due.
func (w *simWorld) tick(d time.Duration) {
	w.now = w.now.Add(d)
	if t := w.timer; t != nil && t.armed && !t.at.After(w.now) {
		t.armed = false
		t.f()
	}
}

// ackWait: the server gives up waiting for a delivery's settlement and
// may deliver the message again.
func (w *simWorld) ackWait() {
	for seq := 1; seq < len(w.msgs); seq++ {
		if m := &w.msgs[seq]; m.out && !m.applied && w.rng.IntN(3) == 0 {
			m.out = false
			w.logf("server: AckWait passed for seq %d", seq)
		}
	}
}

// disconnect drops the connection: the server reads part of what is in
// flight and loses the rest; the client has read part of the answers on
// their way and loses the rest. Half the time the server restarts, and
// its consumer is not loaded until later.
func (w *simWorld) disconnect() {
	if !w.connected {
		return
	}
	w.serve(w.rng.IntN(len(w.inbound) + 1))
	w.logf("disconnect: %d frames lost", len(w.inbound))
	w.inbound = nil
	w.connected = false
	if q := w.answers[w.conns]; len(q) > 0 {
		w.answers[w.conns] = q[:w.rng.IntN(len(q)+1)]
	}
	if w.rng.IntN(2) == 0 {
		w.loaded = false
		w.totals.restarts++
		w.logf("server restarts")
		// AckWait of what was out passes while the server is down.
		for seq := 1; seq < len(w.msgs); seq++ {
			if m := &w.msgs[seq]; m.out && !m.applied && w.rng.IntN(2) == 0 {
				m.out = false
			}
		}
	}
}

func (w *simWorld) reconnect() {
	w.conns++
	w.connected = true
	w.inbound, w.buffered = w.buffered, nil
	w.logf("reconnect: conn %d, %d buffered frames", w.conns, len(w.inbound))
}

// TestLateAnswerToFirstSendCoversNothingSentAfterIt replays, step by step,
// the ConfirmBatch hole of issue 24 (item 5): an ack re-sent after a
// reconnect kept its reply subject, so a late answer to its first send
// (read from the old connection after the reconnect) counted as an answer
// on the new connection, told the writer the consumer there takes plain
// acks while it was not loaded yet, and a later answer then confirmed a
// plain ack the server had dropped. Each send now has its own reply
// subject: the late answer confirms its settlement only.
func TestLateAnswerToFirstSendCoversNothingSentAfterIt(t *testing.T) {
	w := newSimWorld(1)
	w.set.batch, w.set.resends, w.set.timeout = true, 2, 100*time.Millisecond
	handle := func(seq int) *simDelivery {
		d := &simDelivery{w: w, id: len(w.deliveries), seq: seq}
		w.deliveries = append(w.deliveries, d)
		w.msgs[seq].out = true
		w.msgs[seq].dels = append(w.msgs[seq].dels, d)
		d.p.subj = fmt.Sprintf("$JS.ACK.S.C.%d.%d", seq, d.id)
		return d
	}
	ack := func(ds ...*simDelivery) {
		for _, d := range ds {
			d.kind, d.settling = kindAck, true
			d.p = pendingSettle{subj: d.p.subj, body: bodyAck, kind: kindAck, confirm: true, seq: uint64(d.seq), d: d}
			w.set.settle(context.Background(), &d.p)
		}
		w.runWriters()
	}
	// Connection 0: an answer tells the writer the consumer takes plain acks.
	ack(handle(1))
	w.serve(len(w.inbound))
	w.deliverAnswer(false)
	// p asks for an answer; the server applies it, the answer is on its way.
	p := handle(2)
	ack(p)
	w.serve(1)
	// The connection drops (the server restarts) before anything else is read.
	w.connected, w.inbound, w.loaded = false, nil, false
	w.reconnect()
	w.tick(w.set.sweepEvery()) // re-sends p on the new connection
	w.runWriters()
	if p.p.nsends != 2 {
		t.Fatalf("p sent %d times, want 2", p.p.nsends)
	}
	// The late answer to p's first send arrives now.
	w.deliverAnswer(false)
	if p.done != 1 || p.err != nil {
		t.Fatalf("p: %d outcomes, %v (the server applied its first send)", p.done, p.err)
	}
	// Two acks on the new connection: the first is read while the
	// consumer is still not loaded, the second once it is.
	q1, q2 := handle(3), handle(4)
	ack(q1, q2)
	w.serve(2) // p's re-send and q1: dropped, the consumer is not loaded
	w.loaded = true
	w.serve(len(w.inbound))
	for w.deliverAnswer(false) {
	}
	if w.err != nil {
		t.Fatal(w.err)
	}
	if q1.done == 1 && q1.err == nil && !w.msgs[3].applied {
		t.Fatal("q1 counted confirmed, never applied")
	}
	t.Logf("q1: %d outcomes (%v), applied %v; q2: %v", q1.done, q1.err, w.msgs[3].applied, q2.err)
}
