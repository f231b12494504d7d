package consumer

import (
	"testing"

	"github.com/sluice-go/sluice/backpressure"
)

// DropLowestCriticality sheds the oldest queued message of the lowest class
// present, as documented; the arrival only when it is below every queued
// one. Before the fix an arrival tied with the lowest class was dropped
// instead of the oldest of that class.
func TestDropLowestCriticalityShedsOldestOfLowest(t *testing.T) {
	mk := func(c backpressure.Criticality) *Message { return &Message{crit: c} }
	q := newQueue(QueueFIFO, DropLowestCriticality, 3)
	s1, c1, s2 := mk(backpressure.Sheddable), mk(backpressure.Critical), mk(backpressure.Sheddable)
	for _, m := range []*Message{s1, c1, s2} {
		if v := q.push(m); v != nil {
			t.Fatal("shed below the limit")
		}
	}
	s3 := mk(backpressure.Sheddable)
	if v := q.push(s3); v != s1 {
		t.Fatalf("tied arrival: shed %p, want the oldest sheddable %p", v, s1)
	}
	c2 := mk(backpressure.Critical)
	if v := q.push(c2); v != s2 {
		t.Fatalf("critical arrival: shed %p, want oldest sheddable %p", v, s2)
	}
	// Queue: c1, s3, c2. A CRITICAL_PLUS arrival sheds s3.
	cp := mk(backpressure.CriticalPlus)
	if v := q.push(cp); v != s3 {
		t.Fatalf("shed %p, want %p", v, s3)
	}
	// Queue: c1, c2, cp. A sheddable arrival is below all: it is shed.
	s4 := mk(backpressure.Sheddable)
	if v := q.push(s4); v != s4 {
		t.Fatalf("shed %p, want the arrival %p", v, s4)
	}
	for _, want := range []*Message{c1, c2, cp} {
		if m, _ := q.pop(); m != want {
			t.Fatalf("popped %p, want %p", m, want)
		}
	}
}
