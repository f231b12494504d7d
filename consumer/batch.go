package consumer

import (
	"context"
	"errors"
	"fmt"
	"math"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/dlq"
)

// BatchHandler processes a batch of messages at once: one bulk write (a
// database COPY, a bulk index request, a batched RPC) for many messages.
// Set it as Route.BatchHandler instead of Route.Handler.
//
// Its result settles each message through the same state machine as a
// Handler's: nil settles every message as succeeded (except those marked
// with Batch.Fail); an error is applied to each message not marked (each
// then retried, dead-lettered or expired by the route's policies, with its
// own attempt count); a panic is recovered as ErrPanic for every message.
//
// ctx ends at the earliest deadline in the batch (the batch is cut so that
// its predicted end comes before it: see BatchPolicy), and carries the
// route's criticality. A BatchHandler must not retain b or its messages
// after it returns.
type BatchHandler func(ctx context.Context, b *Batch) error

// DefaultBatchMessages is BatchPolicy.MaxMessages when it is 0.
const DefaultBatchMessages = 100

// BatchPolicy bounds the batches of a route with a BatchHandler. Its zero
// value needs no tuning: batches of up to DefaultBatchMessages that grow
// with the load, without lingering.
//
// A batch is formed by one worker at a time from the route's queue, in the
// queue's order (QueuePolicy.Order). Each worker runs one batch at a time,
// so up to Workers batches run at once. Every message in a forming or
// running batch keeps its window slot until it is settled, so the window
// bounds batches as it bounds messages. With Window.Messages 0 a batch
// route's window holds 2 × Workers × MaxMessages, room for every worker to
// run a full batch while the next ones form, and finds its size as the
// default window does (see WindowPolicy.Messages): while most of what it
// fetches is dropped at once (a stale backlog to drain) it grows, up to
// four times that (at least DefaultDrainWindow, at most
// MaxWindowMessages), and shrinks back once drops stop.
//
// Deadlines: a message whose deadline passes while its batch forms is
// settled as expired and never reaches the handler. The route learns how
// long its batches take as a fixed cost plus a cost per message (a least
// squares fit of recent batch latencies on batch sizes, plus a margin from
// its recent errors), and cuts a batch before the message whose addition
// would make its predicted end pass the earliest deadline in it; a message
// that could not finish in time even alone is settled as expired
// (OverloadStats.ExpiredEarly). Under overload (the window three quarters
// full) a batch first takes the messages that make a batch of the size the
// queue can fill in time, leaving staler ones queued (for a smaller batch,
// or expiry) instead of cutting the batch short for them. Before the first
// batch has run the route checks deadlines only.
type BatchPolicy struct {
	// MaxMessages is the most messages in one batch. 0 means
	// DefaultBatchMessages. On a route with Window.Cost it still counts
	// messages, not units.
	MaxMessages int
	// MaxBytes is the most bytes (Message.Size) in one batch; a message
	// larger than it runs in a batch of its own. 0 means Window.Bytes /
	// (2 × Workers), at least 1.
	MaxBytes int64
	// Linger is the longest a worker holding a partial batch waits for more
	// messages before it runs the batch. 0 means it does not wait: a free
	// worker takes what is queued at once, so batches stay small (and
	// latency low) while the route keeps up, and grow toward MaxMessages
	// as a backlog builds while every worker is busy. A linger is cut short
	// so that it never makes the batch's predicted end pass its earliest
	// deadline. Negative is invalid.
	Linger time.Duration
}

// Batch is the messages a BatchHandler processes together. Messages is in
// delivery order within each key on an ordered route (see Ordering): with
// ByKey or ByPartition a batch holds a key's messages in the order the
// Source delivered them.
type Batch struct {
	// Messages are the batch's messages. The handler must not change the
	// slice or keep it after it returns.
	Messages []*Message
	errs     []error
	bytes    int64
	deadline time.Time
}

// Len returns how many messages the batch holds.
func (b *Batch) Len() int { return len(b.Messages) }

// Bytes returns the batch's size in bytes (the sum of its messages'
// window charges).
func (b *Batch) Bytes() int64 { return b.bytes }

// Deadline returns the earliest deadline of the batch's messages, which
// the handler's ctx carries, and whether any has one.
func (b *Batch) Deadline() (time.Time, bool) { return b.deadline, !b.deadline.IsZero() }

