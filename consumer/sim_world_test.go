package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
)

// The simulated world of one run: a broker per route (simSource, with an
// Acker per delivery), a dead-letter store (simSink), the handlers and a
// Hook, all recording what they saw for the checker (sim_check_test.go).
// Every behaviour is drawn from the seed by what it concerns (a delivery,
// its n-th run, its n-th write), not by the order things happen in, so a
// seed replays the same world whatever the scheduling.

const deliveryHeader = "Sim-Delivery"

var (
	errSimFetch   = errors.New("sim: fetch failed")
	errSimSettle  = errors.New("sim: settlement refused")
	errSimSink    = errors.New("sim: dead-letter store down")
	errSimHandler = errors.New("sim: handler failed")
)

// simWorld is one run. mu guards everything below it.
type simWorld struct {
	cfg    *simConfig
	start  time.Time
	budget *backpressure.Budget
	heal   chan struct{} // closed: every fault stops, every hang ends

	mu sync.Mutex
	// overtaken: (earlier, later) pairs of an ordered key where the later
	// started while the earlier was neither settled nor lettered; judged
	// once the run is over (overtakenOnlyByWhatNeverRuns).
	overtaken [][2]*simDelivery
	// riders: (earlier, later) pairs of an ordered key that ran in one
	// batch (ridersNotAckedAheadOfTheirKey).
	riders             []simRiders
	seq                int64 // orders the records
	healed             bool
	routes             []*simBroker
	deliveries         map[*consumer.Message]*simDelivery
	byID               map[string]*simDelivery
	all                []*simDelivery
	ignoring           int       // ctx-ignoring calls (handlers, sink writes) under way
	hungExpired        int       // ctx-ignoring sink writes of expired letters under way
	hungExpiredLetters int       // hungExpired when Run overran its limit
	stopAt             time.Time // when Run's ctx ended (zero: not yet)
	returnedAt         time.Time
	violations         []violation
}

type violation struct {
	invariant string
	detail    string
	known     string // the known bug it shows (sim_known_test.go), "" none
}

func (w *simWorld) failf(invariant, format string, args ...any) {
	if len(w.violations) < 20 {
		w.violations = append(w.violations, violation{invariant: invariant, detail: fmt.Sprintf(format, args...)})
	}
}

func (w *simWorld) now() time.Duration { return time.Since(w.start) }

// tick returns the next record number; w.mu held.
func (w *simWorld) tick() int64 { w.seq++; return w.seq }

// simLogical is one message in a broker.
type simLogical struct {
	spec       *simMsg
	route      int
	arrived    bool
	available  bool      // may be fetched (at or after notBefore)
	notBefore  time.Time //
	deliveries int       // broker's delivery count
	latest     *simDelivery
	done       bool   // acked or terminated on the broker
	lost       string // why the broker gave up on it ("" not)
	dlqFailed  bool   // a delivery ended DLQFailed: the next is only written
	refused    bool   // the broker refused a settlement of it (it redelivers on its own)
}

// simDelivery is one delivery of a logical message: the Acker and everything
// seen of it.
type simDelivery struct {
	w        *simWorld
	id       string
	lg       *simLogical
	attempt  int // the broker's delivery count
	last     bool
	m        *consumer.Message
	fetched  time.Time
	fetchSeq int64
	deadline time.Time // as the header says (zero: none)

	settles     []simSettle
	keepAlives  []time.Time
	runs        []simRun
	running     int
	settled     *simEvent // the hook's EventSettled
	events      []simEvent
	letterTries int
	lettered    int64 // seq of the first successful letter write (0: none)
	letterClass string
	letterStart int64     // seq of the first write's start
	letterTried string    // the class of the first write
	confirmed   bool      // the broker has its settlement
	spun        bool      // more events than the Hook records
	batch       *simBatch // the batch it runs in (nil: none, or a Handler's run)
}

// simRiders is an earlier (o, its run) and a later (d) message of a key
// that ran in one batch.
type simRiders struct {
	o, d *simDelivery
	run  int
}

// simBatch is one run of a BatchHandler: its deliveries in the batch's
// order.
type simBatch struct {
	ds []*simDelivery
}

