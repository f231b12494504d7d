package kafkaadapter

import (
	"container/heap"
	"context"
	"slices"
	"sync"
	"time"
)

// buffer holds what the Source prefetched and the messages it keeps for an
// in-process retry, all charged against one byte and message budget (the
// prefetch). The fetcher reserves room before each broker request and keeps
// of the response only what fits (admit), so the records held never exceed
// the budget; the rest of a response is dropped and fetched again later.
// The route's Fetch takes messages out (they are then the window's),
// serving the partitions round robin; a Nak puts one back.
type buffer struct {
	mu       sync.Mutex
	active   []*partition // partitions with queued records, served round robin
	rr       int          // next index into active
	delayed  recordHeap
	bytes    int64 // charged by held records
	reserved int64 // granted to fetches in flight
	count    int
	maxBytes int64
	maxCount int
	peak     int64
	peakN    int
	// In-process retries (delayed) have an allowance of their own: they
	// take from the fetches' budget only beyond retryMaxN messages or
	// retryMaxBytes (see used).
	retryN        int
	retryBytes    int64
	retryMaxN     int
	retryMaxBytes int64
	avg           int64 // average size of the records admitted
	shares        int   // partitions sharing the message slots (1: no cap)
	// claim is a record a fetcher dropped because it did not fit: until
	// that fetcher reserves room for it, no other fetcher reserves;
	// waiting are the fetchers waiting to reserve, served in turn (see
	// reserve).
	claim   claim
	waiting []*fetcher

	wake  chan struct{} // cap 1: something became ready
	space chan struct{} // closed (and replaced) when room frees
}

// newBuffer returns a buffer whose fetches hold at most maxCount records
// and maxBytes, with an allowance for in-process retries of retryN
// messages and retryBytes on top.
func newBuffer(maxCount int, maxBytes int64, retryN int, retryBytes int64) *buffer {
	return &buffer{maxCount: maxCount, maxBytes: maxBytes, retryMaxN: retryN, retryMaxBytes: retryBytes,
		wake: make(chan struct{}, 1), space: make(chan struct{})}
}

