package consumer

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Ordering says which of a route's messages may run at the same time, and in
// what order. It is a property of the work (an account's debits must apply
// in order; independent events need not), so it is set per route.
type Ordering int8

const (
	// Unordered runs any message on any free worker: a slow message never
	// holds up the others, and messages of one key or partition may finish
	// in any order. The default.
	Unordered Ordering = iota
	// ByKey never runs two messages with the same key at once, and runs
	// them in the order the Source delivered them (Kafka: offset order
	// within a partition; NATS: stream order); messages with different
	// keys run in parallel on all the route's workers. The key is
	// Message.Key within its stream or topic (Origin.Stream, else
	// Origin.Topic, else Topic): Kafka's record key, the NATS adapter's
	// KeyHeader or subject. A message without a key has no order to keep
	// and runs as soon as a worker is free.
	ByKey
	// ByPartition runs the messages of one partition (Origin.Topic and
	// Origin.Partition; on NATS, the stream) one at a time, in delivery
	// order, and different partitions in parallel: the order a plain Kafka
	// consumer gives, without its one-thread-per-partition cost.
	ByPartition
)

var orderingNames = [...]string{"unordered", "by_key", "by_partition"}

// String returns "unordered", "by_key" or "by_partition".
func (o Ordering) String() string {
	if o < Unordered || o > ByPartition {
		return "unknown"
	}
	return orderingNames[o]
}

// Revocable is implemented by an Acker whose delivery its Source can lose
// before it is settled: a Kafka partition revoked in a rebalance is
// delivered again to its new owner, from the last commit. Before a worker
// starts a message it asks Revoked; a revoked message is not run but handed
// back (SettleNak without delay, counted OutcomeReturned), so this process
// starts nothing its Source no longer owns: no duplicate of work the new
// owner does, and on an ordered route no key's message after an earlier one
// that went to the new owner. A running handler is not interrupted; the
// adapter's revoke grace waits for it.
type Revocable interface {
	Revoked() bool
}

// revoked reports whether m's Source lost it (see Revocable).
func revoked(m *Message) bool {
	rv, ok := m.acker.(Revocable)
	return ok && rv.Revoked()
}

// An ordered route (ByKey, ByPartition) keeps, per key, the messages it
// holds in delivery order. The first of them, the key's head, is the only
// one out: in the route's queue, running, settling, or waiting to be retried.
// The others wait in the key's list, charged to the window like any held
// message, and the next becomes the head when the head is settled (perform
// calls release). So a key's messages run one at a time, in order, while
// the queue's workers run the heads of different keys in parallel.
//
// A message that fails (or is shed, or handed back as overloaded) is not
// nak'd to the broker, whose redelivery would come after the key's later
// messages: it stays the head, keeps its window slot and is kept alive, and
// runs again after the delay the nak would have asked for, with Attempt + 1
// (holdBack). A message whose dead-letter write fails stays the head the
// same way while the route's letter retrier writes it (toSink, letters.go).
// Only a route that stops hands messages back, and it hands a
// key's messages back in order: a key's later message is given back only
// after its head was (defer), so a broker that redelivers in nak order (a
// JetStream durable) or from the last commit (a Kafka partition) delivers
// them in order again.
type orderer struct {
	r      *route
	by     Ordering
	perKey int

	mu      sync.Mutex
	keys    map[string]map[string]*keyState // ByKey: scope (stream or topic) → key
	parts   map[partKey]*keyState           // ByPartition
	delayed map[*Message]*time.Timer        // heads waiting to be retried in place
	closed  bool                            // the route is stopping: no more delays
	// returned holds the messages handed back (on shutdown, or revoked):
	// one fetched again before the route stopped is handed back at once,
	// ahead of its key's later messages (deferGiveBack). Keyed like the
	// failure memory (failures.keyOf: origin, topic, key and value), so
	// Sources that leave Origin empty still tell messages apart.
	returned map[failKey]bool
	active   int // keys holding messages
	idle     int // keys in the maps holding none (kept for reuse)
	waiting  int // messages waiting for their key's head
	// The fetch loop waits for full (a key at perKey) to have room: room
	// is closed when it has.
	full *keyState
	room chan struct{}

	retries  atomic.Uint64
	keyWaits atomic.Uint64
}

type partKey struct {
	scope string
	part  int32
}

