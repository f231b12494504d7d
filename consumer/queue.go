package consumer

import (
	"math/rand/v2"
	"sync"
	"sync/atomic"
)

// queue holds a route's fetched messages until a worker takes them. It never
// blocks a push (the window bounds its length) and grows with what it holds,
// so nothing is allocated up front in proportion to the window's size.
// Workers take the oldest (FIFO) or newest (LIFO) message; with a length
// limit, a push over it sheds one message by the route's drop policy.
type queue struct {
	order QueueOrder
	drop  DropPolicy
	limit int // shed above this many queued; 0: never
	// maxUnits sheds above this many cost units queued; 0: never. units
	// is what is queued now.
	maxUnits int
	units    int
	// maxRunning bounds the cost units of the messages taken from the
	// queue and not yet done (CostPolicy.MaxRunning); 0: no bound.
	maxRunning int
	running    int
	// runCap, when positive, is how many messages workers may have taken
	// and not finished (the resource cap: see resource.go); taken is how
	// many they have. Both change under mu; finished reads them without it.
	runCap atomic.Int32
	taken  atomic.Int32
	// dry is set when a worker found the queue empty and waited, and
	// cleared by ranDry (the drain window's starvation signal).
	dry atomic.Bool

	mu     sync.Mutex
	cond   sync.Cond
	buf    []*Message // ring buffer; len(buf) is a power of two or 0
	head   int        // index of the oldest item
	n      int
	closed bool
	// drained: Run is done with the route (its workers are gone): a
	// message released to run now (requeue) is handed back instead.
	drained bool
	// heldBack counts the messages an ordered route holds back to run
	// again after a delay (order.go): they come back through requeue, so
	// a closed queue's workers wait for them instead of stopping.
	heldBack int

	// earliest is the earliest start-by time (Message.startBy) pushed
	// since the last reap, 0 if none; reap wakes the route's reaper when
	// a push lowers it.
	earliest int64
	reap     chan struct{}
	// onClose runs when the queue closes, before workers may stop (an
	// ordered route queues the messages it held back: see order.go).
	onClose func()
}

func newQueue(order QueueOrder, drop DropPolicy, limit, maxUnits int) *queue {
	q := &queue{order: order, drop: drop, limit: limit, maxUnits: maxUnits, reap: make(chan struct{}, 1)}
	q.cond.L = &q.mu
	return q
}

func (q *queue) at(i int) *Message { return q.buf[(q.head+i)&(len(q.buf)-1)] }

func (q *queue) grow() {
	size := max(16, 2*len(q.buf))
	buf := make([]*Message, size)
	for i := 0; i < q.n; i++ {
		buf[i] = q.at(i)
	}
	q.buf, q.head = buf, 0
}

func (q *queue) pushLocked(m *Message) {
	if q.n == len(q.buf) {
		q.grow()
	}
	q.buf[(q.head+q.n)&(len(q.buf)-1)] = m
	q.n++
	q.units += int(m.units)
}

// removeLocked takes out the i-th oldest item.
func (q *queue) removeLocked(i int) *Message {
	mask := len(q.buf) - 1
	m := q.buf[(q.head+i)&mask]
	if i < q.n/2 {
		for j := i; j > 0; j-- {
			q.buf[(q.head+j)&mask] = q.buf[(q.head+j-1)&mask]
		}
		q.buf[q.head] = nil
		q.head = (q.head + 1) & mask
	} else {
		for j := i; j < q.n-1; j++ {
			q.buf[(q.head+j)&mask] = q.buf[(q.head+j+1)&mask]
		}
		q.buf[(q.head+q.n-1)&mask] = nil
	}
	q.n--
	q.units -= int(m.units)
	return m
}

// push queues m and returns the messages to shed, if the queue is over its
// limits with m (possibly m itself, which is then not queued, and then
// last). Only a cost bound (maxUnits) can shed more than one.
func (q *queue) push(m *Message) (victims []*Message) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.n > 0 && (q.limit > 0 && q.n >= q.limit || q.maxUnits > 0 && q.units+int(m.units) > q.maxUnits) {
		v := q.victimLocked(m)
		victims = append(victims, v)
		if v == m {
			return victims
		}
	}
	q.addLocked(m)
	return victims
}

// victimLocked takes out, by the drop policy, the message to shed so that
// m fits, or returns m itself (not queued).
func (q *queue) victimLocked(m *Message) *Message {
	switch q.drop {
	case DropOldest:
		return q.removeLocked(0)
	case DropRandom:
		i := rand.N(q.n + 1)
		if i == q.n {
			return m
		}
		return q.removeLocked(i)
	case DropLowestCriticality:
		// The oldest queued message of the lowest class present; the
		// arrival only when its class is below every queued one.
		at := 0
		for i := 1; i < q.n; i++ {
			if q.at(i).crit < q.at(at).crit {
				at = i
			}
		}
		if m.crit < q.at(at).crit {
			return m
		}
		return q.removeLocked(at)
	}
	return m // DropNewest
}

// addLocked queues m for a worker and tells the reaper its start-by time.
func (q *queue) addLocked(m *Message) {
	q.pushLocked(m)
	q.cond.Signal()
	q.startByLocked(m.startBy)
}

