package natsadapter

import (
	"container/heap"
	"context"
	"sync"
	"time"
)

// delayedSlots counts the deliveries this Source nak'd with a delay that
// has not passed yet. JetStream keeps each of them ack-pending until it is
// redelivered, so they take MaxAckPending slots the route's window does
// not see: with MaxAckPending sized to the window alone, a route that
// delays work (retry backoff, shed with ShedDelay, a failed dead-letter
// write) stops receiving new messages once they fill it.
type delayedSlots struct {
	mu  sync.Mutex
	due dueHeap
}

// add records a delayed redelivery that becomes due at due (unix nanos).
func (d *delayedSlots) add(due int64) {
	d.mu.Lock()
	heap.Push(&d.due, due)
	d.mu.Unlock()
}

// count returns how many delayed redeliveries are not yet due at now.
func (d *delayedSlots) count(now int64) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	for len(d.due) > 0 && d.due[0] <= now {
		heap.Pop(&d.due)
	}
	return len(d.due)
}

type dueHeap []int64

func (h dueHeap) Len() int           { return len(h) }
func (h dueHeap) Less(i, j int) bool { return h[i] < h[j] }
func (h dueHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *dueHeap) Push(x any)        { *h = append(*h, x.(int64)) }
func (h *dueHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// Sizing MaxAckPending for delayed redeliveries: a consumer the Source
// created with MaxAckPending left at 0 gets the window plus a reserve for
// delayed naks, and the reserve grows (MaxAckPending is raised on the
// server, never lowered) when delayed naks take half of it, up to
// maxDelayReserve.
const (
	minDelayReserve = 256
	maxDelayReserve = 1 << 16
)

// initialDelayReserve is the reserve a route of window messages starts
// with: room for a window's worth of delayed naks, at least 256.
func initialDelayReserve(window int) int { return max(window, minDelayReserve) }

// sizeAckPending raises the consumer's MaxAckPending when delayed naks
// take half of the reserve above the window. It runs in the fetch loop,
// before a pull; a failed update is tried again a second later, a
// successful one may be followed by the next at once (the reserve at
// least doubles each time, so a burst of delayed naks is covered in a few
// steps).
func (s *Source) sizeAckPending(ctx context.Context) {
	if !s.autoAckPending {
		return
	}
	now := time.Now()
	d := s.delayed.count(now.UnixNano())
	if now.Before(s.sizeRetry) || !s.sizeNow && (d < s.reserve/2 || s.reserve >= maxDelayReserve) {
		return
	}
	initial, reserve := s.sizeNow, s.reserve
	if !initial {
		reserve = min(max(4*d, 2*s.reserve), maxDelayReserve)
	}
	uctx, cancel := context.WithTimeout(ctx, s.opts.PollWait)
	defer cancel()
	cons := s.Consumer()
	info, err := cons.Info(uctx) // fresh: another process may have raised it
	if err != nil {
		s.sizeRetry = now.Add(time.Second)
		return
	}
	cfg := info.Config
	if need := s.window + reserve; cfg.MaxAckPending > 0 && cfg.MaxAckPending < need {
		cfg.MaxAckPending = need
		if cons, err = s.js.UpdateConsumer(uctx, s.stream, cfg); err != nil {
			s.sizeRetry = now.Add(time.Second)
			return
		}
		s.mu.Lock()
		s.cons = cons
		s.mu.Unlock()
		if !initial {
			s.c.ackPendingRaises.Add(1)
		}
	}
	s.reserve, s.sizeNow = reserve, false
}