// usedLocked returns what the fetches' budget is charged with: the records
// fetched and queued, and in-process retries beyond their allowance. A
// poison message whose dead letter cannot be written is nak'd again and
// again; while such retries wait they do not take the slots of new
// records, until they hold their whole allowance. b.mu held.
func (b *buffer) usedLocked() (n int, bytes int64) {
	return b.count - b.retryN + max(0, b.retryN-b.retryMaxN), b.bytes - b.retryBytes + max(0, b.retryBytes-b.retryMaxBytes)
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

// claim is what admit remembers of a record that did not fit: the fetcher
// (lane) that dropped it, its partition and its size.
type claim struct {
	lane *fetcher
	part *partition
	size int64
}

// reserve waits until at least min(want, budget) bytes and a quarter of
// the message slots are free (a fetch for every slot that frees would be
// a round trip per handful of records), and grants up to want bytes to one broker request, but
// no more than the free message slots take at the average record size
// seen: a response the count cannot hold would mostly be dropped and
// fetched again.
//
// A record admit dropped because it did not fit, larger than the grant of
// the fetch that brought it, is claimed by its lane:
// other lanes do not reserve until that lane's next reserve, which waits
// until the record fits (its size, at most the budget, is free) and
// grants at least that much; it returns the record's partition, to be
// the first of the next request (the one a broker returns a whole first
// batch of). So reservations of other lanes, each held for a long poll,
// cannot keep a large record out for ever, and a lane does not fetch a
// record again and again while it cannot fit.
//
// Lanes that wait reserve in turn: a lane that returns its grant and
// reserves again at once does not take the room another lane waits for
// (with FetchMaxBytes above half the prefetch, one lane's long polls kept
// the other out for good).
func (b *buffer) reserve(ctx context.Context, want int64, lane *fetcher) (int64, *partition, error) {
	for {
		b.mu.Lock()
		grant, first, ok := b.tryReserveLocked(want, lane)
		ch := b.space
		b.mu.Unlock()
		if ok {
			return grant, first, nil
		}
		select {
		case <-ctx.Done():
			return 0, nil, ctx.Err()
		case <-ch:
		}
	}
}

// tryReserveLocked is reserve without the wait; b.mu held.
func (b *buffer) tryReserveLocked(want int64, lane *fetcher) (grant int64, first *partition, ok bool) {
	mine := lane != nil && b.claim.lane == lane
	if lane != nil && !mine && (b.claim.lane != nil || len(b.waiting) > 0 && b.waiting[0] != lane) {
		b.wait(lane) // another lane's turn
		return 0, nil, false
	}
	need := min(want, b.maxBytes)
	if mine {
		need = min(max(need, b.claim.size), b.maxBytes)
	}
	usedN, used := b.usedLocked()
	free := b.maxBytes - used - b.reserved
	if free < need || b.maxCount-usedN < (b.maxCount+3)/4 {
		if lane != nil {
			b.wait(lane)
		}
		return 0, nil, false
	}
	grant = min(free, want)
	if b.avg > 0 {
		grant = min(grant, max(int64(b.maxCount-usedN)*(b.avg+recordOverhead), 4<<10))
	}
	if mine {
		grant, first = max(grant, need), b.claim.part
		b.claim = claim{}
	}
	if b.unwait(lane) || mine {
		b.freed() // the next lane's turn
	}
	b.reserved += grant
	return grant, first, true
}

// wait queues lane for its turn to reserve; b.mu held.
func (b *buffer) wait(lane *fetcher) {
	if !slices.Contains(b.waiting, lane) {
		b.waiting = append(b.waiting, lane)
	}
}

// unwait takes lane out of the queue and reports whether others wait
// behind it; b.mu held.
func (b *buffer) unwait(lane *fetcher) bool {
	i := slices.Index(b.waiting, lane)
	if i < 0 {
		return false
	}
	b.waiting = slices.Delete(b.waiting, i, i+1)
	return len(b.waiting) > 0
}

// leave forgets lane's claim and its turn (the lane stops).
func (b *buffer) leave(lane *fetcher) {
	b.mu.Lock()
	if b.claim.lane == lane {
		b.claim = claim{}
	}
	b.unwait(lane)
	b.freed()
	b.mu.Unlock()
}

func (b *buffer) chargeLocked(r *record) {
	b.bytes += r.size
	b.count++
	b.peak = max(b.peak, b.bytes+b.reserved)
	b.peakN = max(b.peakN, b.count)
}

func (b *buffer) releaseLocked(r *record) {
	b.bytes -= r.size
	b.count--
}

// recordOverhead approximates what a record costs on the wire beyond its
// key, value and headers (length, delta and attribute varints).
const recordOverhead = 16

// admit returns a grant and charges, of the records one fetch brought
// (one list per partition, in offset order), what fits in the budget now:
// taken round robin across the lists, a record at a time, so a partition
// with a large batch does not crowd the others out. It returns how many of
// each list it kept, no more than a partition's share of the slots
// (setShares); the caller drops the rest and fetches it again from
// the first offset not kept. When nothing is held, the first record is
// kept even if it alone is larger than the budget, so a large record still
// makes progress. The first record that does not fit, if it is larger
// than grant and the bytes (not the count) kept it out, is claimed for
// lane (see reserve). Call publish with the kept records.
func (b *buffer) admit(grant int64, lists [][]*record, lane *fetcher) []int {
	kept := make([]int, len(lists))
	b.mu.Lock()
	defer b.mu.Unlock()
	b.reserved -= grant
	if grant > 0 {
		defer b.freed()
	}
	defer func() {
		var n, bytes int64
		for i, l := range lists {
			for _, r := range l[:kept[i]] {
				n, bytes = n+1, bytes+r.size
			}
		}
		if n > 0 {
			b.avg = (b.avg + bytes/n + 1) / 2
		}
	}()
	for more := true; more; {
		more = false
		for i, l := range lists {
			if kept[i] == len(l) {
				continue
			}
			r := l[kept[i]]
			if b.shares > 1 && len(r.part.queue)-r.part.qhead+kept[i] >= (b.maxCount+b.shares-1)/b.shares {
				continue // its share of the slots is taken: the others' turn
			}
			usedN, used := b.usedLocked()
			fits := usedN < b.maxCount && used+b.reserved+r.size <= b.maxBytes
			if !fits && !(usedN == 0 && b.reserved == 0) {
				if lane != nil && b.claim.lane == nil && r.size > grant && usedN < b.maxCount {
					// Larger than what this lane's reserve granted: an
					// ordinary reserve would not make room for it.
					b.claim = claim{lane: lane, part: r.part, size: r.size}
				}
				return kept
			}
			b.chargeLocked(r)
			kept[i]++
			more = true
		}
	}
	return kept
}

// force returns a grant and charges r whether it fits or not.
func (b *buffer) force(grant int64, r *record) {
	b.mu.Lock()
	b.reserved -= grant
	b.chargeLocked(r)
	b.freed()
	b.mu.Unlock()
}

// setShares says how many partitions share the message slots: admit keeps
// at most a share of them for one partition, so partitions fetched by
// different fetchers, or with larger batches, do not crowd the others out.
func (b *buffer) setShares(n int) {
	b.mu.Lock()
	b.shares = n
	b.mu.Unlock()
}

// unreserve returns a grant whose fetch brought nothing.
func (b *buffer) unreserve(grant int64) {
	if grant == 0 {
		return
	}
	b.mu.Lock()
	b.reserved -= grant
	b.freed()
	b.mu.Unlock()
}

// publish queues records admit charged, all of partition p, ready now. If
// p's generation is ending they are released and dropped instead (its
// purge may have run already); it returns how many it dropped.
func (b *buffer) publish(p *partition, rs []*record) (dropped int) {
	if len(rs) == 0 {
		return 0
	}
	b.mu.Lock()
	if p.gen.ending.Load() {
		for _, r := range rs {
			b.releaseLocked(r)
		}
		b.freed()
		b.mu.Unlock()
		return len(rs)
	}
	if len(p.queue) == p.qhead {
		b.active = append(b.active, p)
	}
	p.queue = append(p.queue, rs...)
	b.mu.Unlock()
	b.signal()
	return 0
}

// pushDelayed keeps r until r.due, in the in-process retries' allowance.
// Beyond the allowance it takes from the fetches' budget, and may take
// the buffer over it (a Nak must never lose a message); fetches then wait
// until it drains.
func (b *buffer) pushDelayed(r *record) {
	b.mu.Lock()
	b.chargeLocked(r)
	b.retryN++
	b.retryBytes += r.size
	heap.Push(&b.delayed, r)
	b.mu.Unlock()
	b.signal()
}

// popDelayedLocked takes the first delayed record out; b.mu held.
func (b *buffer) popDelayedLocked() *record {
	r := heap.Pop(&b.delayed).(*record)
	b.retryN--
	b.retryBytes -= r.size
	return r
}

// full reports whether the in-process retries' allowance has no room for
// r (a Nak then goes to the retry topic, when there is one).
func (b *buffer) full(r *record) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.retryBytes+r.size > b.retryMaxBytes || b.retryN >= b.retryMaxN
}