// Fail marks message i as failed with err, whatever the handler returns:
// the message is settled as a Handler returning err would settle it
// (retried, dead-lettered with Permanent, handed back with
// backpressure.Overloaded, expired when its deadline passed), while the
// others settle from the handler's result. Fail(i, nil) clears a mark. It
// panics when i is out of range. Call it from the handler's goroutines
// before the handler returns.
func (b *Batch) Fail(i int, err error) {
	if i < 0 || i >= len(b.Messages) {
		panic(fmt.Sprintf("consumer: Batch.Fail(%d) on a batch of %d", i, len(b.Messages)))
	}
	b.errs[i] = err
}

// Failed returns the error Fail marked message i with, or nil.
func (b *Batch) Failed(i int) error { return b.errs[i] }

// NewBatch returns a Batch of msgs, for testing a BatchHandler without a
// route (see package sluicetest).
func NewBatch(msgs ...*Message) *Batch {
	b := &Batch{Messages: msgs, errs: make([]error, len(msgs))}
	for _, m := range msgs {
		b.bytes += m.cost()
		if d := m.deadline; !d.IsZero() && (b.deadline.IsZero() || d.Before(b.deadline)) {
			b.deadline = d
		}
	}
	return b
}

// BatchInfo describes one batch run, for a RouteObserver that implements
// BatchObserver.
type BatchInfo struct {
	// Size is how many messages the handler was given; Bytes their bytes.
	Size  int
	Bytes int64
	// Linger is how long the batch waited for more messages after its
	// first (0 without BatchPolicy.Linger).
	Linger time.Duration
	// Latency is the handler's run time.
	Latency time.Duration
	// Err is the handler's result.
	Err error
}

// BatchObserver is implemented by a RouteObserver (see package metrics)
// that also records batches: BatchDone is called once per batch a
// BatchHandler ran, after HandlerDone for each of its messages.
type BatchObserver interface {
	BatchDone(BatchInfo)
}

// BatchHook is implemented by a MessageHook (Options.Hook) that follows
// batches as well as their messages: package otelsluice traces each batch
// as a span linked to its messages' spans. JoinHooks forwards it. Its
// methods run on the worker, around the handler, and must not block.
type BatchHook interface {
	// BatchStart is called right before a BatchHandler runs b; msgCtxs[i]
	// is the context Held returned for b.Messages[i]. The context it
	// returns becomes the handler's (the batch's deadline is added to it);
	// return ctx to add nothing.
	BatchStart(ctx context.Context, b *Batch, msgCtxs []context.Context) context.Context
	// BatchEnd is called once the handler returned, before its messages
	// are settled; ctx is the handler's (derived from what BatchStart
	// returned).
	BatchEnd(ctx context.Context, info BatchInfo)
}

// BatchStats is a snapshot of a batch route's batches (zero on a route
// with a Handler).
type BatchStats struct {
	// Batches counts the batches run; Messages the messages given to them.
	Batches, Messages uint64
	// Fixed and PerMessage are the route's learned batch latency: a batch
	// of n messages is predicted to take Fixed + n × PerMessage (0 before
	// the first batch).
	Fixed, PerMessage time.Duration
}

func (r Route) batchDefaults() Route {
	p := &r.Batch
	if p.MaxMessages == 0 {
		p.MaxMessages = DefaultBatchMessages
	}
	if r.Window.Messages == 0 && !r.Window.Cost.Enabled() && r.Overload.AdaptiveLimit == nil {
		// The most a window that finds its size may grow to (New starts
		// it at 2 × Workers × MaxMessages).
		r.Window.Messages = min(max(8*r.Workers*p.MaxMessages, DefaultDrainWindow), MaxWindowMessages)
	} else if r.Window.Messages == 0 && !r.Window.Cost.Enabled() {
		r.Window.Messages = min(2*r.Workers*p.MaxMessages, MaxWindowMessages)
	}
	if p.MaxBytes == 0 {
		b := r.Window.Bytes
		if b == 0 {
			b = DefaultWindowBytes
		}
		p.MaxBytes = max(1, b/int64(2*r.Workers))
	}
	return r
}

