package consumer

import (
	"math/rand/v2"
	"sync"
)

// localQueue holds a route's fetched-but-not-started messages when the
// route asks for LIFO order or queue shedding; other routes use a plain
// channel. It never blocks a push: the window already bounds its length.
type localQueue struct {
	order QueueOrder
	drop  DropPolicy
	limit int // shed above this many queued; 0: never

	mu     sync.Mutex
	cond   sync.Cond
	items  []*Message // oldest first
	closed bool
}

func newLocalQueue(order QueueOrder, drop DropPolicy, limit, capacity int) *localQueue {
	q := &localQueue{order: order, drop: drop, limit: limit, items: make([]*Message, 0, capacity)}
	q.cond.L = &q.mu
	return q
}

// push queues m and returns the message to shed, if the queue is now over
// its limit (possibly m itself).
func (q *localQueue) push(m *Message) (victim *Message) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.limit > 0 && len(q.items) >= q.limit {
		switch q.drop {
		case DropNewest:
			return m
		case DropOldest:
			victim = q.removeLocked(0)
		case DropRandom:
			i := rand.N(len(q.items) + 1)
			if i == len(q.items) {
				return m
			}
			victim = q.removeLocked(i)
		case DropLowestCriticality:
			// The oldest queued message of the lowest class present; the
			// arrival only when its class is below every queued one.
			at := 0
			for i, x := range q.items {
				if x.crit < q.items[at].crit {
					at = i
				}
			}
			if m.crit < q.items[at].crit {
				return m
			}
			victim = q.removeLocked(at)
		}
	}
	q.items = append(q.items, m)
	q.cond.Signal()
	return victim
}

func (q *localQueue) removeLocked(i int) *Message {
	m := q.items[i]
	copy(q.items[i:], q.items[i+1:])
	q.items[len(q.items)-1] = nil
	q.items = q.items[:len(q.items)-1]
	return m
}

// pop blocks until a message is queued or the queue is closed and empty.
func (q *localQueue) pop() (*Message, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for len(q.items) == 0 {
		if q.closed {
			return nil, false
		}
		q.cond.Wait()
	}
	if q.order == QueueLIFO {
		return q.removeLocked(len(q.items) - 1), true
	}
	return q.removeLocked(0), true
}

func (q *localQueue) close() {
	q.mu.Lock()
	q.closed = true
	q.cond.Broadcast()
	q.mu.Unlock()
}
