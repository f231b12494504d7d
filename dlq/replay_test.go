package dlq

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/expiry"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

// all allows every destination CheckDestination does not refuse.
var all = []string{">"}

// TestPacerHoldsRateOnGrid: with injected time, batches sit on the rate's
// grid plus a jitter below one interval, so n batches span n intervals.
func TestPacerHoldsRateOnGrid(t *testing.T) {
	const perSecond, batch = 1000.0, 50
	interval := time.Duration(batch / perSecond * float64(time.Second))
	p := newPacer(perSecond, batch, interval, rand.New(rand.NewPCG(1, 2)), t0)
	now := t0
	var ats []time.Time
	for range 200 {
		at := p.next(now, batch)
		ats = append(ats, at)
		now = at.Add(time.Millisecond) // the batch takes 1 ms to publish
	}
	for k, at := range ats {
		slot := t0.Add(time.Duration(k) * interval)
		if at.Before(slot) || !at.Before(slot.Add(interval+time.Millisecond)) {
			t.Fatalf("batch %d at %v, want in [slot, slot+interval) with slot %v", k, at.Sub(t0), slot.Sub(t0))
		}
	}
	// 200 batches of 50 = 10k letters over 10 s: rate within 0.5%.
	span := ats[len(ats)-1].Sub(ats[0])
	got := float64((len(ats)-1)*batch) / span.Seconds()
	if math.Abs(got-perSecond)/perSecond > 0.005 {
		t.Fatalf("paced rate %.1f/s, want %.0f", got, perSecond)
	}
}

// TestPacerJitterSpreadsBatches: 8 pacers started at the same instant put
// their second batches (the first slot ahead) at distinct, spread-out times
// within one interval after the slot; without jitter they coincide.
func TestPacerJitterSpreadsBatches(t *testing.T) {
	const interval = 100 * time.Millisecond
	seconds := func(jitter time.Duration) []time.Duration {
		var out []time.Duration
		for i := range 8 {
			p := newPacer(100, 10, jitter, rand.New(rand.NewPCG(uint64(i), 7)), t0)
			if first := p.next(t0, 10); !first.Equal(t0) {
				t.Fatalf("first batch at %v, want at once", first.Sub(t0))
			}
			out = append(out, p.next(t0.Add(time.Millisecond), 10).Sub(t0))
		}
		slices.Sort(out)
		return out
	}
	with := seconds(interval)
	if with[0] < interval || with[7] >= 2*interval || with[7]-with[0] < interval/2 {
		t.Fatalf("jittered second batches %v: want spread over [%v, %v)", with, interval, 2*interval)
	}
	if without := seconds(-1); without[0] != interval || without[7] != interval {
		t.Fatalf("unjittered second batches %v, want all at %v", without, interval)
	}
}

// TestPacerBehindSkipsJitter: a batch that is due already goes at once;
// jitter is only added to a slot ahead.
func TestPacerBehindSkipsJitter(t *testing.T) {
	p := newPacer(100, 10, 100*time.Millisecond, rand.New(rand.NewPCG(3, 3)), t0)
	p.next(t0, 10)
	late := t0.Add(250 * time.Millisecond) // the slot was at 100 ms
	if at := p.next(late, 10); !at.Equal(late) {
		t.Fatalf("late batch at %v, want at once (%v)", at.Sub(t0), late.Sub(t0))
	}
}

// TestPacerRecoversFromSlowBatch: a batch that takes longer than one
// interval does not lower the long-run rate (the bucket holds two batches).
func TestPacerRecoversFromSlowBatch(t *testing.T) {
	p := newPacer(100, 10, -1, rand.New(rand.NewPCG(1, 1)), t0) // 100 ms interval
	now := t0
	for k := range 20 {
		at := p.next(now, 10)
		now = at.Add(time.Millisecond)
		if k == 5 {
			now = at.Add(180 * time.Millisecond) // one slow publish
		}
	}
	// 20 batches: slots 0..1900 ms; the slow one is caught up.
	if got := p.next(now, 10).Sub(t0); got != 2*time.Second {
		t.Fatalf("21st batch at %v, want 2s", got)
	}
}

func TestPacerUnpaced(t *testing.T) {
	p := newPacer(math.Inf(1), 100, 0, rand.New(rand.NewPCG(1, 1)), t0)
	if at := p.next(t0.Add(time.Second), 100); !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("unpaced batch at %v", at)
	}
}