func (r *Route) validateBatch() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: route %q: "+format, append([]any{ErrInvalidOption, r.Name}, args...)...)
	}
	switch p := r.Batch; {
	case p.MaxMessages < 0 || p.MaxMessages > MaxWindowMessages:
		return bad("Batch.MaxMessages must be 0 (default %d) to %d, got %d", DefaultBatchMessages, MaxWindowMessages, p.MaxMessages)
	case p.MaxBytes < 0:
		return bad("Batch.MaxBytes must be >= 0, got %d", p.MaxBytes)
	case p.Linger < 0:
		return bad("Batch.Linger must be >= 0, got %v", p.Linger)
	case r.Overload.Slots != nil:
		return bad("Overload.Slots is not supported with a BatchHandler")
	case r.Window.Cost.MaxRunning > 0:
		return bad("Window.Cost.MaxRunning is not supported with a BatchHandler")
	}
	return nil
}

// batcher forms and runs a batch route's batches.
type batcher struct {
	r        *route
	max      int
	maxBytes int64
	linger   time.Duration
	// form is held (a token in it) by the worker forming a batch: one
	// batch forms at a time, so a linger fills one batch instead of
	// splitting the queue among idle workers. (A channel, not a mutex: a
	// goroutine waiting on it is durably blocked for testing/synctest.)
	form  chan struct{}
	model batchModel

	batches, msgs atomic.Uint64
}

func newBatcher(r *route) *batcher {
	p := r.cfg.Batch
	return &batcher{r: r, max: p.MaxMessages, maxBytes: p.MaxBytes, linger: p.Linger, form: make(chan struct{}, 1)}
}

// workBatches is a batch route's worker: it forms batches from the queue
// and runs them until the queue is closed and empty.
func (r *route) workBatches() {
	for {
		ms, linger, ok := r.batch.take()
		if !ok {
			return
		}
		r.runBatch(ms, linger)
		r.queue.finished()
	}
}

// forming is a batch being taken from the queue.
type forming struct {
	ms       []*Message
	bytes    int64
	earliest time.Time // earliest deadline taken
	full     bool      // cut: the next message does not fit
	late     []*Message
	// origins holds the Origins of the messages taken that have one (a
	// stream or topic): a redelivery of a message already in the batch
	// does not join it (see again).
	origins map[dlq.Origin]struct{}
}

// again reports whether m is another delivery of a message f holds (the
// broker redelivered it while the first was held): it waits for a later
// batch, so a batch never writes one message twice (a bulk upsert may
// refuse to touch a row twice in one statement), and on an ordered route
// the two never run at once. Only messages whose Source fills Origin (a
// stream or topic) can be told apart this way.
func (f *forming) again(m *Message) bool {
	if !hasOrigin(m) {
		return false
	}
	_, ok := f.origins[m.Origin]
	return ok
}

func hasOrigin(m *Message) bool { return m.Origin.Stream != "" || m.Origin.Topic != "" }

// fits reports whether m may join f at now (route clock), and whether m
// cannot make its deadline even alone (late).
func (bt *batcher) fits(f *forming, m *Message, now time.Time) (ok, late bool) {
	if len(f.ms) >= bt.max || len(f.ms) > 0 && f.bytes+m.cost() > bt.maxBytes || f.again(m) {
		return false, false
	}
	if m.deadline.IsZero() {
		return f.earliest.IsZero() || !bt.model.late(now, f.earliest, len(f.ms)+1), false
	}
	if bt.model.late(now, m.deadline, 1) {
		return false, true
	}
	d := m.deadline
	if !f.earliest.IsZero() && f.earliest.Before(d) {
		d = f.earliest
	}
	return !bt.model.late(now, d, len(f.ms)+1), false
}

func (f *forming) add(m *Message) {
	f.ms = append(f.ms, m)
	f.bytes += m.cost()
	if hasOrigin(m) {
		if f.origins == nil {
			f.origins = map[dlq.Origin]struct{}{}
		}
		f.origins[m.Origin] = struct{}{}
	}
	if d := m.deadline; !d.IsZero() && (f.earliest.IsZero() || d.Before(f.earliest)) {
		f.earliest = d
	}
}

