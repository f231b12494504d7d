package consumer

import (
	"testing"
	"time"
)

// decide: a standing queue is every start late, or a quarter of what was
// fetched dropped; it ends when neither holds and a start was half an
// allowance early; an interval without starts or drops changes nothing;
// nothing is decided before the interval has passed.
func TestFreshnessDecides(t *testing.T) {
	var f freshness
	f.init(0)
	f.allow = 40 * time.Millisecond
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	const target = 30 * time.Millisecond // interval: 100 ms
	fresh := at(0).UnixNano()
	if f.decide(at(0), target) {
		t.Fatal("standing before anything happened")
	}
	// Every start late: standing, but only once the interval has passed.
	f.started(fresh, at(5))
	if f.decide(at(50), target) {
		t.Fatal("decided within the interval")
	}
	if !f.decide(at(100), target) {
		t.Fatal("every start late: want standing")
	}
	// No starts, nothing fetched: hold.
	if !f.decide(at(200), target) {
		t.Fatal("an empty interval ended the state")
	}
	// A start 10 ms early (under half the 40 ms allowance): hold.
	f.started(fresh, at(200-10))
	if !f.decide(at(300), target) {
		t.Fatal("a start 10 ms early ended the state")
	}
	// A start 30 ms early, but a quarter dropped: hold.
	f.started(at(400).UnixNano(), at(370))
	f.counted(20, 5)
	if !f.decide(at(400), target) {
		t.Fatal("a quarter dropped, yet the state ended")
	}
	// A start 30 ms early and few drops: the state ends.
	f.started(at(500).UnixNano(), at(470))
	f.counted(20, 4)
	if f.decide(at(500), target) {
		t.Fatal("a start 30 ms early: want the state ended")
	}
	// A quarter dropped enters it whatever the starts show.
	f.started(at(600).UnixNano(), at(510))
	f.counted(8, 2)
	if !f.decide(at(600), target) {
		t.Fatal("a quarter dropped: want standing")
	}
	// Too few fetched to judge by drops.
	f.standing.Store(false)
	f.started(at(700).UnixNano(), at(610))
	f.counted(4, 4)
	if f.decide(at(700), target) {
		t.Fatal("4 of 4 dropped entered the state: below freshMinFetched")
	}
	// A slow handler's target stretches the interval to two targets.
	f.started(fresh, at(705))
	if f.decide(at(800), 80*time.Millisecond) {
		t.Fatal("decided before two targets (160 ms) had passed")
	}
	if !f.decide(at(860), 80*time.Millisecond) {
		t.Fatal("every start late after two targets: want standing")
	}
}

// freshBy: within the target plus the run of the birth, and within
// freshShare of the time to the deadline, whichever is first.
func TestFreshBy(t *testing.T) {
	born := time.Unix(1000, 0)
	if by := freshBy(born.UnixNano(), born.Add(5*time.Second), 100*time.Millisecond, 20*time.Millisecond); !by.Equal(born.Add(120 * time.Millisecond)) {
		t.Errorf("long deadline: %v after birth, want 120ms", by.Sub(born))
	}
	if by := freshBy(born.UnixNano(), born.Add(100*time.Millisecond), 100*time.Millisecond, 20*time.Millisecond); !by.Equal(born.Add(60 * time.Millisecond)) {
		t.Errorf("short deadline: %v after birth, want 60ms", by.Sub(born))
	}
	if by := freshBy(born.UnixNano(), born.Add(time.Minute), 0, 20*time.Millisecond); !by.Equal(born.Add(36 * time.Second)) {
		t.Errorf("no fixed target: %v after birth, want 36s (60%% of its time)", by.Sub(born))
	}
	m := &Message{PublishedAt: born.Add(time.Second)}
	if b := birth(m, born); b != born.UnixNano() {
		t.Errorf("a publish time after now: birth %v, want now", time.Unix(0, b))
	}
	m.PublishedAt = born.Add(-time.Second)
	if b := birth(m, born); b != m.PublishedAt.UnixNano() {
		t.Error("birth is not the publish time")
	}
}