// in reports whether d runs in b before position j.
func (b *simBatch) before(o *simDelivery, j int) bool {
	for _, x := range b.ds[:j] {
		if x == o {
			return true
		}
	}
	return false
}

type simSettle struct {
	at   time.Time
	seq  int64
	s    consumer.Settlement
	err  error // what Settle returned
	ctxd bool
}

type simRun struct {
	start, end time.Time
	seq        int64
	attempt    int
	action     string
	err        error
	ended      bool
	// held: a batch's run whose result was not applied (an earlier
	// message of its key in the batch failed: the route put it back to
	// run again after that one).
	held bool
}

type simEvent struct {
	e   consumer.Event
	at  time.Time
	seq int64
}

// simBroker is a route's broker and its Source.
type simBroker struct {
	w       *simWorld
	r       *simRoute
	info    consumer.SourceInfo
	topic   string
	msgs    []*simLogical
	fetches int
	closed  bool
	closeAt time.Time
	wake    chan struct{}
}

func newWorld(cfg *simConfig) *simWorld {
	w := &simWorld{cfg: cfg, start: time.Now(), heal: make(chan struct{}),
		deliveries: map[*consumer.Message]*simDelivery{}, byID: map[string]*simDelivery{}}
	for _, r := range cfg.Routes {
		b := &simBroker{w: w, r: r, topic: fmt.Sprintf("t%d", r.Index), wake: make(chan struct{}, 1),
			info: consumer.SourceInfo{AckWait: r.AckWait, MaxDeliver: r.MaxDeliver}}
		for i := range r.Msgs {
			b.msgs = append(b.msgs, &simLogical{spec: &r.Msgs[i], route: r.Index})
		}
		w.routes = append(w.routes, b)
	}
	return w
}

func (w *simWorld) healedNow() bool {
	select {
	case <-w.heal:
		return true
	default:
		return false
	}
}

// sleep waits d, or until the world heals (hang = true) or ctx ends
// (honour = true); it reports whether it waited the whole d.
func (w *simWorld) sleep(ctx context.Context, d time.Duration, honour bool) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	done := ctx.Done()
	if !honour {
		done = nil
	}
	select {
	case <-t.C:
		return true
	case <-done:
		return false
	case <-w.heal:
		return false
	}
}

// ---- Source ----

func (b *simBroker) Attach(l consumer.RouteLimits) (consumer.SourceInfo, error) {
	return b.info, nil
}

func (b *simBroker) Fetch(ctx context.Context, maxMessages int, maxBytes int64) ([]*consumer.Message, error) {
	w := b.w
	w.mu.Lock()
	k := b.fetches
	b.fetches++
	closed := b.closed
	w.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("sim: %w", consumer.ErrClosed)
	}
	g := simRand(w.cfg.Seed, tagFetch, uint64(b.r.Index), uint64(k))
	healed := w.healedNow()
	switch x := g.IntN(100); {
	case healed:
	case x < 1 && w.cfg.has(fSourceClosed) && k > 3:
		w.mu.Lock()
		if ctx.Err() == nil {
			b.closed, b.closeAt = true, time.Now()
		}
		w.mu.Unlock()
		return nil, fmt.Errorf("sim: %w", consumer.ErrClosed)
	case x < 6 && w.cfg.has(fFetchError):
		if x < 3 {
			msgs := b.take(maxMessages, maxBytes, g)
			return msgs, errSimFetch
		}
		return nil, errSimFetch
	case x < 8 && w.cfg.has(fFetchError):
		<-ctx.Done() // a long poll that ends with ctx
		return nil, ctx.Err()
	}
	poll := time.NewTimer(50 * time.Millisecond)
	defer poll.Stop()
	done := ctx.Done()
	deaf := w.cfg.has(fDeafFetch) && g.IntN(2) == 0 && !healed
	for {
		if msgs := b.take(maxMessages, maxBytes, g); len(msgs) > 0 {
			if done == nil {
				// Deaf, after ctx ended: the response is on its way while
				// the route goes on stopping.
				time.Sleep(durBetween(g, 0, 5*time.Millisecond))
			}
			return msgs, nil
		}
		var t <-chan time.Time
		var tm *time.Timer
		if next := b.nextReady(); next.After(time.Now()) {
			tm = time.NewTimer(time.Until(next))
			t = tm.C
		}
		select {
		case <-done:
			if !deaf {
				return nil, ctx.Err()
			}
			// Deaf: what arrives until the poll ends is still handed over,
			// after ctx ended (a redelivery of a message the stopping route
			// just handed back, among others).
			done = nil
		case <-poll.C:
			return nil, nil
		case <-b.wake:
		case <-t:
		}
		if tm != nil {
			tm.Stop()
		}
	}
}