// takeLocked moves queued messages into f while they fit; those that can
// no longer make their deadline go to f.late. q.mu held.
//
// It takes the next messages in the queue's order while the batch, one
// larger, would still end before its earliest deadline, and cuts it at the
// first that would not. Under overload (the window at least three
// quarters full: more waits in the broker) it first takes, in order, the
// messages that would finish in time in a batch of the size the queue can
// fill, leaving the others queued: batches stay full, so the route keeps
// its capacity, and a stale message does not cut a batch short for the
// fresher ones behind it (it runs in a smaller batch later, or expires).
func (bt *batcher) takeLocked(f *forming, now time.Time) {
	q := bt.r.queue
	if target := min(bt.max, len(f.ms)+q.n); target > len(f.ms)+1 && bt.model.ok.Load() && bt.overloaded() {
		bt.fillLocked(f, now, target)
	}
	for q.n > 0 && !f.full {
		i := q.nextLocked()
		m := q.at(i)
		ok, late := bt.fits(f, m, now)
		switch {
		case late:
			f.late = append(f.late, q.removeLocked(i))
		case ok:
			f.add(q.removeLocked(i))
		default:
			f.full = true
		}
	}
}

// overloaded reports whether the route's window is at least three
// quarters full.
func (bt *batcher) overloaded() bool {
	n, _ := bt.r.window.InUse()
	return 4*n >= 3*bt.r.window.Limit()
}

// fillLocked takes into f, in the queue's order, the queued messages that
// finish in time in a batch of target, up to target; those that cannot
// make it even alone go to f.late. q.mu held.
func (bt *batcher) fillLocked(f *forming, now time.Time, target int) {
	q := bt.r.queue
	full := now.Add(bt.model.high(target))
	alone := now.Add(bt.model.high(1))
	var take, late []int // queue indexes, in the queue's order
	var taking map[dlq.Origin]struct{}
	bytes, n := f.bytes, len(f.ms)
	for j := 0; j < q.n && n < target; j++ {
		i := j
		if q.order == QueueLIFO {
			i = q.n - 1 - j
		}
		m := q.at(i)
		switch {
		case m.deadline.IsZero() || full.Before(m.deadline):
			if n > 0 && bytes+m.cost() > bt.maxBytes || f.again(m) {
				continue
			}
			if hasOrigin(m) {
				if _, ok := taking[m.Origin]; ok {
					continue
				}
				if taking == nil {
					taking = map[dlq.Origin]struct{}{}
				}
				taking[m.Origin] = struct{}{}
			}
			take = append(take, i)
			bytes += m.cost()
			n++
		case !alone.Before(m.deadline):
			late = append(late, i)
		}
	}
	if len(take)+len(late) == 0 {
		return
	}
	// Remove from the highest index down, so the others stay in place.
	picked := make(map[int]*Message, len(take)+len(late))
	all := append(append(make([]int, 0, len(take)+len(late)), take...), late...)
	slices.Sort(all)
	for k := len(all) - 1; k >= 0; k-- {
		picked[all[k]] = q.removeLocked(all[k])
	}
	for _, i := range take {
		f.add(picked[i])
	}
	for _, i := range late {
		f.late = append(f.late, picked[i])
	}
}

// take forms the next batch: it waits for a queued message (and for the
// resource cap, if any), takes what fits, lingers for more when the policy
// says so, and on an ordered route adds the later messages of each key
// (riders). It reports false when the queue is closed and empty. The
// batch's place under the resource cap is given back by queue.finished.
func (bt *batcher) take() (ms []*Message, linger time.Duration, ok bool) {
	for {
		f, linger, ok := bt.form1()
		// Messages found unable to make their deadline are settled after
		// the forming token is given back: a slow dead-letter write for
		// one of them holds up this worker only, not every worker's
		// batches.
		bt.expireLate(&f)
		if !ok || len(f.ms) > 0 {
			return f.ms, linger, ok
		}
	}
}

