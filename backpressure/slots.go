package backpressure

import (
	"context"
	"fmt"
	"math"
	"sync"
)

// Slots is a pool of n concurrency slots shared by several routes (or
// callers) that use the same scarce capacity, typically one downstream.
// Unlike a plain semaphore it is criticality-aware:
//
//   - a freed slot goes to the waiter of the highest class first (FIFO
//     within a class), so when demand exceeds the pool the lowest class
//     waits and critical work keeps its throughput;
//   - a class may take a slot only while enough of the pool stays free
//     for the classes above it (headroom, as for Budget): by default
//     Sheddable must leave 25% of the slots free and SheddablePlus 10%,
//     rounded up, so whenever the pool has two slots or more the
//     sheddable classes always leave critical work at least one: with 2
//     slots each sheddable class uses 1; with 4, 3; with 20, Sheddable
//     uses 15 and SheddablePlus 18.
//
// A waiter whose ctx ends (for example the message's deadline) leaves the
// queue with ctx.Err() and the pool unchanged. Release panics when more is
// released than was acquired. Slots is safe for concurrent use.
type Slots struct {
	mu       sync.Mutex
	size     int
	used     int
	headroom [4]int // slots class c must leave free
	waiters  [4][]*slotWaiter
	granted  [4]uint64
	waited   [4]uint64
}

type slotWaiter struct {
	ch    chan struct{}
	ready bool
}

// NewSlots returns a pool of n > 0 slots with the default headroom.
func NewSlots(n int) (*Slots, error) {
	if n <= 0 {
		return nil, fmt.Errorf("%w: slots must be > 0, got %d", ErrInvalidOption, n)
	}
	s := &Slots{size: n}
	s.headroom[Sheddable] = headroomSlots(n, 0.25)
	s.headroom[SheddablePlus] = headroomSlots(n, 0.10)
	return s, nil
}

// headroomSlots is fraction f of n slots, rounded up (a nonzero share
// reserves at least one slot) but leaving at least one for the class
// itself.
func headroomSlots(n int, f float64) int {
	h := int(math.Ceil(float64(n) * f))
	if h >= n {
		h = n - 1
	}
	return h
}

// SetHeadroom sets the fraction (0 to <1) of the pool class c must leave
// free; it is rounded up (any nonzero fraction keeps at least one slot
// free for the classes above, when the pool has two) but never leaves c
// without a slot.
func (s *Slots) SetHeadroom(c Criticality, fraction float64) error {
	if !c.Valid() || fraction < 0 || fraction >= 1 {
		return fmt.Errorf("%w: slots headroom %v for %v", ErrInvalidOption, fraction, c)
	}
	s.mu.Lock()
	s.headroom[c] = headroomSlots(s.size, fraction)
	s.mu.Unlock()
	return nil
}

// Size reports the number of slots.
func (s *Slots) Size() int { return s.size }

// InUse reports the slots held.
func (s *Slots) InUse() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.used
}

// Waited reports, per class, how many acquisitions had to wait.
func (s *Slots) Waited() [4]uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.waited
}

func (s *Slots) fitsLocked(c Criticality) bool {
	if s.size-s.used-1 < s.headroom[c] {
		return false
	}
	for hi := c + 1; hi <= CriticalPlus; hi++ {
		if len(s.waiters[hi]) > 0 {
			return false
		}
	}
	return true
}

// TryAcquire takes a slot for class c if one is free for it now.
func (s *Slots) TryAcquire(c Criticality) bool {
	if !c.Valid() {
		c = Sheddable
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.waiters[c]) == 0 && s.fitsLocked(c) {
		s.used++
		s.granted[c]++
		return true
	}
	return false
}

// Acquire takes a slot for class c, waiting behind every waiter of a higher
// class and earlier waiters of its own. On failure it returns ctx.Err() and
// leaves the pool unchanged.
func (s *Slots) Acquire(ctx context.Context, c Criticality) error {
	if !c.Valid() {
		c = Sheddable
	}
	s.mu.Lock()
	if len(s.waiters[c]) == 0 && s.fitsLocked(c) {
		s.used++
		s.granted[c]++
		s.mu.Unlock()
		return nil
	}
	w := &slotWaiter{ch: make(chan struct{})}
	s.waiters[c] = append(s.waiters[c], w)
	s.waited[c]++
	s.mu.Unlock()
	select {
	case <-w.ch:
		return nil
	case <-ctx.Done():
		s.mu.Lock()
		if w.ready { // granted while we gave up: hand it on
			s.used--
			s.grantLocked()
			s.mu.Unlock()
			return ctx.Err()
		}
		q := s.waiters[c]
		for i, x := range q {
			if x == w {
				s.waiters[c] = append(q[:i:i], q[i+1:]...)
				break
			}
		}
		// A lower class may have been held back by this waiter.
		s.grantLocked()
		s.mu.Unlock()
		return ctx.Err()
	}
}

// Release returns one slot and hands it to the best waiter.
func (s *Slots) Release() {
	s.mu.Lock()
	if s.used <= 0 {
		s.mu.Unlock()
		panic("backpressure: Slots released more than held")
	}
	s.used--
	s.grantLocked()
	s.mu.Unlock()
}

func (s *Slots) grantLocked() {
	for c := CriticalPlus; c >= Sheddable; c-- {
		for len(s.waiters[c]) > 0 {
			if s.size-s.used-1 < s.headroom[c] {
				break
			}
			w := s.waiters[c][0]
			s.waiters[c] = s.waiters[c][1:]
			w.ready = true
			s.used++
			s.granted[c]++
			close(w.ch)
		}
		if len(s.waiters[c]) > 0 {
			return // a waiter of this class blocks every lower one
		}
	}
}