// nextReady is when the next message arrives or comes back.
func (b *simBroker) nextReady() time.Time {
	w := b.w
	w.mu.Lock()
	defer w.mu.Unlock()
	var next time.Time
	for _, l := range b.msgs {
		var at time.Time
		switch {
		case !l.arrived:
			at = w.start.Add(l.spec.At)
		case l.available:
			at = l.notBefore
		default:
			continue
		}
		if next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return next
}

// take hands over what is ready: at most n messages and b bytes, except a
// first message alone larger than b. Some deliveries get a duplicate of a
// message already held (the broker redelivered it: ack wait passed).
func (b *simBroker) take(n int, maxBytes int64, g interface{ IntN(int) int }) []*consumer.Message {
	w := b.w
	w.mu.Lock()
	defer w.mu.Unlock()
	now := time.Now()
	var out []*consumer.Message
	var bytes int64
	for _, l := range b.msgs {
		if !l.arrived && !w.start.Add(l.spec.At).After(now) {
			l.arrived, l.available, l.notBefore = true, true, w.start.Add(l.spec.At)
		}
	}
	// In order of readiness, then of publication.
	for len(out) < n {
		var best *simLogical
		for _, l := range b.msgs {
			if l.available && !l.done && l.lost == "" && !l.notBefore.After(now) &&
				(best == nil || l.notBefore.Before(best.notBefore)) {
				best = l
			}
		}
		if best == nil {
			break
		}
		size := best.spec.Size
		if len(out) > 0 && bytes+size > maxBytes {
			break
		}
		if len(out) == 0 && size > maxBytes && !(size > b.r.WinBytes) {
			break // it would fit later
		}
		best.available = false
		out = append(out, b.deliverLocked(best, now))
		bytes += size
		if w.cfg.has(fDuplicate) && g.IntN(15) == 0 && len(out) < n && !w.healed {
			// Duplicate: a held message the broker delivers again.
			for _, l := range b.msgs {
				if l.latest != nil && !l.available && !l.done && l.lost == "" && l.latest.settled == nil &&
					len(l.latest.settles) == 0 && (b.r.MaxDeliver == 0 || l.deliveries < b.r.MaxDeliver) &&
					bytes+l.spec.Size <= maxBytes && l != best {
					out = append(out, b.deliverLocked(l, now))
					bytes += l.spec.Size
					break
				}
			}
		}
	}
	return out
}

// deliverLocked makes a delivery of l; w.mu held.
func (b *simBroker) deliverLocked(l *simLogical, now time.Time) *consumer.Message {
	w := b.w
	l.deliveries++
	d := &simDelivery{w: w, id: fmt.Sprintf("r%d/m%d/d%d", l.route, l.spec.ID, l.deliveries), lg: l, attempt: l.deliveries,
		fetched: now, fetchSeq: w.tick()}
	d.last = b.r.MaxDeliver > 0 && l.deliveries >= b.r.MaxDeliver
	l.latest = d
	m := consumer.NewMessage(d)
	d.m = m
	m.Topic = b.topic
	if l.spec.Key != "" {
		m.Key = []byte(l.spec.Key)
	}
	m.Value = []byte(d.id)
	m.Size = l.spec.Size
	m.Attempt = l.deliveries
	m.PublishedAt = w.start.Add(l.spec.At)
	m.Headers = consumer.Headers{deliveryHeader: {d.id}}
	if l.spec.Deadline != dlNone {
		d.deadline = w.start.Add(l.spec.At + l.spec.DlOff).Truncate(time.Millisecond)
		m.Headers.Set(expiry.DefaultHeader, expiry.FormatDeadline(d.deadline))
	}
	if l.spec.Crit != "" {
		m.Headers.Set(consumer.CriticalityHeader, l.spec.Crit)
	}
	if l.spec.Cost > 0 {
		m.Headers.Set(consumer.CostHeader, strconv.Itoa(l.spec.Cost))
	}
	if !l.spec.NoOrigin {
		m.Origin = dlq.Origin{Stream: b.topic, Topic: b.topic, Partition: l.spec.Part, Offset: int64(l.spec.ID), Group: "sim"}
	} else if b.r.Ordering == consumer.ByPartition {
		m.Origin.Partition = l.spec.Part
	}
	w.deliveries[m] = d
	w.byID[d.id] = d
	w.all = append(w.all, d)
	return m
}

// redeliverLocked makes l available again after delay, unless the broker
// has given up on it; w.mu held.
func (b *simBroker) redeliverLocked(l *simLogical, d *simDelivery, delay time.Duration, why string) {
	if l.done || l.latest != d {
		return // a stale delivery: the broker ignores it
	}
	if b.r.MaxDeliver > 0 && l.deliveries >= b.r.MaxDeliver {
		l.lost = why
		return
	}
	l.available, l.notBefore = true, time.Now().Add(delay)
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// applyLocked is the broker's answer to a settlement it has; w.mu held.
func (b *simBroker) applyLocked(d *simDelivery, s consumer.Settlement) {
	d.confirmed = true
	l := d.lg
	switch s.Op {
	case consumer.SettleAck, consumer.SettleTerm:
		l.done = true
	case consumer.SettleNak:
		b.redeliverLocked(l, d, s.Delay, "nak on the last delivery")
	}
}

func (w *simWorld) broker(d *simDelivery) *simBroker {
	for _, b := range w.routes {
		if b.r.Index == d.lg.route {
			return b
		}
	}
	panic("no broker")
}

// ---- Acker ----

func (d *simDelivery) Settle(ctx context.Context, s consumer.Settlement) error {
	w := d.world()
	w.mu.Lock()
	k := len(d.settles)
	rec := simSettle{at: time.Now(), seq: w.tick(), s: s}
	d.settles = append(d.settles, rec)
	b := w.broker(d)
	w.mu.Unlock()
	g := simRand(w.cfg.Seed, tagSettle, hashID(d.id), uint64(k))
	var err error
	healed := w.healedNow()
	switch x := g.IntN(100); {
	case healed:
	case x < 5 && w.cfg.has(fSettleFail):
		err = errSimSettle
	case x < 8 && w.cfg.has(fSettleHang):
		if !w.sleep(ctx, time.Hour, true) {
			err = ctx.Err()
			if err == nil {
				err = errSimSettle
			}
		}
	case x < 20 && w.cfg.has(fSettleHang):
		// Answers late, honouring ctx.
		if !w.sleep(ctx, durBetween(g, time.Millisecond, 300*time.Millisecond), true) && ctx.Err() != nil {
			err = ctx.Err()
		}
	case x < 40 && w.cfg.has(fSettlePending):
		var answer error
		if g.IntN(6) == 0 {
			answer = errSimSettle
		}
		m := d.m
		confirm := func() {
			w.mu.Lock()
			if answer == nil {
				b.applyLocked(d, s)
			} else {
				d.lg.refused = true
				b.redeliverLocked(d.lg, d, 100*time.Millisecond, "settlement failed on the last delivery")
			}
			w.mu.Unlock()
			consumer.Confirm(m, answer)
		}
		switch y := g.IntN(4); y {
		case 0: // the answer before Settle returns
			confirm()
		case 1, 2: // later, from another goroutine
			delay := durBetween(g, 0, 400*time.Millisecond)
			go func() {
				w.sleep(context.Background(), delay, false)
				confirm()
			}()
		case 3: // never
		}
		w.mu.Lock()
		d.settles[k].err = consumer.ErrPending
		w.mu.Unlock()
		return consumer.ErrPending
	}
	w.mu.Lock()
	d.settles[k].err = err
	if err == nil {
		b.applyLocked(d, s)
	} else {
		d.lg.refused = true
		b.redeliverLocked(d.lg, d, 100*time.Millisecond, "settlement failed on the last delivery")
	}
	w.mu.Unlock()
	return err
}

func (d *simDelivery) InProgress(ctx context.Context) error {
	w := d.world()
	w.mu.Lock()
	k := len(d.keepAlives)
	d.keepAlives = append(d.keepAlives, time.Now())
	w.mu.Unlock()
	if w.cfg.has(fKeepAliveFail) && !w.healedNow() && simRand(w.cfg.Seed, tagKeepAlive, hashID(d.id), uint64(k)).IntN(10) == 0 {
		return errors.New("sim: keep-alive failed")
	}
	return nil
}

func (d *simDelivery) world() *simWorld { return d.w }

func hashID(s string) uint64 {
	h := uint64(14695981039346656037)
	for i := 0; i < len(s); i++ {
		h = (h ^ uint64(s[i])) * 1099511628211
	}
	return h
}

// ---- Sink ----

type simSink struct{ w *simWorld }

func (s simSink) Write(ctx context.Context, l *dlq.Letter) error {
	w := s.w
	id := consumer.Headers(l.Headers).Get(deliveryHeader)
	w.mu.Lock()
	d := w.byID[id]
	if d == nil {
		w.failf("a dead letter is written before its original is settled", "letter for unknown delivery %q", id)
		w.mu.Unlock()
		return nil
	}
	k := d.letterTries
	d.letterTries++
	if d.letterStart == 0 {
		d.letterStart = w.tick()
		d.letterTried = l.Class
	}
	w.mu.Unlock()
	g := simRand(w.cfg.Seed, tagSink, hashID(id), uint64(k))
	var err error
	switch x := g.IntN(100); {
	case w.healedNow():
	case x < 30 && w.cfg.has(fSinkFail):
		err = errSimSink
	case x < 33 && w.cfg.has(fSinkHang):
		// Hangs past its ctx, then fails.
		expired := l.Class == dlq.ClassExpired
		w.mu.Lock()
		w.ignoring++
		if expired {
			w.hungExpired++
		}
		w.mu.Unlock()
		w.sleep(ctx, durBetween(g, time.Second, 20*time.Second), false)
		w.mu.Lock()
		w.ignoring--
		if expired {
			w.hungExpired--
		}
		w.mu.Unlock()
		err = errSimSink
	case x < 45 && w.cfg.has(fSinkSlow):
		if !w.sleep(ctx, durBetween(g, time.Millisecond, 300*time.Millisecond), true) && ctx.Err() != nil {
			err = ctx.Err()
		}
	}
	w.mu.Lock()
	if err == nil && d.lettered == 0 {
		d.lettered, d.letterClass = w.tick(), l.Class
	}
	w.mu.Unlock()
	return err
}

// ---- Handler ----

func (w *simWorld) handler(ctx context.Context, m *consumer.Message) error {
	now := time.Now()
	w.mu.Lock()
	d := w.deliveries[m]
	k := len(d.runs)
	d.runs = append(d.runs, simRun{start: now, seq: w.tick(), attempt: m.Attempt})
	d.running++
	w.checkStart(d, m, now)
	w.mu.Unlock()

	action, err := w.act(ctx, d, k, m)

	w.mu.Lock()
	d.running--
	r := &d.runs[k]
	r.end, r.ended, r.action, r.err = time.Now(), true, action, err
	w.mu.Unlock()
	if action == "panic" {
		panic("sim: handler panic")
	}
	return err
}

// act is the handler's behaviour on run k of delivery d.
func (w *simWorld) act(ctx context.Context, d *simDelivery, k int, m *consumer.Message) (string, error) {
	g := simRand(w.cfg.Seed, tagHandler, hashID(d.id), uint64(k))
	x := g.IntN(100)
	fail := w.cfg.has(fHandlerFail)
	switch d.lg.spec.Temper {
	case poison:
		if fail {
			x = 60 + x*40/100 // failures only
		}
	case flaky:
		if fail && m.Attempt <= 1 {
			x = 60 + x*40/100
		}
	}
	switch {
	case x < 40:
	case x < 54 && w.cfg.has(fHandlerSlow):
		d := durBetween(g, time.Millisecond, 200*time.Millisecond)
		if w.cfg.Drift {
			// The downstream speeds up: what the route learned early
			// overstates the handler's latency later.
			d = max(time.Microsecond, d*time.Duration(max(0, w.cfg.Span-w.now()))/time.Duration(w.cfg.Span))
		}
		if !w.sleep(ctx, d, true) && ctx.Err() != nil {
			return "slow", ctx.Err()
		}
		return "slow", nil
	case x < 57 && w.cfg.has(fHandlerStuck):
		// Ignores ctx: a long run, or stuck until the world heals.
		w.mu.Lock()
		w.ignoring++
		w.mu.Unlock()
		d2 := time.Hour
		if g.IntN(2) == 0 {
			d2 = durBetween(g, 10*time.Millisecond, 3*time.Second) + 331*time.Microsecond
		}
		w.sleep(ctx, d2, false)
		w.mu.Lock()
		w.ignoring--
		w.mu.Unlock()
		return "ignores-ctx", nil
	case x < 60:
	case !fail:
	case x < 78:
		return "retryable", errSimHandler
	case x < 86:
		return "permanent", consumer.Permanent(errSimHandler)
	case x < 94:
		return "overloaded", backpressure.Overloaded(errSimHandler)
	default:
		return "panic", nil
	}
	return "success", nil
}

// batchHandler is a BatchHandler: each message draws its own behaviour
// (by its delivery and run, as a Handler's run does): a failure is a
// Batch.Fail mark (retryable, Permanent, Overloaded), a panic or a slow or
// stuck call makes the whole batch panic, take longer or ignore ctx; and the
// batch draws a batch-level error of its own (by its first message).
func (w *simWorld) batchHandler(ctx context.Context, b *consumer.Batch) error {
	now := time.Now()
	sb := &simBatch{}
	ks := make([]int, b.Len())
	w.mu.Lock()
	w.checkBatch(ctx, b)
	for j, m := range b.Messages {
		d := w.deliveries[m]
		ks[j] = len(d.runs)
		d.runs = append(d.runs, simRun{start: now, seq: w.tick(), attempt: m.Attempt})
		d.running++
		sb.ds = append(sb.ds, d)
		d.batch = sb
		w.checkStart(d, m, now)
	}
	w.mu.Unlock()

	// What each message draws; the batch's slowest wait and worst fate.
	actions := make([]string, b.Len())
	var slow, stuck time.Duration
	panics := false
	for j, d := range sb.ds {
		g := simRand(w.cfg.Seed, tagHandler, hashID(d.id), uint64(ks[j]))
		x := g.IntN(100)
		fail := w.cfg.has(fHandlerFail)
		switch d.lg.spec.Temper {
		case poison:
			if fail {
				x = 60 + x*40/100
			}
		case flaky:
			if fail && b.Messages[j].Attempt <= 1 {
				x = 60 + x*40/100
			}
		}
		switch {
		case x < 40:
		case x < 54 && w.cfg.has(fHandlerSlow):
			s := durBetween(g, time.Millisecond, 60*time.Millisecond)
			if w.cfg.Drift {
				s = max(time.Microsecond, s*time.Duration(max(0, w.cfg.Span-w.now()))/time.Duration(w.cfg.Span))
			}
			slow = max(slow, s)
		case x < 57 && w.cfg.has(fHandlerStuck):
			s := time.Hour
			if g.IntN(2) == 0 {
				s = durBetween(g, 10*time.Millisecond, 3*time.Second) + 331*time.Microsecond
			}
			stuck = max(stuck, s)
		case x < 60:
		case !fail:
		case x < 78:
			actions[j] = "retryable"
			b.Fail(j, errSimHandler)
		case x < 86:
			actions[j] = "permanent"
			b.Fail(j, consumer.Permanent(errSimHandler))
		case x < 94:
			actions[j] = "overloaded"
			b.Fail(j, backpressure.Overloaded(errSimHandler))
		default:
			panics = true
		}
	}
	// The batch as a whole: a bulk write that fails for all, by its first
	// message's delivery and run.
	var batchAction string
	var batchErr error
	if w.cfg.has(fHandlerFail) {
		g := simRand(w.cfg.Seed, tagBatchRun, hashID(sb.ds[0].id), uint64(ks[0]))
		switch x := g.IntN(100); {
		case x < 6:
			batchAction, batchErr = "retryable", errSimHandler
		case x < 8:
			batchAction, batchErr = "permanent", consumer.Permanent(errSimHandler)
		case x < 10:
			batchAction, batchErr = "overloaded", backpressure.Overloaded(errSimHandler)
		}
	}
	switch {
	case stuck > 0:
		w.mu.Lock()
		w.ignoring++
		w.mu.Unlock()
		w.sleep(ctx, stuck, false)
		w.mu.Lock()
		w.ignoring--
		w.mu.Unlock()
		if batchErr == nil {
			batchAction = "ignores-ctx"
		}
	case slow > 0:
		if !w.sleep(ctx, slow, true) && ctx.Err() != nil && batchErr == nil {
			batchAction, batchErr = "slow", ctx.Err()
		}
	}
	if panics {
		batchAction, batchErr = "panic", nil
	}
	if batchAction == "" {
		batchAction = "success"
	}

	end := time.Now()
	w.mu.Lock()
	for j, d := range sb.ds {
		d.running--
		d.batch = nil
		r := &d.runs[ks[j]]
		r.end, r.ended, r.action, r.err = end, true, batchAction, batchErr
		if err := b.Failed(j); err != nil {
			r.action, r.err = actions[j], err
		}
		if k := w.orderKey(d); k != "" {
			for i, o := range sb.ds[:j] {
				if or := o.runs[ks[i]]; w.orderKey(o) == k && (or.err != nil || or.action == "panic") {
					r.held = true
				}
			}
		}
	}
	w.mu.Unlock()
	if panics {
		panic("sim: batch handler panic")
	}
	return batchErr
}

// ---- Hook ----

type simHook struct{ w *simWorld }

func (h simHook) HookRoute(consumer.RouteInfo) consumer.MessageHook { return h }

func (h simHook) Held(ctx context.Context, m *consumer.Message, _ consumer.Waits) context.Context {
	return ctx
}

func (h simHook) Event(_ context.Context, m *consumer.Message, e consumer.Event) {
	w := h.w
	w.mu.Lock()
	defer w.mu.Unlock()
	d := w.deliveries[m]
	ev := simEvent{e: e, at: time.Now(), seq: w.tick()}
	if n := len(d.events); n >= 300 && d.events[n-300].at.Equal(ev.at) && e.Kind != consumer.EventSettled {
		// A message the route takes up again and again at one instant:
		// record it once, and let virtual time move on so the run ends.
		if !d.spun {
			d.spun = true
			w.failf(invHeldBackDelay, "%s: %d events at %v without time passing (last %v)", d.id, len(d.events), w.now(), e.Kind)
		}
		w.mu.Unlock()
		time.Sleep(time.Millisecond)
		w.mu.Lock()
		return
	}
	d.events = append(d.events, ev)
	if e.Kind == consumer.EventSettled {
		if d.settled != nil {
			w.failf("every fetched message ends in exactly one outcome", "%s: second EventSettled (%v after %v)", d.id, e.Outcome, d.settled.e.Outcome)
			return
		}
		d.settled = &ev
		if e.Outcome == consumer.OutcomeDLQFailed {
			d.lg.dlqFailed = true
		}
	}
}

// ---- Resource ----

type simResource struct {
	w *simWorld
}

// Pressure alternates between calm and over the target, by the seed.
func (s simResource) Pressure() float64 {
	period := 100*time.Millisecond + time.Duration(s.w.cfg.Seed%7)*30*time.Millisecond
	if (s.w.now()/period)%2 == 1 {
		return 1.6
	}
	return 0.4
}