// form1 is one try of take, holding the forming token: it waits for a
// queued message, takes what fits (and lingers), and adds the riders. It
// returns with f.ms empty when all it found was late (f.late).
func (bt *batcher) form1() (f forming, linger time.Duration, ok bool) {
	r, q := bt.r, bt.r.queue
	bt.form <- struct{}{}
	defer func() { <-bt.form }()
	q.mu.Lock()
	for q.n == 0 || !q.mayTakeLocked() {
		if q.n == 0 && q.closed && q.heldBack == 0 {
			q.mu.Unlock()
			return f, 0, false
		}
		q.cond.Wait()
	}
	bt.takeLocked(&f, r.clock.Now())
	if len(f.ms) > 0 && bt.linger > 0 && !f.full && len(f.ms) < bt.max {
		linger = bt.lingerLocked(&f)
	}
	if len(f.ms) > 0 {
		q.taken.Add(1)
	}
	q.mu.Unlock()
	if len(f.ms) > 0 && r.order != nil {
		now := r.clock.Now()
		r.order.takeRiders(f.ms, func(m *Message) bool {
			if ok, _ := bt.fits(&f, m, now); ok {
				f.add(m)
				return true
			}
			return false
		})
	}
	return f, linger, true
}

// lingerLocked waits, up to the policy's Linger, for messages to fill f,
// ending early when waiting longer would make f's predicted end pass its
// earliest deadline or the queue closes. It returns the time waited. q.mu
// held (released while waiting).
func (bt *batcher) lingerLocked(f *forming) time.Duration {
	r, q := bt.r, bt.r.queue
	start := time.Now()
	end := start.Add(bt.linger)
	wake := time.AfterFunc(bt.linger, func() {
		q.mu.Lock()
		q.cond.Broadcast()
		q.mu.Unlock()
	})
	defer wake.Stop()
	for !f.full && len(f.ms) < bt.max && !q.closed {
		now := r.clock.Now()
		if !f.earliest.IsZero() {
			// Waiting past this would make the batch late.
			left := f.earliest.Sub(now) - bt.model.high(len(f.ms)+1)
			if left <= 0 {
				break
			}
			if e := time.Now().Add(left); e.Before(end) {
				end = e
				wake.Reset(left)
			}
		}
		if !time.Now().Before(end) {
			break
		}
		if q.n == 0 {
			q.cond.Wait()
			continue
		}
		bt.takeLocked(f, now)
	}
	return time.Since(start)
}

// expireLate settles the messages take found unable to make their
// deadline.
func (bt *batcher) expireLate(f *forming) {
	if len(f.late) == 0 {
		return
	}
	now := bt.r.clock.Now()
	for _, m := range f.late {
		bt.r.expireEarly(m, now)
	}
	f.late = f.late[:0]
}

// takeRiders offers add, for each key head in heads, that key's waiting
// messages in delivery order, taking each add accepts (add puts it in the
// batch, after the heads): a key's messages then run in one batch, in
// order, and each becomes its key's head as the one before it is settled
// (release).
func (o *orderer) takeRiders(heads []*Message, add func(*Message) bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, h := range heads {
		k := h.okey
		if k == nil || k.head != h {
			continue
		}
		for k.whead < len(k.wait) && add(k.wait[k.whead]) {
			m := k.wait[k.whead]
			k.wait[k.whead] = nil
			k.whead++
			o.waiting--
			k.riders = append(k.riders, m)
		}
		if k.whead == len(k.wait) {
			k.wait, k.whead = k.wait[:0], 0
		}
	}
}

// unride puts a key's riders that were not settled from their batch
// (after a message of their key that failed) back at the front of its
// waiting messages, in order: they run again once the failed one is
// settled. It returns those of ms that are no longer riders but their
// key's head (the message before them was settled meanwhile): the caller
// queues them.
func (o *orderer) unride(ms []*Message) (heads []*Message) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for i := len(ms) - 1; i >= 0; i-- {
		m := ms[i]
		k := m.okey
		if k == nil {
			continue
		}
		before := len(k.riders)
		k.riders = dropRider(k.riders, m)
		if len(k.riders) == before {
			if k.head == m {
				heads = append(heads, m)
			}
			continue // no longer a rider: the head, or settled
		}
		if k.whead > 0 {
			k.whead--
			k.wait[k.whead] = m
		} else {
			k.wait = append(k.wait, nil)
			copy(k.wait[1:], k.wait)
			k.wait[0] = m
		}
		o.waiting++
	}
	return heads
}

// dropRider returns riders without m.
func dropRider(riders []*Message, m *Message) []*Message {
	for i, x := range riders {
		if x == m {
			return append(riders[:i], riders[i+1:]...)
		}
	}
	return riders
}