func TestNewReplayerDefaultsAndRejects(t *testing.T) {
	r, err := NewReplayer(ReplayOptions{Allow: all, Rate: 1000})
	if err != nil {
		t.Fatal(err)
	}
	if r.Batch() != 5 || r.Jitter() != 5*time.Millisecond {
		t.Fatalf("1000/s: batch %d jitter %v, want 5 and 5ms", r.Batch(), r.Jitter())
	}
	r, _ = NewReplayer(ReplayOptions{Allow: all, Rate: 10})
	if r.Batch() != 1 || r.Jitter() != 100*time.Millisecond {
		t.Fatalf("10/s: batch %d jitter %v", r.Batch(), r.Jitter())
	}
	for _, o := range []ReplayOptions{{Rate: -1}, {Rate: math.NaN()}, {Burst: -1}, {Concurrency: -2}, {Max: -1}, {Attempts: -1}} {
		if _, err := NewReplayer(o); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%+v: %v", o, err)
		}
	}
}

// memQueue is an in-memory Source: letters are removed only through
// Pending.Remove.
type memQueue struct {
	mu        sync.Mutex
	letters   map[int]*Letter
	order     []int
	next      int
	bad       map[int]bool
	removeErr error
}

func newMemQueue(ls ...*Letter) *memQueue {
	q := &memQueue{letters: map[int]*Letter{}, bad: map[int]bool{}}
	for i, l := range ls {
		q.letters[i] = l
		q.order = append(q.order, i)
	}
	return q
}

func (q *memQueue) Fetch(ctx context.Context, n int) ([]*Pending, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.next >= len(q.order) {
		return nil, ErrDrained
	}
	var out []*Pending
	for ; q.next < len(q.order) && len(out) < n; q.next++ {
		id := q.order[q.next]
		p := &Pending{Letter: q.letters[id], Pos: "q#" + strconv.Itoa(id)}
		if q.bad[id] {
			p.Letter, p.Err = nil, ErrMalformed
		}
		p.Remove = func(context.Context) error {
			q.mu.Lock()
			defer q.mu.Unlock()
			if q.removeErr != nil {
				return q.removeErr
			}
			delete(q.letters, id)
			return nil
		}
		out = append(out, p)
	}
	return out, nil
}

func (q *memQueue) left() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.letters)
}

type memTarget struct {
	mu   sync.Mutex
	got  []*Outgoing
	fail func(*Outgoing) error
}

func (m *memTarget) Publish(ctx context.Context, o *Outgoing) error {
	if m.fail != nil {
		if err := m.fail(o); err != nil {
			return err
		}
	}
	m.mu.Lock()
	m.got = append(m.got, o)
	m.mu.Unlock()
	return nil
}

func letters(n int, edit func(i int, l *Letter)) []*Letter {
	var out []*Letter
	for i := range n {
		l := &Letter{Value: []byte(strconv.Itoa(i)), Class: ClassPermanent, LastFailure: t0.Add(time.Duration(i) * time.Minute),
			Headers: map[string][]string{"App": {"a"}, expiry.DefaultHeader: {"1"}},
			Origin:  Origin{Topic: "orders.new", Stream: "ORDERS", Partition: -1}}
		if edit != nil {
			edit(i, l)
		}
		out = append(out, l)
	}
	return out
}

func TestReplayDecidesEveryLetter(t *testing.T) {
	q := newMemQueue(letters(10, func(i int, l *Letter) {
		switch i {
		case 1:
			l.Class = ClassExhausted // filtered out
		case 2:
			l.Replays = 3 // over the guard, parked
		case 3:
			l.Replays = 5 // over the guard, parked
		}
	})...)
	q.bad[4] = true
	var parked []*Letter
	var mu sync.Mutex
	park := SinkFunc(func(ctx context.Context, l *Letter) error {
		mu.Lock()
		parked = append(parked, l)
		mu.Unlock()
		return nil
	})
	dst := &memTarget{}
	var actions sync.Map
	r, err := NewReplayer(ReplayOptions{Allow: all, Rate: math.Inf(1), Filter: Filter{Classes: []string{ClassPermanent}}, Park: park,
		OnLetter: func(d Decision) { actions.Store(d.Pending.Pos, d.Action) }})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Run(context.Background(), q, dst)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Replayed != 6 || rep.Parked != 2 || rep.Skipped != 1 || rep.Malformed != 1 || !rep.Done {
		t.Fatalf("report %+v", rep)
	}
	if q.left() != 2 || len(dst.got) != 6 || len(parked) != 2 {
		t.Fatalf("left %d, replayed %d, parked %d", q.left(), len(dst.got), len(parked))
	}
	for pos, want := range map[string]Action{"q#0": ActionReplay, "q#1": ActionSkip, "q#2": ActionPark, "q#4": ActionMalformed} {
		if a, _ := actions.Load(pos); a != want {
			t.Errorf("%s: %v, want %v", pos, a, want)
		}
	}
}

