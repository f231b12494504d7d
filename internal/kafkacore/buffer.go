package kafkacore

import (
	"container/heap"
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Gen is what the buffer knows of a generation (one assignment of
// partitions to this member): whether it is ending (its records are no
// longer handed out, but dropped) and how many of its records are handed
// out and not yet settled or put back. An adapter's generation embeds it.
type Gen struct {
	Ending      atomic.Bool
	Outstanding atomic.Int64
}

// Part is a partition's queue in a Buffer: the records fetched and not
// handed out, under the buffer's lock. An adapter's partition embeds it
// and sets Gen.
type Part[R any] struct {
	Gen   *Gen
	queue []R
	qhead int
}

// Item is what a Buffer holds: an adapter's record, which knows its size
// (what it is charged), when it is due (an in-process retry's not-before)
// and its partition's queue.
type Item[R any] interface {
	BufferSize() int64
	BufferDue() time.Time
	BufferPart() *Part[R]
}

// Buffer holds what a Source prefetched and the messages it keeps for an
// in-process retry, all charged against one byte and message budget (the
// prefetch). The fetcher reserves room before each broker request (a
// quarter of the message slots free, and the bytes it asks for) and keeps
// of the response what fits the bytes, up to the budget's message count
// (Admit), so the bytes held never exceed the budget and the records held
// stay below its count plus one response per fetcher; the rest of a
// response is dropped and fetched again later.
// The route's Fetch takes messages out (they are then the window's),
// serving the partitions round robin; a Nak puts one back.
//
// A lane is a fetcher's identity (any comparable value, nil for none):
// lanes that wait for room reserve in turn, and a record too large for
// one lane's grant is claimed by that lane (see Reserve). A client that
// fetches on its own (franz-go, sarama) reserves as one lane and charges
// what it polled with Admit (or Force what it cannot put back).
type Buffer[R Item[R]] struct {
	mu       sync.Mutex
	active   []*Part[R] // partitions with queued records, served round robin
	rr       int        // next index into active
	delayed  itemHeap[R]
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
	// waiting are the fetchers waiting to Reserve, served in turn (see
	// Reserve).
	claim   claim[R]
	waiting []any

	wake  chan struct{} // cap 1: something became ready
	space chan struct{} // closed (and replaced) when room frees
}

// NewBuffer returns a buffer whose fetches hold at most maxCount records
// and maxBytes, with an allowance for in-process retries of retryN
// messages and retryBytes on top.
func NewBuffer[R Item[R]](maxCount int, maxBytes int64, retryN int, retryBytes int64) *Buffer[R] {
	return &Buffer[R]{maxCount: maxCount, maxBytes: maxBytes, retryMaxN: retryN, retryMaxBytes: retryBytes,
		wake: make(chan struct{}, 1), space: make(chan struct{})}
}

// usedLocked returns what the fetches' budget is charged with: the records
// fetched and queued, and in-process retries beyond their allowance. A
// poison message whose dead letter cannot be written is nak'd again and
// again; while such retries wait they do not take the slots of new
// records, until they hold their whole allowance. b.mu held.
func (b *Buffer[R]) usedLocked() (n int, bytes int64) {
	return b.count - b.retryN + max(0, b.retryN-b.retryMaxN), b.bytes - b.retryBytes + max(0, b.retryBytes-b.retryMaxBytes)
}

func (b *Buffer[R]) signal() {
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// freed wakes Reserve waiters; b.mu held.
func (b *Buffer[R]) freed() {
	close(b.space)
	b.space = make(chan struct{})
}

// claim is what Admit remembers of a record that did not fit: the fetcher
// (lane) that dropped it, its partition and its size.
type claim[R any] struct {
	lane any
	part *Part[R]
	size int64
}

// Reserve waits until at least min(want, budget) bytes and a quarter of
// the message slots are free (a fetch for every slot that frees would be
// a round trip per handful of records), and grants up to want bytes to one broker request, but
// no more than the free message slots take at the average record size
// seen: a response the count cannot hold would mostly be dropped and
// fetched again.
//
// A record Admit dropped because it did not fit, larger than the grant of
// the fetch that brought it, is claimed by its lane:
// other lanes do not Reserve until that lane's next Reserve, which waits
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
func (b *Buffer[R]) Reserve(ctx context.Context, want int64, lane any) (int64, *Part[R], error) {
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

// TryReserve is Reserve without the wait: ok false when the room is not
// free (lane then waits for its turn), with space, the channel closed
// when room frees next.
func (b *Buffer[R]) TryReserve(want int64, lane any) (grant int64, first *Part[R], ok bool, space <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	grant, first, ok = b.tryReserveLocked(want, lane)
	return grant, first, ok, b.space
}

// tryReserveLocked is Reserve without the wait; b.mu held.
func (b *Buffer[R]) tryReserveLocked(want int64, lane any) (grant int64, first *Part[R], ok bool) {
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
		grant = min(grant, max(int64(b.maxCount-usedN)*(b.avg+RecordOverhead), 4<<10))
	}
	if mine {
		grant, first = max(grant, need), b.claim.part
		b.claim = claim[R]{}
	}
	if b.unwait(lane) || mine {
		b.freed() // the next lane's turn
	}
	b.reserved += grant
	return grant, first, true
}

// wait queues lane for its turn to reserve; b.mu held.
func (b *Buffer[R]) wait(lane any) {
	if !slices.Contains(b.waiting, lane) {
		b.waiting = append(b.waiting, lane)
	}
}

// unwait takes lane out of the queue and reports whether others wait
// behind it; b.mu held.
func (b *Buffer[R]) unwait(lane any) bool {
	i := slices.Index(b.waiting, lane)
	if i < 0 {
		return false
	}
	b.waiting = slices.Delete(b.waiting, i, i+1)
	return len(b.waiting) > 0
}

// Leave forgets lane's claim and its turn (the lane stops).
func (b *Buffer[R]) Leave(lane any) {
	b.mu.Lock()
	if b.claim.lane == lane {
		b.claim = claim[R]{}
	}
	b.unwait(lane)
	b.freed()
	b.mu.Unlock()
}

func (b *Buffer[R]) chargeLocked(r R) {
	b.bytes += r.BufferSize()
	b.count++
	b.peak = max(b.peak, b.bytes+b.reserved)
	b.peakN = max(b.peakN, b.count)
}

func (b *Buffer[R]) releaseLocked(r R) {
	b.bytes -= r.BufferSize()
	b.count--
}

// RecordOverhead approximates what a record costs on the wire beyond its
// key, value and headers (length, delta and attribute varints).
const RecordOverhead = 16

// Admit returns a grant and charges, of the records one fetch brought
// (one list per partition, in offset order), what fits: taken round
// robin across the lists, a record at a time, so a partition with a large
// batch does not crowd the others out. It returns how many of each list
// it kept; the caller drops the rest and fetches it again from the first
// offset not kept.
//
// The bytes always bound it: a record is kept only while the records held
// plus the room reserved for other fetches stay within the budget's
// bytes. When nothing is held, the first record is kept even if it alone
// is larger than the budget, so a large record still makes progress. The
// first record that does not fit, if it is larger than grant and the
// bytes (not the count) kept it out, is claimed for lane (see Reserve).
//
// The count depends on grant. A fetch's response (grant > 0: Reserve let
// it be sent, which it does only while a quarter of the message slots
// are free) is kept whole up to the budget's message count (maxCount
// records of one response), whatever the records already held: the
// count gates sending a fetch, and a broker returns a partition's whole
// first record batch even when it holds more records than the free slots
// (dropping the excess and fetching it again decoded each record many
// times). So the records held stay below maxCount plus, per fetcher, one
// response of at most maxCount records. Records charged without a grant
// (grant 0: a client that hands records over one at a time) are kept only
// while fewer than maxCount are held, and no more than a partition's
// share of the slots (SetShares).
//
// Call Publish with the kept records.
func (b *Buffer[R]) Admit(grant int64, lists [][]R, lane any) []int {
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
				n, bytes = n+1, bytes+r.BufferSize()
			}
		}
		if n > 0 {
			b.avg = (b.avg + bytes/n + 1) / 2
		}
	}()
	total := 0 // kept of this response
	for more := true; more; {
		more = false
		for i, l := range lists {
			if kept[i] == len(l) {
				continue
			}
			r := l[kept[i]]
			if grant == 0 && b.shares > 1 && len(r.BufferPart().queue)-r.BufferPart().qhead+kept[i] >= (b.maxCount+b.shares-1)/b.shares {
				continue // its share of the slots is taken: the others' turn
			}
			usedN, used := b.usedLocked()
			room := usedN < b.maxCount // a record handed over alone
			if grant > 0 {
				room = total < b.maxCount // a fetch's response
			}
			fits := room && used+b.reserved+r.BufferSize() <= b.maxBytes
			if !fits && !(usedN == 0 && b.reserved == 0) {
				if lane != nil && b.claim.lane == nil && r.BufferSize() > grant && room {
					// Larger than what this lane's Reserve granted: an
					// ordinary Reserve would not make room for it.
					b.claim = claim[R]{lane: lane, part: r.BufferPart(), size: r.BufferSize()}
				}
				return kept
			}
			b.chargeLocked(r)
			kept[i]++
			total++
			more = true
		}
	}
	return kept
}