// keyState is one key (or partition) with messages held.
type keyState struct {
	scope string
	name  string // ByKey
	part  int32  // ByPartition
	head  *Message
	wait  []*Message // after head, in delivery order; wait[whead:] are live
	whead int
	n     int // head and wait
	// riders are the messages after head that run in head's batch, in
	// delivery order (a BatchHandler route: batch.go); each becomes the
	// head in turn as the one before it is settled.
	riders []*Message
}

func newOrderer(r *route) *orderer {
	o := &orderer{r: r, by: r.cfg.Ordering, perKey: r.cfg.Window.MaxPerKey, delayed: map[*Message]*time.Timer{}}
	if o.by == ByKey {
		o.keys = map[string]map[string]*keyState{}
	} else {
		o.parts = map[partKey]*keyState{}
	}
	r.queue.onClose = o.flush
	return o
}

func scopeOf(m *Message) string {
	switch {
	case m.Origin.Stream != "":
		return m.Origin.Stream
	case m.Origin.Topic != "":
		return m.Origin.Topic
	}
	return m.Topic
}

// key returns m's key state, creating it when create is set; nil when m
// has no order to keep (ByKey, no key) or, without create, no message of
// its key is held. o.mu held.
func (o *orderer) key(m *Message, create bool) *keyState {
	scope := scopeOf(m)
	var k *keyState
	if o.by == ByPartition {
		pk := partKey{scope, m.Origin.Partition}
		if k = o.parts[pk]; k == nil && create {
			k = &keyState{scope: scope, part: pk.part}
			o.parts[pk] = k
			o.idle++
		}
	} else {
		if len(m.Key) == 0 {
			return nil
		}
		inner := o.keys[scope]
		if k = inner[string(m.Key)]; k == nil && create {
			if inner == nil {
				inner = map[string]*keyState{}
				o.keys[scope] = inner
			}
			k = &keyState{scope: scope, name: string(m.Key)}
			inner[k.name] = k
			o.idle++
		}
	}
	if k != nil && k.n == 0 {
		if !create {
			return nil
		}
		o.idle--
		o.active++
	}
	return k
}

// drop marks k, now empty, idle. Idle keys stay in the maps, so a key
// that comes back costs no allocation; once there are more than twice the
// window (and 1,024), they are all removed.
func (o *orderer) drop(k *keyState) {
	o.active--
	o.idle++
	if o.idle <= max(1024, 2*o.r.cfg.Window.Messages) {
		return
	}
	for pk, k := range o.parts {
		if k.n == 0 {
			delete(o.parts, pk)
		}
	}
	for scope, inner := range o.keys {
		for name, k := range inner {
			if k.n == 0 {
				delete(inner, name)
			}
		}
		if len(inner) == 0 {
			delete(o.keys, scope)
		}
	}
	o.idle = 0
}

// enqueue queues a message admit has charged to the window: for a worker at
// once, or on an ordered route behind the earlier messages of its key. It
// returns how many messages the queue shed to take it (m itself, or older
// ones).
func (r *route) enqueue(ctx context.Context, m *Message) int {
	if r.order != nil {
		return r.order.admit(ctx, m)
	}
	return r.pushOrShed(m)
}

// pushOrShed queues m, shedding by the route's queue policy, and returns
// how many messages were shed.
func (r *route) pushOrShed(m *Message) int {
	vs := r.queue.push(m)
	for _, v := range vs {
		r.shed(v, ShedQueueFull)
	}
	return len(vs)
}

// admit takes m into its key: the head when the key holds nothing, else
// behind the others. While the key holds perKey messages it waits (the
// fetch loop stops taking messages in: one hot key takes at most that much
// of the window); when ctx ends first, m is handed back. It returns how
// many messages the queue shed (see enqueue).
func (o *orderer) admit(ctx context.Context, m *Message) int {
	o.mu.Lock()
	k := o.key(m, true)
	for k != nil && k.n >= o.perKey {
		o.keyWaits.Add(1)
		o.full, o.room = k, make(chan struct{})
		room := o.room
		o.mu.Unlock()
		select {
		case <-room:
		case <-ctx.Done():
			o.mu.Lock()
			o.full, o.room = nil, nil
			o.mu.Unlock()
			o.r.handBack(m) // the fetch loop's own: no wait for itself
			return 0
		}
		o.mu.Lock()
		k = o.key(m, true) // the key may have emptied and gone meanwhile
	}
	if k == nil {
		o.mu.Unlock()
		return o.push(m)
	}
	k.n++
	m.okey = k
	if k.head != nil {
		k.wait = append(k.wait, m)
		o.waiting++
		o.mu.Unlock()
		if m.startBy != 0 {
			// The reaper settles it (out of turn) if it cannot start in
			// time, freeing its slot without waiting for its key.
			o.r.queue.mu.Lock()
			o.r.queue.startByLocked(m.startBy)
			o.r.queue.mu.Unlock()
		}
		return 0
	}
	k.head = m
	o.mu.Unlock()
	return o.push(m)
}