// runBatch gives the last checks to each message of a formed batch, runs
// the handler on those that pass, and settles each from its result.
func (r *route) runBatch(ms []*Message, linger time.Duration) {
	bt := r.batch
	// A check that settles a message may take long (a dead-letter write):
	// the others are checked again after it, until a pass settles none,
	// so none runs past its deadline or after a shutdown took it.
	keep := ms
	for n := -1; n != len(keep) && len(keep) > 0; {
		n = len(keep)
		keep = r.checkBatch(keep, r.clock.Now())
	}
	if len(keep) == 0 {
		return
	}
	now := r.clock.Now()
	for _, m := range keep {
		if m.freshAt != 0 {
			r.fresh.started(m.freshAt, now) // the short-queue rule's sojourn (fresh.go)
		}
	}
	b := NewBatch(keep...)
	crit := keep[0].crit
	for _, m := range keep[1:] {
		crit = max(crit, m.crit)
	}
	ctx := r.classCtx[crit&3]
	bh, _ := r.hook.(BatchHook)
	if bh != nil {
		ctxs := make([]context.Context, len(keep))
		for i, m := range keep {
			ctxs[i] = m.hctx
		}
		ctx = bh.BatchStart(ctx, b, ctxs)
	}
	if !b.deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, b.deadline)
		defer cancel()
	}
	start := time.Now()
	for _, m := range keep {
		if rb := r.cfg.Overload.RetryBudget; rb != nil && m.Attempt <= 1 {
			rb.AttemptAt(start)
		}
		if r.hook != nil {
			r.hook.Event(m.hctx, m, Event{Kind: EventStart, Elapsed: start.Sub(m.fetchedAt)})
		}
	}
	err := r.callBatch(ctx, b)
	latency := time.Since(start)
	bt.batches.Add(1)
	bt.msgs.Add(uint64(len(keep)))
	if err == nil || ctx.Err() == nil {
		// A run cut short by its ctx says nothing about how long a batch
		// takes.
		bt.model.observe(len(keep), latency)
	}
	if r.cfg.Overload.Throttle != nil || r.cfg.Overload.AdaptiveLimit != nil {
		r.feedback(start.Add(latency), latency, err)
	}
	if bh != nil {
		bh.BatchEnd(ctx, BatchInfo{Size: len(keep), Bytes: b.bytes, Linger: linger, Latency: latency, Err: err})
	}
	errs := b.errs
	for i := range errs {
		if errs[i] == nil {
			errs[i] = err
		}
	}
	if r.hook != nil {
		for i, m := range keep {
			if msgState(m.state.Load()) == stateHeld {
				r.hook.Event(m.hctx, m, Event{Kind: EventEnd, Err: errs[i], Elapsed: latency})
			}
		}
	}
	held := r.holdAfterFailures(keep, errs)
	for i, m := range keep {
		if held != nil && held[i] {
			continue
		}
		o := r.finish(ctx, m, errs[i])
		if r.obs != nil {
			r.obs.HandlerDone(o, latency)
		}
	}
	if bo, ok := r.obs.(BatchObserver); ok {
		bo.BatchDone(BatchInfo{Size: len(keep), Bytes: b.bytes, Linger: linger, Latency: latency, Err: err})
	}
}

// checkBatch gives each message of a formed batch the checks before its
// run (beforeBatch) and returns those that pass, in order (in ms's array).
func (r *route) checkBatch(ms []*Message, now time.Time) []*Message {
	keep := ms[:0]
	// On an ordered route a key's riders run only behind their key's
	// messages before them in the batch: once one of those is left out of
	// the run and still holds its key (held back to run again, its letter
	// being retried, its settlement not yet confirmed), the key's later
	// messages are put back in their key instead (cut, back).
	var cut map[*keyState]bool
	var back []*Message
	for _, m := range ms {
		var k *keyState
		if r.order != nil {
			k = r.order.keyOf(m)
		}
		if k != nil && cut[k] {
			back = append(back, m)
			continue
		}
		switch r.beforeBatch(m, now, k != nil && r.order.isRider(m)) {
		case batchRun:
			keep = append(keep, m)
			continue
		case batchHold:
			back = append(back, m)
		}
		if k != nil && r.order.keyOf(m) != nil {
			if cut == nil {
				cut = map[*keyState]bool{}
			}
			cut[k] = true
		}
	}
	if len(back) > 0 {
		r.unride(back)
	}
	return keep
}

