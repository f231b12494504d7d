package kafkacore

import "testing"

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