// push queues a message that arrived and may run now, shedding by the
// route's queue policy, and returns how many were shed.
func (o *orderer) push(m *Message) int { return o.r.pushOrShed(m) }

// release takes a settled message out of its key; the key's next message
// becomes its head and is queued. perform calls it for every settlement.
func (o *orderer) release(m *Message) {
	o.mu.Lock()
	k := m.okey
	if k == nil {
		o.mu.Unlock()
		return
	}
	m.okey = nil
	var next *Message
	if k.head == m {
		if t, ok := o.delayed[m]; ok {
			t.Stop() // due finds it gone and does nothing
			delete(o.delayed, m)
			o.r.queue.unhold()
		}
		k.head = nil
		if len(k.riders) > 0 {
			// Already in the batch that ran m: it is settled from there.
			k.head, k.riders = k.riders[0], k.riders[1:]
		} else if k.whead < len(k.wait) {
			next = k.wait[k.whead]
			k.wait[k.whead] = nil
			k.whead++
			if k.whead == len(k.wait) {
				k.wait, k.whead = k.wait[:0], 0
			}
			k.head = next
			o.waiting--
		}
	} else {
		// Settled out of turn: expired by the reaper while it waited
		// (takeLate took it out of the list already), or abandoned by a
		// shutdown; or a batch's rider settled before its head (batch.go).
		k.riders = dropRider(k.riders, m)
		for i := k.whead; i < len(k.wait); i++ {
			if k.wait[i] == m {
				k.wait = append(k.wait[:i], k.wait[i+1:]...)
				o.waiting--
				break
			}
		}
	}
	k.n--
	if k.n == 0 {
		o.drop(k)
	}
	if o.full == k && k.n < o.perKey {
		close(o.room)
		o.full, o.room = nil, nil
	}
	o.mu.Unlock()
	if next != nil {
		o.requeue(next, false)
	}
}

// holdBack keeps a key's head that would be nak'd (v) in the route instead:
// it runs again after v's delay, with Attempt + 1, and its key's later
// messages keep waiting for it. It reports false for what it leaves to the
// broker: other verdicts, messages handed back (shutdown, revoked), and
// messages not in a key.
func (o *orderer) holdBack(m *Message, v verdict) bool {
	if v.op.Op != SettleNak {
		return false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if v.outcome == OutcomeReturned {
		if o.returned == nil || len(o.returned) > 4*o.r.cfg.Window.Messages+1024 {
			// A shutdown hands back at most what the route holds and one
			// fetch more; older entries are from rebalances long past.
			o.returned = map[failKey]bool{}
		}
		o.returned[o.r.failures.keyOf(m)] = true
		return false
	}
	if m.okey == nil || m.okey.head != m || msgState(m.state.Load()) != stateHeld || o.r.queue.isDrained() {
		return false
	}
	m.Attempt++
	m.retries++
	if m.FirstFailure.IsZero() {
		m.FirstFailure = o.r.clock.Now()
	}
	o.retries.Add(1)
	if d := v.op.Delay; d > 0 && !o.closed {
		o.r.queue.hold()
		o.delayed[m] = time.AfterFunc(d, func() { o.due(m) })
		return true
	}
	o.r.queue.requeue(m)
	return true
}

// due queues a held-back message whose delay is over.
func (o *orderer) due(m *Message) {
	o.mu.Lock()
	_, ok := o.delayed[m]
	delete(o.delayed, m)
	o.mu.Unlock()
	if ok {
		o.requeue(m, true)
	}
}

// flush queues every held-back message at once, once the route stops
// (Run's shutdown), so its workers hand them back before they stop; from
// then on a message is not held back with a delay. The route's queue calls
// it when it closes; when that is because the Source closed (ErrClosed),
// the route is not stopping: held-back messages keep their delay and run
// again when it is over, and the workers wait for them (queue.heldBack).
// Run calls it again when the shutdown begins.
func (o *orderer) flush() {
	if !o.r.stopping.Load() {
		return
	}
	o.mu.Lock()
	o.closed = true
	ms := make([]*Message, 0, len(o.delayed))
	for m, t := range o.delayed {
		t.Stop()
		ms = append(ms, m)
	}
	clear(o.delayed)
	o.mu.Unlock()
	for _, m := range ms {
		o.requeue(m, true)
	}
}

// deferGiveBack keeps a message about to be handed back (giveBack) behind the
// messages of its key the route still holds, and reports whether it did:
// it is handed back when its turn comes, after them, so the broker gets
// a key's messages back in order.
func (o *orderer) deferGiveBack(m *Message) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if m.okey != nil || o.returned[o.r.failures.keyOf(m)] {
		return false // tracked, or a redelivery of what it handed back: earlier than what its key holds
	}
	k := o.key(m, false)
	if k == nil || k.head == nil {
		return false
	}
	k.n++
	m.okey = k
	k.wait = append(k.wait, m)
	o.waiting++
	return true
}