// Force returns a grant and charges r whether it fits or not.
func (b *Buffer[R]) Force(grant int64, r R) {
	b.mu.Lock()
	b.reserved -= grant
	b.chargeLocked(r)
	b.freed()
	b.mu.Unlock()
}

// Charge charges rs whether they fit or not: records a client cannot put
// back (franz-go and sarama hand over what they fetched), polled for the
// room a Reserve found. Call Publish with them.
func (b *Buffer[R]) Charge(rs []R) {
	if len(rs) == 0 {
		return
	}
	b.mu.Lock()
	for _, r := range rs {
		b.chargeLocked(r)
	}
	b.mu.Unlock()
}

// SetShares says how many partitions share the message slots: Admit keeps
// of the records charged without a grant (handed over one at a time) at
// most a share of them for one partition, so partitions fed by different
// goroutines, or with larger batches, do not crowd the others out. A
// fetch's response (Admit with a grant) is not capped by it: the count
// only gates sending fetches.
func (b *Buffer[R]) SetShares(n int) {
	b.mu.Lock()
	b.shares = n
	b.mu.Unlock()
}

// Unreserve returns a grant whose fetch brought nothing.
func (b *Buffer[R]) Unreserve(grant int64) {
	if grant == 0 {
		return
	}
	b.mu.Lock()
	b.reserved -= grant
	b.freed()
	b.mu.Unlock()
}