func TestReplayWithoutParkHolds(t *testing.T) {
	q := newMemQueue(letters(3, func(i int, l *Letter) { l.Replays = i })...)
	r, _ := NewReplayer(ReplayOptions{Allow: all, Rate: math.Inf(1), MaxReplays: 2})
	rep, err := r.Run(context.Background(), q, &memTarget{})
	if err != nil || rep.Replayed != 2 || rep.Held != 1 || q.left() != 1 {
		t.Fatalf("%+v %v left %d", rep, err, q.left())
	}
}

// In fake time: paced at Rate 1, the five letters would take 4 s of it;
// unpaced, none. (A wall-clock bound of 1 s judged the machine's load.)
func TestReplayDryRunMovesNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := newMemQueue(letters(5, nil)...)
		dst := &memTarget{}
		var seen []string
		var mu sync.Mutex
		r, _ := NewReplayer(ReplayOptions{Allow: all, DryRun: true, Rate: 1, OnLetter: func(d Decision) {
			mu.Lock()
			seen = append(seen, d.Action.String()+" "+d.Pending.Pos+" "+d.Destination)
			mu.Unlock()
		}})
		start := time.Now()
		rep, err := r.Run(context.Background(), q, dst)
		if err != nil || rep.Replayed != 5 || q.left() != 5 || len(dst.got) != 0 || len(seen) != 5 {
			t.Fatalf("%+v %v left %d published %d seen %v", rep, err, q.left(), len(dst.got), seen)
		}
		if d := time.Since(start); d != 0 {
			t.Fatalf("dry run was paced: %v", d)
		}
		if seen[0] != "replay q#0 orders.new" {
			t.Fatalf("seen %v", seen)
		}
	})
}

func TestReplayMax(t *testing.T) {
	q := newMemQueue(letters(50, nil)...)
	r, _ := NewReplayer(ReplayOptions{Allow: all, Rate: math.Inf(1), Burst: 7, Max: 12})
	rep, err := r.Run(context.Background(), q, &memTarget{})
	if err != nil || rep.Replayed != 12 || q.left() != 38 {
		t.Fatalf("%+v %v left %d", rep, err, q.left())
	}
}

func TestReplayFilterByTimeAndOrigin(t *testing.T) {
	q := newMemQueue(letters(10, func(i int, l *Letter) {
		if i%2 == 1 {
			l.Origin.Topic, l.Origin.Stream = "reports.daily", "REPORTS"
		}
	})...)
	f, err := ParseFilter("origin=ORDERS since=2026-12-02T12:02:00Z until=2026-12-02T12:08:00Z", t0)
	if err != nil {
		t.Fatal(err)
	}
	dst := &memTarget{}
	r, _ := NewReplayer(ReplayOptions{Allow: all, Rate: math.Inf(1), Filter: f})
	rep, err := r.Run(context.Background(), q, dst)
	if err != nil {
		t.Fatal(err)
	}
	var vals []string
	for _, o := range dst.got {
		vals = append(vals, string(o.Value))
	}
	slices.Sort(vals)
	if !slices.Equal(vals, []string{"2", "4", "6"}) || rep.Skipped != 7 {
		t.Fatalf("replayed %v, report %+v", vals, rep)
	}
}

func TestReplayPublishFailureKeepsLetter(t *testing.T) {
	q := newMemQueue(letters(20, nil)...)
	tries := 0
	var mu sync.Mutex
	dst := &memTarget{fail: func(o *Outgoing) error {
		if string(o.Value) == "3" {
			mu.Lock()
			tries++
			mu.Unlock()
			return errors.New("refused")
		}
		return nil
	}}
	r, _ := NewReplayer(ReplayOptions{Allow: all, Rate: math.Inf(1), Burst: 5, Concurrency: 1, Attempts: 2})
	rep, err := r.Run(context.Background(), q, dst)
	if !errors.Is(err, ErrPublish) {
		t.Fatalf("err %v", err)
	}
	q.mu.Lock()
	_, kept := q.letters[3]
	q.mu.Unlock()
	if !kept || tries != 2 || rep.Replayed != 3 || q.left() != 17 {
		t.Fatalf("kept %v tries %d report %+v left %d", kept, tries, rep, q.left())
	}
}

