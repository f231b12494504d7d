package kafkaadapter

import (
	"sync"
	"testing"
	"time"
)

// TestTakeCountsOutstanding races Fetch's take against the end of a
// generation (ending, purge, wait for outstanding, final commit): a record
// that take handed out must already be counted in outstanding when the
// generation's end looks, or the final commit runs while it is in flight
// and a record of a revoked generation is handed to the handler. Before
// the fix, outstanding was counted in Fetch after take had released the
// buffer lock.
func TestTakeCountsOutstanding(t *testing.T) {
	for range 200 {
		b := newBuffer(1000, 1<<20)
		g := &generation{kick: make(chan struct{}, 1)}
		p := &partition{gen: g, wm: NewWatermark()}
		var recs []*record
		for i := range 50 {
			r := &record{part: p, offset: int64(i), size: 1}
			p.wm.Deliver(r.offset)
			recs = append(recs, r)
		}
		b.push(recs)
		var taken int64 // written by the taker only until purge returns
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				out, _ := b.take(time.Now(), 1, 1<<20, nil)
				if len(out) == 0 {
					return
				}
				taken += int64(len(out))
			}
		}()
		// The generation ends while take runs.
		time.Sleep(time.Duration(len(recs)%7) * time.Microsecond)
		g.ending.Store(true)
		b.purge(g)
		seen := g.outstanding.Load()
		wg.Wait()
		if seen != taken {
			t.Fatalf("after the generation ended, outstanding was %d but take had handed out %d", seen, taken)
		}
	}
}

// TestWatermarkStuckMemory: one offset stays unsettled (a stuck handler)
// while the partition's next 200k offsets are delivered and settled. The
// commit point holds at the stuck offset, and the tracker keeps memory for
// the pending offsets only. Before the fix it kept every offset delivered
// after the stuck one until that one settled: memory grew with the
// throughput of the partition for as long as the handler was stuck.
func TestWatermarkStuckMemory(t *testing.T) {
	w := NewWatermark()
	const stuck = 7
	for o := int64(0); o < 200_000; o++ {
		w.Deliver(o)
		if o != stuck && o%1000 != 999 {
			w.Settle(o)
		}
		if o%1000 == 999 {
			w.Settle(o - 1000) // a window of pending ones trails behind
		}
	}
	if p, _ := w.Point(); p != stuck {
		t.Fatalf("point %d, want the stuck offset %d", p, stuck)
	}
	w.mu.Lock()
	kept, pending := len(w.offs)-w.head, w.pending
	w.mu.Unlock()
	if kept > 2*pending+1100 {
		t.Fatalf("tracker keeps %d offsets for %d pending", kept, pending)
	}
	w.Settle(stuck)
	if p, _ := w.Point(); p != 199_999 {
		t.Fatalf("point after release %d, want 199999 (the last pending)", p)
	}
	w.Settle(199_999)
	if p, _ := w.Point(); p != 200_000 || w.Pending() != 0 {
		t.Fatalf("final point %d, pending %d", p, w.Pending())
	}
	if w.Settle(5) || w.Settle(stuck) {
		t.Fatal("a second settle of a compacted offset was accepted")
	}
}
