package consumer

import (
	"testing"
	"testing/synctest"

	"github.com/sluice-go/sluice/backpressure"
)

// DropLowestCriticality sheds the oldest queued message of the lowest class
// present, as documented; the arrival only when it is below every queued
// one. Before the fix an arrival tied with the lowest class was dropped
// instead of the oldest of that class.
func TestDropLowestCriticalityShedsOldestOfLowest(t *testing.T) {
	mk := func(c backpressure.Criticality) *Message { return &Message{crit: c} }
	q := newQueue(QueueFIFO, DropLowestCriticality, 3, 0)
	s1, c1, s2 := mk(backpressure.Sheddable), mk(backpressure.Critical), mk(backpressure.Sheddable)
	for _, m := range []*Message{s1, c1, s2} {
		if v := one(q.push(m)); v != nil {
			t.Fatal("shed below the limit")
		}
	}
	s3 := mk(backpressure.Sheddable)
	if v := one(q.push(s3)); v != s1 {
		t.Fatalf("tied arrival: shed %p, want the oldest sheddable %p", v, s1)
	}
	c2 := mk(backpressure.Critical)
	if v := one(q.push(c2)); v != s2 {
		t.Fatalf("critical arrival: shed %p, want oldest sheddable %p", v, s2)
	}
	// Queue: c1, s3, c2. A CRITICAL_PLUS arrival sheds s3.
	cp := mk(backpressure.CriticalPlus)
	if v := one(q.push(cp)); v != s3 {
		t.Fatalf("shed %p, want %p", v, s3)
	}
	// Queue: c1, c2, cp. A sheddable arrival is below all: it is shed.
	s4 := mk(backpressure.Sheddable)
	if v := one(q.push(s4)); v != s4 {
		t.Fatalf("shed %p, want the arrival %p", v, s4)
	}
	for _, want := range []*Message{c1, c2, cp} {
		if m, _ := q.pop(); m != want {
			t.Fatalf("popped %p, want %p", m, want)
		}
	}
}

// one is the single victim of a push bounded by count.
func one(vs []*Message) *Message {
	if len(vs) != 1 {
		return nil
	}
	return vs[0]
}

// A queue bounded in cost units sheds (by its drop policy) as many queued
// messages as it takes for a dear arrival to fit, and the arrival itself
// when it alone is over the bound; its load follows pushes, pops and reaps.
func TestQueueBoundedByCost(t *testing.T) {
	mk := func(u int32) *Message { return &Message{units: u} }
	q := newQueue(QueueFIFO, DropOldest, 0, 10)
	a, b, c := mk(3), mk(3), mk(3)
	for _, m := range []*Message{a, b, c} {
		if vs := q.push(m); len(vs) != 0 {
			t.Fatal("shed under the bound")
		}
	}
	if q.load() != 9 {
		t.Fatalf("load %d", q.load())
	}
	d := mk(6) // 9 + 6 > 10: the two oldest go
	if vs := q.push(d); len(vs) != 2 || vs[0] != a || vs[1] != b {
		t.Fatalf("shed %v, want a and b", vs)
	}
	if q.load() != 9 || q.len() != 2 {
		t.Fatalf("load %d, len %d after the dear push", q.load(), q.len())
	}
	tail := newQueue(QueueFIFO, DropNewest, 0, 10)
	tail.push(mk(8))
	e := mk(5)
	if vs := tail.push(e); len(vs) != 1 || vs[0] != e || tail.load() != 8 {
		t.Fatalf("tail drop: shed %v, load %d", vs, tail.load())
	}
	if m, _ := q.pop(); m != c || q.load() != 6 {
		t.Fatalf("pop %p, load %d", m, q.load())
	}
	d.startBy = 5
	if late, _ := q.takeLate(10); len(late) != 1 || q.load() != 0 {
		t.Fatalf("reaped %d, load %d", len(late), q.load())
	}
}

// The resource cap bounds the messages workers have taken and not
// finished: a pop past it waits until one finishes or the cap rises, and a
// closed queue is drained whatever the cap.
func TestQueueRunCap(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newQueue(QueueFIFO, DropNewest, 0, 0)
		for range 4 {
			q.push(&Message{})
		}
		q.setRunCap(1)
		if _, ok := q.pop(); !ok {
			t.Fatal("first pop under the cap")
		}
		got := make(chan struct{}, 4)
		popper := func() {
			if _, ok := q.pop(); ok {
				got <- struct{}{}
			}
		}
		go popper()
		synctest.Wait()
		if len(got) != 0 {
			t.Fatal("a second message taken with a cap of one running")
		}
		q.finished()
		synctest.Wait()
		if len(got) != 1 {
			t.Fatal("not taken after the first finished")
		}
		go popper()
		synctest.Wait()
		if len(got) != 1 {
			t.Fatal("taken past the cap")
		}
		q.setRunCap(2)
		synctest.Wait()
		if len(got) != 2 {
			t.Fatal("not taken when the cap rose")
		}
		// Two taken, cap two, one queued: closing drains it.
		go popper()
		synctest.Wait()
		q.close()
		synctest.Wait()
		if len(got) != 3 || q.taken.Load() != 3 {
			t.Fatalf("after close: %d taken by the poppers, %d counted", len(got), q.taken.Load())
		}
	})
}
