package kafkacore

import (
	"sort"
	"sync"
	"sync/atomic"
)

// Watermark tracks one partition's delivered offsets and which of them are
// settled, and yields the offset that is safe to commit: the lowest offset
// delivered but not settled, or one past the last delivered offset when
// everything is settled. Offsets the broker never delivered (compacted away,
// transaction markers) are skipped, since only delivered offsets are
// tracked.
//
// Deliver offsets in increasing order; Settle them in any order. The zero
// value is not usable: create it with NewWatermark. It is safe for
// concurrent use.
//
// Offsets settled above the commit point are what a restart or rebalance
// would redo: CommitMetadata encodes them as a compact map for the commit's
// metadata, and Restore (on the next owner) takes the map back, so that
// Skip passes over what was settled.
type Watermark struct {
	mu        sync.Mutex
	offs      []int64 // delivered, ascending; offs[head:] are live
	done      []bool  // settled flags, parallel to offs
	head      int
	next      int64 // one past the last delivered offset; -1 before the first
	committed int64 // last commit point handed out by Commit; -1 none
	pending   int   // delivered, not settled

	meta       string       // metadata of the last commit (Committed)
	restored   Settled      // settled by a previous owner, above its commit (Restore)
	restoredHi atomic.Int64 // one past the last restored offset; 0: none (Skip's fast path)
}

// NewWatermark returns a tracker with nothing delivered.
func NewWatermark() *Watermark { return &Watermark{next: -1, committed: -1} }

// Deliver records that offset was handed out. Offsets at or below the last
// delivered one are ignored and reported false (a broker batch that starts
// before the requested offset).
func (w *Watermark) Deliver(offset int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.next >= 0 && offset < w.next {
		return false
	}
	w.offs = append(w.offs, offset)
	w.done = append(w.done, false)
	w.next = offset + 1
	w.pending++
	return true
}

// Begin sets the position a partition starts from before anything is
// delivered: with nothing pending, Commit offers it (so a start position the
// Source resolved itself, FirstOffset or LastOffset, is committed and a
// rebalance cannot move it past records written meanwhile). It never moves
// the position back, and does nothing while deliveries are pending.
func (w *Watermark) Begin(offset int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if offset < 0 || w.head < len(w.offs) || offset <= w.next {
		return
	}
	w.next = offset
}

// Advance records that the offsets below next that were not delivered
// never will be (transaction markers): once everything delivered is
// settled, the commit point is next, so a partition whose log ends with a
// marker is committed to its end. It never moves the position back.
func (w *Watermark) Advance(next int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next = max(w.next, next)
}

// Settle marks offset settled. It reports false when offset was never
// delivered, or was settled before (the second settle changes nothing).
func (w *Watermark) Settle(offset int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	live := w.offs[w.head:]
	i := sort.Search(len(live), func(i int) bool { return live[i] >= offset })
	if i == len(live) || live[i] != offset || w.done[w.head+i] {
		return false
	}
	w.done[w.head+i] = true
	w.pending--
	for w.head < len(w.offs) && w.done[w.head] {
		w.head++
	}
	w.compact()
	return true
}

// compact drops settled offsets once they are most of what is kept: below
// the head (a prefix) and, behind an unsettled offset, in the middle. Only
// unsettled offsets matter to the commit point, so memory stays
// proportional to the pending ones even while one offset is stuck and
// everything after it completes.
func (w *Watermark) compact() {
	live := len(w.offs) - w.head
	if settled := live - w.pending; settled > 1024 && settled > w.pending {
		n := 0
		for i := w.head; i < len(w.offs); i++ {
			if !w.done[i] {
				w.offs[n], w.done[n] = w.offs[i], false
				n++
			}
		}
		w.offs, w.done, w.head = w.offs[:n], w.done[:n], 0
		return
	}
	if w.head > 1024 && w.head*2 > len(w.offs) {
		n := copy(w.offs, w.offs[w.head:])
		copy(w.done, w.done[w.head:])
		w.offs, w.done, w.head = w.offs[:n], w.done[:n], 0
	}
}