// Publish queues records Admit charged, all of partition p, ready now. If
// p's generation is ending they are released and dropped instead (its
// Purge may have run already); it returns how many it dropped.
func (b *Buffer[R]) Publish(p *Part[R], rs []R) (dropped int) {
	if len(rs) == 0 {
		return 0
	}
	b.mu.Lock()
	if p.Gen.Ending.Load() {
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

// PushDelayed keeps r until r.due, in the in-process retries' allowance.
// Beyond the allowance it takes from the fetches' budget, and may take
// the buffer over it (a Nak must never lose a message); fetches then wait
// until it drains.
func (b *Buffer[R]) PushDelayed(r R) {
	b.mu.Lock()
	b.chargeLocked(r)
	b.retryN++
	b.retryBytes += r.BufferSize()
	heap.Push(&b.delayed, r)
	b.mu.Unlock()
	b.signal()
}

// popDelayedLocked takes the first delayed record out; b.mu held.
func (b *Buffer[R]) popDelayedLocked() R {
	r := heap.Pop(&b.delayed).(R)
	b.retryN--
	b.retryBytes -= r.BufferSize()
	return r
}

// Full reports whether the in-process retries' allowance has no room for
// r (a Nak then goes to the retry topic, when there is one).
func (b *Buffer[R]) Full(r R) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.retryBytes+r.BufferSize() > b.retryMaxBytes || b.retryN >= b.retryMaxN
}

// Take pops up to n records totalling at most maxBytes (the first alone
// may exceed it): due in-process retries first (they have waited already),
// then one record from each partition with records in turn. Records of
// generations that are ending are dropped. It returns the time the next
// delayed record is due (zero if none).
func (b *Buffer[R]) Take(now time.Time, n int, maxBytes int64, out []R) ([]R, time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	var got int64
	released := false
	give := func(r R) bool {
		if len(out) > 0 && got+r.BufferSize() > maxBytes {
			return false
		}
		b.releaseLocked(r)
		released = true
		got += r.BufferSize()
		// Counted as handed out under b.mu, where ending was checked: a
		// generation's end (ending, then purge, then waiting for
		// outstanding) cannot miss a record taken just before it.
		r.BufferPart().Gen.Outstanding.Add(1)
		out = append(out, r)
		return true
	}
	for len(out) < n && len(b.delayed) > 0 && !b.delayed[0].BufferDue().After(now) {
		r := b.delayed[0]
		if r.BufferPart().Gen.Ending.Load() {
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
		if p.Gen.Ending.Load() {
			b.releaseLocked(r)
			released = true
		} else if !give(r) {
			break
		}
		var zero R
		p.queue[p.qhead] = zero
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
		next = b.delayed[0].BufferDue()
	}
	return out, next
}

// Purge drops every held record of g.
func (b *Buffer[R]) Purge(g *Gen) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	dropped := 0
	keep := b.active[:0]
	for _, p := range b.active {
		if p.Gen != g {
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
	var kd itemHeap[R]
	for _, r := range b.delayed {
		if r.BufferPart().Gen == g {
			b.releaseLocked(r)
			b.retryN--
			b.retryBytes -= r.BufferSize()
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

func (b *Buffer[R]) Usage() (count int, bytes, peak int64, peakCount int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.count, b.bytes, b.peak, b.peakN
}

// Wake is signalled (capacity 1) when records became ready to Take.
func (b *Buffer[R]) Wake() <-chan struct{} { return b.wake }

// Free returns the message slots and bytes of the prefetch not charged or
// reserved (negative when a Nak or Force took it over).
func (b *Buffer[R]) Free() (n int, bytes int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	usedN, used := b.usedLocked()
	return b.maxCount - usedN, b.maxBytes - used - b.reserved
}

// MaxCount returns the prefetch's message slots.
func (b *Buffer[R]) MaxCount() int { return b.maxCount }

// BufferState is a snapshot of a Buffer's accounting, for checks and
// diagnostics (the adapters' simulations read it).
type BufferState struct {
	Count, RetryN, MaxCount, RetryMaxN, Active, Delayed  int
	Bytes, Reserved, MaxBytes, RetryBytes, RetryMaxBytes int64
	ClaimLane                                            any
	ClaimSize                                            int64
	Waiting                                              int
	NextDue                                              time.Time // of the first delayed record; zero: none
	// What the records held add up to (counted, not the counters):
	// queued (fetched, not handed out) and delayed (in-process retries).
	QueuedN                   int
	QueuedBytes, DelayedBytes int64
}

// State returns a snapshot of b's accounting. It walks every record
// held: for checks and diagnostics, not the hot path.
func (b *Buffer[R]) State() BufferState {
	b.mu.Lock()
	defer b.mu.Unlock()
	st := BufferState{Count: b.count, RetryN: b.retryN, MaxCount: b.maxCount, RetryMaxN: b.retryMaxN,
		Active: len(b.active), Delayed: len(b.delayed), Bytes: b.bytes, Reserved: b.reserved, MaxBytes: b.maxBytes,
		RetryBytes: b.retryBytes, RetryMaxBytes: b.retryMaxBytes, ClaimLane: b.claim.lane, ClaimSize: b.claim.size,
		Waiting: len(b.waiting)}
	if len(b.delayed) > 0 {
		st.NextDue = b.delayed[0].BufferDue()
	}
	for _, p := range b.active {
		for _, r := range p.queue[p.qhead:] {
			st.QueuedBytes += r.BufferSize()
			st.QueuedN++
		}
	}
	for _, r := range b.delayed {
		st.DelayedBytes += r.BufferSize()
	}
	return st
}

// Queued returns a copy of p's records fetched and not handed out.
func (b *Buffer[R]) Queued(p *Part[R]) []R {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(p.queue[p.qhead:])
}

// DelayedItems returns a copy of the in-process retries b holds.
func (b *Buffer[R]) DelayedItems() []R {
	b.mu.Lock()
	defer b.mu.Unlock()
	return slices.Clone(b.delayed)
}

type itemHeap[R Item[R]] []R

func (h itemHeap[R]) Len() int           { return len(h) }
func (h itemHeap[R]) Less(i, j int) bool { return h[i].BufferDue().Before(h[j].BufferDue()) }
func (h itemHeap[R]) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *itemHeap[R]) Push(x any)        { *h = append(*h, x.(R)) }
func (h *itemHeap[R]) Pop() any {
	old := *h
	r := old[len(old)-1]
	var zero R
	old[len(old)-1] = zero
	*h = old[:len(old)-1]
	return r
}