// takeLate takes out of their keys' wait lists the waiting messages whose
// start-by time is at or before now, and returns them (the reaper settles
// them as expired: a message that never runs keeps no order), with the
// earliest start-by time of the others (0: none). Taken out here, under
// o.mu, a reaped message can never become its key's head and be run; it
// stays counted in its key (k.n) until release.
func (o *orderer) takeLate(now int64) (late []*Message, next int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.waiting == 0 {
		return nil, 0
	}
	visit := func(k *keyState) {
		kept := k.wait[:k.whead]
		for _, m := range k.wait[k.whead:] {
			switch {
			case m.startBy == 0:
			case m.startBy <= now:
				late = append(late, m)
				o.waiting--
				continue
			case next == 0 || m.startBy < next:
				next = m.startBy
			}
			kept = append(kept, m)
		}
		clear(k.wait[len(kept):])
		k.wait = kept
		if k.whead == len(k.wait) {
			k.wait, k.whead = k.wait[:0], 0
		}
	}
	for _, inner := range o.keys {
		for _, k := range inner {
			visit(k)
		}
	}
	for _, k := range o.parts {
		visit(k)
	}
	return late, next
}

// requeue queues m for a worker without the queue's length limit: a key's
// next message, or a held-back one coming back. Once the route is drained
// (Run is done with it: no worker will take m) it reports false and queues
// nothing; the caller hands m back.
func (q *queue) requeue(m *Message) bool { return q.requeueHeld(m, false) }

// requeueHeld is requeue for a message that was held back (counted in
// heldBack), when held is set: it stops counting there as it is queued, in
// one step, so no worker of a closed queue stops between the two.
func (q *queue) requeueHeld(m *Message, held bool) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if held {
		q.unholdLocked()
	}
	if q.drained {
		return false
	}
	q.addLocked(m)
	return true
}

// hold counts a message held back; unhold one that no longer is.
func (q *queue) hold() {
	q.mu.Lock()
	q.heldBack++
	q.mu.Unlock()
}

func (q *queue) unhold() {
	q.mu.Lock()
	q.unholdLocked()
	q.mu.Unlock()
}

func (q *queue) unholdLocked() {
	q.heldBack--
	if q.heldBack == 0 {
		q.cond.Broadcast() // a closed queue's workers may stop now
	}
}

func (q *queue) isDrained() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.drained
}

// requeue queues m for a worker, or hands it back (giveBack) when the
// route is drained; o.mu not held. held: m was held back (queue.heldBack).
func (o *orderer) requeue(m *Message, held bool) {
	if !o.r.queue.requeueHeld(m, held) {
		o.r.giveBack(m)
	}
}

// OrderStats is a snapshot of an ordered route's keys (zero on an
// Unordered route).
type OrderStats struct {
	// Keys is how many keys (ByPartition: partitions) have messages held.
	Keys int
	// Waiting counts held messages waiting for an earlier message of
	// their key to be settled.
	Waiting int
	// Delayed counts messages held back to run again after a delay.
	Delayed int
	// Retries counts messages held back to run again instead of being
	// nak'd (retryable failures, overloaded hand-backs, sheds), each time.
	Retries uint64
	// KeyWaits counts the times the route stopped taking messages in
	// because a key held Window.MaxPerKey of them.
	KeyWaits uint64
}

func (r *route) orderStats() OrderStats {
	o := r.order
	if o == nil {
		return OrderStats{}
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	return OrderStats{Keys: o.active, Waiting: o.waiting, Delayed: len(o.delayed),
		Retries: o.retries.Load(), KeyWaits: o.keyWaits.Load()}
}