// Point returns the commit point (the next offset to consume once
// everything below it is done) and false when nothing was delivered yet.
func (w *Watermark) Point() (int64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.point()
}

func (w *Watermark) point() (int64, bool) {
	if w.head < len(w.offs) {
		return w.offs[w.head], true
	}
	p := w.next
	if p >= 0 && len(w.restored) > 0 && w.restored.Has(p) {
		// Everything delivered is settled, and so are the next offsets, by
		// a previous owner: commit past them.
		p = w.restored.From(p)[0].Hi
	}
	return p, p >= 0
}

// Pending returns how many delivered offsets are not settled.
func (w *Watermark) Pending() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pending
}

// Commit returns the commit point if it moved beyond the last one handed
// out by Commit (a commit never goes backwards), and false otherwise. Call
// Committed after the broker accepted it, or nothing when it failed (the
// next Commit offers it again).
func (w *Watermark) Commit() (int64, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.point()
	if !ok || p <= w.committed {
		return 0, false
	}
	return p, true
}

// Committed records that offset was committed.
func (w *Watermark) Committed(offset int64) {
	w.CommittedMetadata(offset, "")
}

// CommitMetadata is Commit with the commit's metadata: the map of the
// offsets settled above the commit point (see Restore), or "" when there
// are none. It reports true also when only the map changed since the last
// commit (a stuck offset holds the point while later ones settle). Call
// CommittedMetadata after the broker accepted it.
func (w *Watermark) CommitMetadata() (offset int64, meta string, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	p, ok := w.point()
	if !ok || p < w.committed {
		return 0, "", false
	}
	meta = EncodeSettled(p, w.settledAbove(p))
	if p == w.committed && meta == w.meta {
		return 0, "", false
	}
	return p, meta, true
}

// settledAbove returns the offsets above the commit point p that are
// settled: between p and the next offset to deliver, all but the delivered
// ones not settled (what was never delivered below it does not exist);
// from there on, what Restore said. w.mu held.
func (w *Watermark) settledAbove(p int64) Settled {
	var s Settled
	from := p + 1
	for i := w.head; i < len(w.offs); i++ {
		if o := w.offs[i]; !w.done[i] && o > p {
			s = s.Add(from, o)
			from = o + 1
		}
	}
	if from < w.next {
		s = s.Add(from, w.next)
	}
	for _, r := range w.restored.From(max(w.next, p+1)) {
		s = s.Add(r.Lo, r.Hi)
	}
	return s
}

// CommittedMetadata records that offset was committed with meta.
func (w *Watermark) CommittedMetadata(offset int64, meta string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if offset >= w.committed {
		w.committed, w.meta = offset, meta
	}
	w.prune(offset)
}

// Restore takes back the map a previous owner committed with offset (its
// commit's metadata, see CommitMetadata), before anything is delivered:
// Skip then reports the offsets it lists as settled, and the commit point
// and map keep them until they are passed. Metadata without a map for
// offset (another client's, an older sluice's) restores nothing. It returns
// how many offsets it restored.
func (w *Watermark) Restore(offset int64, meta string) int64 {
	s := DecodeSettled(offset, meta)
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(s) == 0 || w.next >= 0 || len(w.offs) > 0 {
		return 0
	}
	w.restored = s
	w.restoredHi.Store(s[len(s)-1].Hi)
	w.committed, w.meta = max(w.committed, offset), meta
	n := int64(0)
	for _, r := range s {
		n += r.Hi - r.Lo
	}
	return n
}

// Skip reports whether offset was settled by a previous owner (Restore):
// the caller passes over it instead of delivering it.
func (w *Watermark) Skip(offset int64) bool {
	if offset >= w.restoredHi.Load() {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.restored.Has(offset)
}

// prune forgets restored offsets below offset, which every commit from
// now on passes. w.mu held.
func (w *Watermark) prune(offset int64) {
	if len(w.restored) == 0 {
		return
	}
	w.restored = w.restored.From(offset)
	if len(w.restored) == 0 {
		w.restored = nil
		w.restoredHi.Store(0)
	}
}

// LastCommitted returns the highest committed offset, -1 when none.
func (w *Watermark) LastCommitted() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.committed
}
