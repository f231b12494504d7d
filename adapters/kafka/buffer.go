package kafkaadapter

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// buffer holds what the Source prefetched and the messages it keeps for an
// in-process retry, all charged against one byte and message budget. The
// partition fetchers reserve room before each broker request, so a full
// buffer stops the pulls; the route's Fetch takes messages out (they are
// then the window's) and a Nak puts one back.
type buffer struct {
	mu       sync.Mutex
	ready    []*record
	head     int
	delayed  recordHeap
	bytes    int64 // charged by buffered records
	reserved int64 // granted to fetches in flight
	count    int
	maxBytes int64
	maxCount int
	peak     int64

	wake  chan struct{} // cap 1: something became ready
	space chan struct{} // closed (and replaced) when room frees
}

func newBuffer(maxCount int, maxBytes int64) *buffer {
	return &buffer{maxCount: maxCount, maxBytes: maxBytes, wake: make(chan struct{}, 1), space: make(chan struct{})}
}

func (b *buffer) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// freed wakes reserve waiters; b.mu held.
func (b *buffer) freed() {
	close(b.space)
	b.space = make(chan struct{})
}

// reserve waits until want bytes fit in the budget (and a message slot is
// free) and grants them to one broker request.
func (b *buffer) reserve(ctx context.Context, want int64) error {
	for {
		b.mu.Lock()
		if b.bytes+b.reserved+want <= b.maxBytes && b.count < b.maxCount {
			b.reserved += want
			b.mu.Unlock()
			return nil
		}
		ch := b.space
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-ch:
		}
	}
}

// settleReservation returns a grant; the fetched records are charged by
// push.
func (b *buffer) settleReservation(want int64) {
	b.mu.Lock()
	b.reserved -= want
	b.freed()
	b.mu.Unlock()
}

func (b *buffer) chargeLocked(r *record) {
	b.bytes += r.size
	b.count++
	b.peak = max(b.peak, b.bytes+b.reserved)
}

func (b *buffer) releaseLocked(r *record) {
	b.bytes -= r.size
	b.count--
}

// push appends fetched records, ready now.
func (b *buffer) push(rs []*record) { b.fill(0, rs) }

// fill returns a grant of want bytes and charges the records its fetch
// brought in one step, so there is no moment when neither counts against
// the budget (another fetcher could reserve the same room meanwhile).
// Records of a generation that is ending are dropped, not kept: its purge
// may have run already. It returns how many it dropped.
func (b *buffer) fill(want int64, rs []*record) (dropped int) {
	if want == 0 && len(rs) == 0 {
		return 0
	}
	b.mu.Lock()
	b.reserved -= want
	if len(rs) > 0 && rs[0].part.gen.ending.Load() {
		dropped, rs = len(rs), nil
	}
	for _, r := range rs {
		b.chargeLocked(r)
	}
	b.ready = append(b.ready, rs...)
	if want > 0 {
		b.freed()
	}
	b.mu.Unlock()
	if len(rs) > 0 {
		b.signal()
	}
	return dropped
}

// pushDelayed keeps r until r.due. It may take the buffer over its budget
// (a Nak must never lose a message); fetches then wait until it drains.
func (b *buffer) pushDelayed(r *record) {
	b.mu.Lock()
	b.chargeLocked(r)
	heap.Push(&b.delayed, r)
	b.mu.Unlock()
	b.signal()
}

// full reports whether the buffer has no room for r.
func (b *buffer) full(r *record) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.bytes+b.reserved+r.size > b.maxBytes || b.count >= b.maxCount
}

// take pops up to n ready records totalling at most maxBytes (the first
// alone may exceed it), moving due delayed records to the front first.
// Records of generations that are ending are dropped. It returns the time
// the next delayed record is due (zero if none).
func (b *buffer) take(now time.Time, n int, maxBytes int64, out []*record) ([]*record, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var due []*record
	for len(b.delayed) > 0 && !b.delayed[0].due.After(now) {
		due = append(due, heap.Pop(&b.delayed).(*record))
	}
	if len(due) > 0 {
		// Retries go first: they have waited already.
		rest := b.ready[b.head:]
		b.ready = append(due, rest...)
		b.head = 0
	}
	var got int64
	released := false
	for b.head < len(b.ready) && len(out) < n {
		r := b.ready[b.head]
		if r.part.gen.ending.Load() {
			b.ready[b.head] = nil
			b.head++
			b.releaseLocked(r)
			released = true
			continue
		}
		if len(out) > 0 && got+r.size > maxBytes {
			break
		}
		b.ready[b.head] = nil
		b.head++
		b.releaseLocked(r)
		released = true
		got += r.size
		// Counted as handed out under b.mu, where ending was checked: a
		// generation's end (ending, then purge, then waiting for
		// outstanding) cannot miss a record taken just before it.
		r.part.gen.outstanding.Add(1)
		out = append(out, r)
	}
	if b.head == len(b.ready) {
		b.ready, b.head = b.ready[:0], 0
	} else if b.head > 4096 && b.head*2 > len(b.ready) {
		n := copy(b.ready, b.ready[b.head:])
		clear(b.ready[n:])
		b.ready, b.head = b.ready[:n], 0
	}
	if released {
		b.freed()
	}
	var next time.Time
	if len(b.delayed) > 0 {
		next = b.delayed[0].due
	}
	return out, next
}

// purge drops every buffered record of g.
func (b *buffer) purge(g *generation) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	dropped := 0
	keep := b.ready[:0]
	for _, r := range b.ready[b.head:] {
		if r.part.gen == g {
			b.releaseLocked(r)
			dropped++
			continue
		}
		keep = append(keep, r)
	}
	clear(b.ready[len(keep):])
	b.ready, b.head = keep, 0
	var kd recordHeap
	for _, r := range b.delayed {
		if r.part.gen == g {
			b.releaseLocked(r)
			dropped++
			continue
		}
		kd = append(kd, r)
	}
	heap.Init(&kd)
	b.delayed = kd
	if dropped > 0 {
		b.freed()
	}
	return dropped
}

func (b *buffer) usage() (count int, bytes, peak int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.count, b.bytes, b.peak
}

type recordHeap []*record

func (h recordHeap) Len() int           { return len(h) }
func (h recordHeap) Less(i, j int) bool { return h[i].due.Before(h[j].due) }
func (h recordHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *recordHeap) Push(x any)        { *h = append(*h, x.(*record)) }
func (h *recordHeap) Pop() any {
	old := *h
	r := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return r
}