func TestReplayRemoveFailureReported(t *testing.T) {
	q := newMemQueue(letters(3, nil)...)
	q.removeErr = errors.New("dlq broker down")
	r, _ := NewReplayer(ReplayOptions{Allow: all, Rate: math.Inf(1)})
	rep, err := r.Run(context.Background(), q, &memTarget{})
	if !errors.Is(err, ErrRemove) || rep.Unremoved < 1 || rep.Replayed != 0 || q.left() != 3 {
		t.Fatalf("%+v %v", rep, err)
	}
}

func TestReplayCancelled(t *testing.T) {
	q := newMemQueue(letters(100, nil)...)
	ctx, cancel := context.WithCancel(context.Background())
	dst := &memTarget{fail: func(o *Outgoing) error {
		if string(o.Value) == "10" {
			cancel()
		}
		return nil
	}}
	r, _ := NewReplayer(ReplayOptions{Allow: all, Rate: math.Inf(1), Burst: 5, Concurrency: 1})
	rep, err := r.Run(ctx, q, dst)
	if !errors.Is(err, context.Canceled) || q.left()+rep.Replayed != 100 || rep.Replayed < 10 {
		t.Fatalf("%+v %v left %d", rep, err, q.left())
	}
}

func TestOutgoingHeaders(t *testing.T) {
	l := letters(1, func(i int, l *Letter) { l.Replays = 2; l.Headers[HeaderClass] = []string{"stale"} })[0]
	p := &Pending{Letter: l, Pos: "q#0"}
	now := t0
	for _, tc := range []struct {
		deadline time.Duration
		want     string
	}{{time.Minute, expiry.FormatDeadline(now.Add(time.Minute))}, {0, ""}, {-1, "1"}} {
		r, _ := NewReplayer(ReplayOptions{Allow: all, Deadline: tc.deadline})
		o := r.Outgoing(p, now)
		if got := first(o.Headers[expiry.DefaultHeader]); got != tc.want {
			t.Errorf("Deadline %v: header %q, want %q", tc.deadline, got, tc.want)
		}
		if first(o.Headers[HeaderReplayCount]) != "3" || first(o.Headers["App"]) != "a" || o.Headers[HeaderClass] != nil || o.Topic != "orders.new" {
			t.Errorf("outgoing %+v", o)
		}
	}
	if first(l.Headers[expiry.DefaultHeader]) != "1" {
		t.Fatal("Outgoing modified the letter's headers")
	}
	r, _ := NewReplayer(ReplayOptions{Allow: all, Topic: "elsewhere"})
	if r.Outgoing(p, now).Topic != "elsewhere" {
		t.Fatal("Topic override")
	}
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// TestReplayCountCarriedAcrossDeaths: a replayed message that dies again is
// written by a consumer that knows nothing of replays; its Replays still
// grows, so the loop guard holds.
func TestReplayCountCarriedAcrossDeaths(t *testing.T) {
	l := letters(1, nil)[0]
	r, _ := NewReplayer(ReplayOptions{Allow: all})
	for want := 1; want <= 3; want++ {
		o := r.Outgoing(&Pending{Letter: l}, t0)
		// The consumer dead-letters the republished message again.
		again := &Letter{Value: o.Value, Headers: o.Headers, Class: ClassPermanent, Err: "again"}
		back, err := Decode(nil, again.Value, again.EnvelopeHeaders())
		if err != nil {
			t.Fatal(err)
		}
		if back.Replays != want {
			t.Fatalf("after %d replays Decode says %d", want, back.Replays)
		}
		l = back
	}
}

func TestProgressString(t *testing.T) {
	p := Progress{Replayed: 1200, Parked: 3, Skipped: 2, Elapsed: 1200 * time.Millisecond, Rate: 1002.5, Remaining: 8800, ETA: 8800 * time.Millisecond}
	want := "replayed 1200, parked 3, left 2 (held 0, skipped 2, malformed 0) in 1.2s (1002.5/s), 8800 to go, ETA 9s"
	if got := p.String(); got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}

func TestReplayProgressReportsETA(t *testing.T) {
	q := &sizedQueue{memQueue: newMemQueue(letters(40, nil)...)}
	var last Progress
	var calls int
	r, _ := NewReplayer(ReplayOptions{Allow: all, Rate: 2000, Progress: func(p Progress) { last = p; calls++ }})
	if _, err := r.Run(context.Background(), q, &memTarget{}); err != nil {
		t.Fatal(err)
	}
	if calls < 2 || !last.Done || last.Replayed != 40 || last.Remaining != 0 {
		t.Fatalf("%d calls, last %+v", calls, last)
	}
}

type sizedQueue struct{ *memQueue }

func (s *sizedQueue) Remaining() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.order) - s.next
}