// startByLocked wakes the reaper when t (a start-by time, 0: none) is
// earlier than any it knows of.
func (q *queue) startByLocked(t int64) {
	if t != 0 && (q.earliest == 0 || t < q.earliest) {
		q.earliest = t
		select {
		case q.reap <- struct{}{}:
		default:
		}
	}
}

// takeLate removes the queued messages whose start-by time is at or before
// now and returns them, with the earliest start-by time of those left (0:
// none).
func (q *queue) takeLate(now int64) (late []*Message, next int64) {
	q.mu.Lock()
	defer q.mu.Unlock()
	mask := len(q.buf) - 1
	kept := 0
	for i := 0; i < q.n; i++ {
		m := q.buf[(q.head+i)&mask]
		if m.startBy != 0 && m.startBy <= now {
			late = append(late, m)
			q.units -= int(m.units)
			continue
		}
		if m.startBy != 0 && (next == 0 || m.startBy < next) {
			next = m.startBy
		}
		q.buf[(q.head+kept)&mask] = m
		kept++
	}
	for i := kept; i < q.n; i++ {
		q.buf[(q.head+i)&mask] = nil
	}
	q.n = kept
	q.earliest = next
	return late, next
}

// pop blocks until a message is queued (and the resource cap, if any,
// lets one more run) or the queue is closed and empty. finished gives the
// message's place under the cap back.
func (q *queue) pop() (*Message, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for q.n == 0 || !q.mayTakeLocked() {
		if q.n == 0 && q.closed && q.heldBack == 0 {
			return nil, false
		}
		if q.n == 0 && !q.dry.Load() {
			q.dry.Store(true)
		}
		q.cond.Wait()
	}
	q.taken.Add(1)
	return q.removeLocked(q.nextLocked()), true
}

// mayTakeLocked reports whether the resource cap lets a worker take one
// more message. A closed queue is drained whatever the cap.
func (q *queue) mayTakeLocked() bool {
	c := q.runCap.Load()
	return c <= 0 || q.taken.Load() < c || q.closed
}

// finished gives back the place of a message pop handed out.
func (q *queue) finished() {
	q.taken.Add(-1)
	if q.runCap.Load() > 0 {
		// A worker may wait for the cap (it checked taken under mu and
		// waits on cond, so taking mu here cannot miss it).
		q.mu.Lock()
		q.cond.Signal()
		q.mu.Unlock()
	}
}

// setRunCap sets the resource cap on the messages running (0: none).
func (q *queue) setRunCap(n int) {
	q.mu.Lock()
	if q.runCap.Swap(int32(max(n, 0))) != int32(max(n, 0)) {
		q.cond.Broadcast()
	}
	q.mu.Unlock()
}

// popFit is pop for a queue whose running cost is bounded: it takes the
// next message, in the queue's order, that fits the running bound (any
// message when nothing runs), waiting while none does. done gives the
// units back.
func (q *queue) popFit() (*Message, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for {
		if q.n == 0 && q.closed && q.heldBack == 0 {
			return nil, false
		}
		if q.n > 0 && q.mayTakeLocked() {
			if i := q.fitLocked(); i >= 0 {
				m := q.removeLocked(i)
				q.running += int(m.units)
				q.taken.Add(1)
				return m, true
			}
		}
		q.cond.Wait()
	}
}

// fitLocked is the index of the message to take next within the running
// bound, or -1.
func (q *queue) fitLocked() int {
	if q.running == 0 {
		return q.nextLocked()
	}
	room := q.maxRunning - q.running
	best := -1
	for j := 0; j < q.n; j++ {
		i := j
		if q.order == QueueLIFO {
			i = q.n - 1 - j
		}
		u := int(q.at(i).units)
		if u > room {
			continue
		}
		if q.order != QueueCheapestFirst {
			return i
		}
		if best < 0 || u < int(q.at(best).units) {
			best = i
		}
	}
	return best
}

// done returns the running units of a message popFit handed out.
func (q *queue) done(units int32) {
	q.mu.Lock()
	q.running -= int(units)
	q.taken.Add(-1)
	q.cond.Broadcast()
	q.mu.Unlock()
}

// nextLocked is the index of the message a worker takes next: the oldest
// (FIFO), the newest (LIFO), or the oldest of the cheapest (in cost
// units).
func (q *queue) nextLocked() int {
	switch q.order {
	case QueueLIFO:
		return q.n - 1
	case QueueCheapestFirst:
		at := 0
		for i := 1; i < q.n && q.at(at).units > 1; i++ {
			if q.at(i).units < q.at(at).units {
				at = i
			}
		}
		return at
	}
	return 0
}

// tryPop takes a message without waiting, in the queue's order.
func (q *queue) tryPop() (*Message, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.n == 0 {
		return nil, false
	}
	return q.removeLocked(q.nextLocked()), true
}

// ranDry reports whether a worker found the queue empty since the last
// call.
func (q *queue) ranDry() bool { return q.dry.Swap(false) }

// len returns how many messages wait.
func (q *queue) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.n
}

// load returns the cost units queued (the count without Window.Cost).
func (q *queue) load() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.units
}

// close wakes every worker; they take what is left, then stop.
func (q *queue) close() {
	if q.onClose != nil {
		q.onClose()
	}
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}