// take pops up to n records totalling at most maxBytes (the first alone
// may exceed it): due in-process retries first (they have waited already),
// then one record from each partition with records in turn. Records of
// generations that are ending are dropped. It returns the time the next
// delayed record is due (zero if none).
func (b *buffer) take(now time.Time, n int, maxBytes int64, out []*record) ([]*record, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var got int64
	released := false
	give := func(r *record) bool {
		if len(out) > 0 && got+r.size > maxBytes {
			return false
		}
		b.releaseLocked(r)
		released = true
		got += r.size
		// Counted as handed out under b.mu, where ending was checked: a
		// generation's end (ending, then purge, then waiting for
		// outstanding) cannot miss a record taken just before it.
		r.part.gen.outstanding.Add(1)
		out = append(out, r)
		return true
	}
	for len(out) < n && len(b.delayed) > 0 && !b.delayed[0].due.After(now) {
		r := b.delayed[0]
		if r.part.gen.ending.Load() {
			b.popDelayedLocked()
			b.releaseLocked(r)
			released = true
			continue
		}
		if !give(r) {
			break
		}
		b.popDelayedLocked()
	}
	for len(out) < n && len(b.active) > 0 {
		if b.rr >= len(b.active) {
			b.rr = 0
		}
		p := b.active[b.rr]
		r := p.queue[p.qhead]
		if p.gen.ending.Load() {
			b.releaseLocked(r)
			released = true
		} else if !give(r) {
			break
		}
		p.queue[p.qhead] = nil
		p.qhead++
		if p.qhead == len(p.queue) {
			p.queue, p.qhead = p.queue[:0], 0
			b.active = append(b.active[:b.rr], b.active[b.rr+1:]...)
		} else {
			b.rr++
		}
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

// purge drops every held record of g.
func (b *buffer) purge(g *generation) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	dropped := 0
	keep := b.active[:0]
	for _, p := range b.active {
		if p.gen != g {
			keep = append(keep, p)
			continue
		}
		for _, r := range p.queue[p.qhead:] {
			b.releaseLocked(r)
			dropped++
		}
		clear(p.queue)
		p.queue, p.qhead = p.queue[:0], 0
	}
	clear(b.active[len(keep):])
	b.active = keep
	var kd recordHeap
	for _, r := range b.delayed {
		if r.part.gen == g {
			b.releaseLocked(r)
			b.retryN--
			b.retryBytes -= r.size
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

func (b *buffer) usage() (count int, bytes, peak int64, peakCount int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.count, b.bytes, b.peak, b.peakN
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