// flakyBatch is a BatchTarget that refuses letters named in down (a
// transient error) and records every confirmed publish.
type flakyBatch struct {
	mu   sync.Mutex
	down map[string]bool
	got  map[string]int
}

func (f *flakyBatch) Publish(ctx context.Context, o *Outgoing) error {
	return f.PublishBatch(ctx, []*Outgoing{o})[0]
}

func (f *flakyBatch) PublishBatch(ctx context.Context, ms []*Outgoing) []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	errs := make([]error, len(ms))
	for i, m := range ms {
		if f.down[string(m.Value)] {
			errs[i] = errors.New("broker: not enough replicas")
			continue
		}
		f.got[string(m.Value)]++
	}
	return errs
}

// TestReplayBatchBookkeeping (issue 12.6): one letter of a BatchTarget
// batch fails; the run stops, but the republishes the target confirmed in
// that batch are removed and counted, so the resumed replay publishes
// each letter exactly once.
func TestReplayBatchBookkeeping(t *testing.T) {
	q := newMemQueue(letters(5, func(i int, l *Letter) {
		if i == 1 {
			l.Replays = 5 // a park in the middle of the batch
		}
	})...)
	dst := &flakyBatch{down: map[string]bool{"0": true}, got: map[string]int{}}
	park := &parkRecorder{}
	r, _ := NewReplayer(ReplayOptions{Allow: all, Rate: math.Inf(1), Burst: 5, Concurrency: 1, Attempts: 2, Park: park})
	rep, err := r.Run(context.Background(), q, dst)
	if !errors.Is(err, ErrPublish) {
		t.Fatalf("first run: %v", err)
	}
	if rep.Replayed != 3 || q.left() != 5-3-rep.Parked {
		t.Fatalf("first run: %+v, %d left: the confirmed republishes were not removed and counted", rep, q.left())
	}
	// Resume with the target healthy: a fresh pass over what is left.
	dst.down = nil
	q.next = 0
	q.order = slices.DeleteFunc(q.order, func(id int) bool { _, ok := q.letters[id]; return !ok })
	rep2, err := r.Run(context.Background(), q, dst)
	if err != nil || q.left() != 0 {
		t.Fatalf("resume: %+v %v, %d left", rep2, err, q.left())
	}
	for _, v := range []string{"0", "2", "3", "4"} {
		if dst.got[v] != 1 {
			t.Errorf("letter %s published %d times, want once", v, dst.got[v])
		}
	}
	if len(park.parked) != 1 {
		t.Errorf("parked %d times", len(park.parked))
	}
}

func TestParseReplayCount(t *testing.T) {
	for s, want := range map[string]int{"3": 3, " 4 ": 4, "-5": 0, "x": 0, "": 0, "9223372036854775807": MaxReplayCount, "99999999999999999999": 0} {
		if got := ParseReplayCount(s); got != want {
			t.Errorf("ParseReplayCount(%q) = %d, want %d", s, got, want)
		}
	}
	// A negative or huge count cannot defeat the loop guard through the
	// letter path either.
	for _, v := range []string{"-100", "9223372036854775807"} {
		l := &Letter{Class: ClassPermanent, Headers: map[string][]string{HeaderReplayCount: {v}}}
		back, err := Decode(nil, nil, l.EnvelopeHeaders())
		if err != nil || back.Replays < 0 || back.Replays > MaxReplayCount {
			t.Fatalf("%s: %+v %v", v, back, err)
		}
		r, _ := NewReplayer(ReplayOptions{Allow: all})
		if n := ParseReplayCount(first(r.Outgoing(&Pending{Letter: back}, t0).Headers[HeaderReplayCount])); n < back.Replays || n < 1 {
			t.Fatalf("%s: next replay count %d after %d", v, n, back.Replays)
		}
	}
}