// What beforeBatch does with a message of a formed batch.
const (
	batchRun  = iota // it runs in the batch
	batchGone        // settled, handed back, or another party's: not run
	batchHold        // a rider to put back in its key (unride), not run
)

// beforeBatch gives m the checks a message gets before its handler runs
// (claimed, revoked, shutdown, awaiting its letter, expired, shed near its
// deadline, predicted late), settling it when one fails. A rider (a key's
// message behind its head in the batch) that would be shed is put back
// instead: a Nak to the broker would bring it back after its key's later
// messages.
func (r *route) beforeBatch(m *Message, now time.Time, rider bool) int {
	if msgState(m.state.Load()) != stateHeld {
		// Another party claimed it (settled, or settling it) after it was
		// queued: it is theirs, and never run.
		return batchGone
	}
	if revoked(m) || r.stopping.Load() && !r.runsAtShutdown(m) {
		r.giveBack(m)
		return batchGone
	}
	if f, ok := r.awaitingLetter(m); ok {
		r.toSink(m, f.class, errors.New(f.cause), now, OutcomeDeadLettered)
		return batchGone
	}
	if !m.deadline.IsZero() {
		if !now.Before(m.deadline) {
			// Any run would end after it.
			r.expire(m, now)
			return batchGone
		}
		if d := r.cfg.Overload.ShedNearDeadline; d > 0 && m.deadline.Sub(now) < d {
			if rider {
				return batchHold
			}
			r.shed(m, ShedNearDeadline)
			return batchGone
		}
		if r.batch.model.late(now, m.deadline, 1) {
			r.expireEarly(m, now)
			return batchGone
		}
	}
	return batchRun
}

// unride puts ms, riders of this batch, back in their keys (see
// orderer.unride), and queues those among them that became their key's
// head meanwhile (the message before them was settled and released).
func (r *route) unride(ms []*Message) {
	for _, m := range r.order.unride(ms) {
		r.order.requeue(m, false)
	}
}

// keyOf returns the key m holds on an ordered route (nil: none, or
// released).
func (o *orderer) keyOf(m *Message) *keyState {
	o.mu.Lock()
	defer o.mu.Unlock()
	return m.okey
}

// isRider reports whether m runs in a batch behind its key's head.
func (o *orderer) isRider(m *Message) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	return m.okey != nil && slices.Contains(m.okey.riders, m)
}

// holdAfterFailures, on an ordered route, puts back the messages of a key
// that come after a failed message of that key in the batch: they are not
// settled from this batch (so never acked ahead of it) and run again, in
// order, once it is settled. It returns which were put back (nil: none).
func (r *route) holdAfterFailures(ms []*Message, errs []error) []bool {
	if r.order == nil {
		return nil
	}
	var failed map[*keyState]bool
	var held []bool
	var back []*Message
	for i, m := range ms {
		k := m.okey
		if k == nil {
			continue
		}
		if failed[k] {
			if held == nil {
				held = make([]bool, len(ms))
			}
			held[i] = true
			back = append(back, m)
			continue
		}
		if errs[i] != nil {
			if failed == nil {
				failed = map[*keyState]bool{}
			}
			failed[k] = true
		}
	}
	if len(back) > 0 {
		r.unride(back)
	}
	return held
}

func (r *route) callBatch(ctx context.Context, b *Batch) (err error) {
	defer func() {
		if p := recover(); p != nil {
			r.c.panics.Add(1)
			err = fmt.Errorf("%w: %v\n%s", ErrPanic, p, debug.Stack())
		}
	}()
	return r.cfg.BatchHandler(ctx, b)
}

func (r *route) batchMessages() int {
	if r.cfg.BatchHandler == nil {
		return 0
	}
	return r.cfg.Batch.MaxMessages
}

func (r *route) batchStats() BatchStats {
	bt := r.batch
	if bt == nil {
		return BatchStats{}
	}
	fixed, per, _ := bt.model.estimate()
	return BatchStats{Batches: bt.batches.Load(), Messages: bt.msgs.Load(), Fixed: fixed, PerMessage: per}
}

// batchModel learns a route's batch latency as a function of batch size,
// y = fixed + per × n: an exponentially weighted least-squares fit over
// recent batches (about the last 50), with the mean absolute error of its
// recent predictions as the margin. While every batch has had about the
// same size the two terms cannot be told apart; the model then predicts the
// mean latency for batches up to that size and scales it with the size
// above (never less than what was seen).
type batchModel struct {
	mu                   sync.Mutex
	s0, sx, sxx, sy, sxy float64 // decayed sums over (n, latency in ns)
	dev                  float64 // decayed mean absolute error, ns

	// What predictions read, without the lock: ns; knee (a size) 0 when
	// the fit separates fixed and per-message cost.
	fixed, per, margin, knee, kneeSlope atomic.Int64
	ok                                  atomic.Bool
}

const batchDecay = 0.98

func (bm *batchModel) observe(n int, d time.Duration) {
	x, y := float64(n), float64(max(d, 1))
	bm.mu.Lock()
	defer bm.mu.Unlock()
	if bm.ok.Load() {
		// The error of the prediction this batch had, except for a size
		// beyond those seen while the fit could not separate the costs
		// (the scaled guess there is meant to err high).
		if k := bm.knee.Load(); k == 0 || int64(n) <= k {
			bm.dev = 0.9*bm.dev + 0.1*math.Abs(y-float64(bm.predict(n)))
		}
	} else {
		bm.dev = y / 10
	}
	bm.s0 = bm.s0*batchDecay + 1
	bm.sx = bm.sx*batchDecay + x
	bm.sxx = bm.sxx*batchDecay + x*x
	bm.sy = bm.sy*batchDecay + y
	bm.sxy = bm.sxy*batchDecay + x*y
	mx, my := bm.sx/bm.s0, bm.sy/bm.s0
	varx := bm.sxx/bm.s0 - mx*mx
	fixed, per, knee, slope := my, 0.0, mx, my/max(mx, 1)
	if varx > 0.25 { // sizes spread by more than half a message
		b := (bm.sxy/bm.s0 - mx*my) / varx
		a := my - b*mx
		switch {
		case b < 0:
			// Larger batches were not slower: keep the flat prediction.
		case a < 0:
			fixed, per, knee = 0, my/max(mx, 1), 0
		default:
			fixed, per, knee = a, b, 0
		}
	}
	bm.fixed.Store(int64(fixed))
	bm.per.Store(int64(per))
	bm.knee.Store(int64(math.Ceil(knee)))
	bm.kneeSlope.Store(int64(slope))
	bm.margin.Store(int64(2 * bm.dev))
	bm.ok.Store(true)
}

// predict is the expected latency of a batch of n.
func (bm *batchModel) predict(n int) time.Duration {
	d := bm.fixed.Load() + int64(n)*bm.per.Load()
	if k := bm.knee.Load(); k > 0 && int64(n) > k {
		d += (int64(n) - k) * bm.kneeSlope.Load()
	}
	return time.Duration(d)
}

// high is the latency a batch of n is given before a deadline: the
// prediction, twice its recent mean error, a tenth and a millisecond; 0
// before the first batch.
func (bm *batchModel) high(n int) time.Duration {
	if !bm.ok.Load() {
		return 0
	}
	d := bm.predict(n) + time.Duration(bm.margin.Load())
	return d + runMargin(d)
}

// late reports whether a batch of n started at now is predicted to end
// at or after deadline (before the first batch: whether deadline is now or
// past: any run ends after it).
func (bm *batchModel) late(now, deadline time.Time, n int) bool {
	return !now.Add(bm.high(n)).Before(deadline)
}

// estimate returns the fitted fixed and per-message cost.
func (bm *batchModel) estimate() (fixed, per time.Duration, ok bool) {
	if !bm.ok.Load() {
		return 0, 0, false
	}
	if bm.knee.Load() > 0 {
		// Not separated yet: all of it looks fixed up to the sizes seen.
		return time.Duration(bm.fixed.Load()), 0, true
	}
	return time.Duration(bm.fixed.Load()), time.Duration(bm.per.Load()), true
}
