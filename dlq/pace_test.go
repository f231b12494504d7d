package dlq

import (
	"context"
	"math"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// stampTarget records when each republish completed, after a simulated
// broker round trip; every stallEvery-th publish takes stall instead (a GC
// pause, a slow broker).
type stampTarget struct {
	latency, stall time.Duration
	stallEvery     int

	mu sync.Mutex
	n  int
	at []time.Time
}

func (s *stampTarget) Publish(ctx context.Context, o *Outgoing) error {
	s.mu.Lock()
	s.n++
	d := s.latency
	if s.stallEvery > 0 && s.n%s.stallEvery == 0 {
		d = s.stall
	}
	s.mu.Unlock()
	time.Sleep(d)
	s.mu.Lock()
	s.at = append(s.at, time.Now())
	s.mu.Unlock()
	return nil
}

// windows counts stamps per full window from the first one.
func windows(at []time.Time, width time.Duration) []int {
	at = slices.SortedFunc(slices.Values(at), func(a, b time.Time) int { return a.Compare(b) })
	n := int(at[len(at)-1].Sub(at[0]) / width)
	counts := make([]int, n)
	for _, t := range at {
		if k := int(t.Sub(at[0]) / width); k < n {
			counts[k]++
		}
	}
	return counts
}

func meanOf(c []int) float64 {
	s := 0
	for _, v := range c {
		s += v
	}
	return float64(s) / float64(len(c))
}

// TestReplayPaceHoldsPerWindow is the pacing claim, on virtual time
// (testing/synctest) so that machine load cannot bend it: one replayer at
// 1,000 letters/s into a target with 2 ms latency and a 150 ms stall every
// 4,000 publishes stays within ±5% of 10,000 in every 10 s window, and its
// busiest 100 ms bucket is at most 2× the mean.
func TestReplayPaceHoldsPerWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, perSecond = 40000, 1000
		q := newMemQueue(letters(n, nil)...)
		dst := &stampTarget{latency: 2 * time.Millisecond, stall: 150 * time.Millisecond, stallEvery: 4000}
		r, err := NewReplayer(ReplayOptions{Allow: all, Rate: perSecond})
		if err != nil {
			t.Fatal(err)
		}
		rep, err := r.Run(context.Background(), q, dst)
		if err != nil || rep.Replayed != n || q.left() != 0 {
			t.Fatalf("%+v %v, %d left", rep, err, q.left())
		}
		win := windows(dst.at, 10*time.Second)
		for k, c := range win {
			if dev := math.Abs(float64(c)-10000) / 10000; dev > 0.05 {
				t.Errorf("10 s window %d: %d letters, want 10000 ±5%%", k, c)
			}
		}
		fine := windows(dst.at, 100*time.Millisecond)
		peak := float64(slices.Max(fine)) / meanOf(fine)
		if peak > 2 {
			t.Errorf("busiest 100 ms bucket %d = %.2f× the mean", slices.Max(fine), peak)
		}
		t.Logf("10 s windows %v, busiest 100 ms bucket %.2f× the mean, batch %d", win, peak, r.Batch())
	})
}

// TestReplayersTogetherSpread: 8 replayers started at the same instant at
// 250/s each into one target: the busiest 100 ms bucket of the target is
// at most 2× the mean, on virtual time.
func TestReplayersTogetherSpread(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const replayers, each, perSecond = 8, 2500, 250
		dst := &stampTarget{latency: time.Millisecond}
		var wg sync.WaitGroup
		for i := range replayers {
			q := newMemQueue(letters(each, nil)...)
			r, err := NewReplayer(ReplayOptions{Allow: all, Rate: perSecond})
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				if rep, err := r.Run(context.Background(), q, dst); err != nil || rep.Replayed != each {
					t.Errorf("replayer %d: %+v %v", i, rep, err)
				}
			})
		}
		wg.Wait()
		fine := windows(dst.at, 100*time.Millisecond)
		peak := float64(slices.Max(fine)) / meanOf(fine)
		if peak > 2 {
			t.Errorf("busiest 100 ms bucket %.2f× the mean", peak)
		}
		t.Logf("8 × 250/s: busiest 100 ms bucket %.2f× the mean over %d buckets", peak, len(fine))
	})
}

// TestReplayLatencyDoesNotLowerRate: batches start on their slots without
// waiting for the previous one, so a target with 40 ms round trips still
// gets 1,000/s (8 in flight × 5 letters / 40 ms = 1,000/s would be the
// ceiling for a sequential-per-batch design at Concurrency 8; pipelined
// plain publishes need 40 in flight, so Concurrency 64 is given).
func TestReplayLatencyDoesNotLowerRate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, perSecond = 5000, 1000
		q := newMemQueue(letters(n, nil)...)
		dst := &stampTarget{latency: 40 * time.Millisecond}
		r, _ := NewReplayer(ReplayOptions{Allow: all, Rate: perSecond, Concurrency: 64})
		start := time.Now()
		if _, err := r.Run(context.Background(), q, dst); err != nil {
			t.Fatal(err)
		}
		got := float64(n) / time.Since(start).Seconds()
		if got < 0.95*perSecond {
			t.Fatalf("%.0f letters/s with 40 ms round trips, want ≥ 950", got)
		}
	})
}

// TestReplayBatchedLatency: the same on a BatchTarget with the default
// Concurrency: 8 batches of 5 in flight.
func TestReplayBatchedLatency(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n, perSecond = 5000, 1000
		q := newMemQueue(letters(n, nil)...)
		dst := &batchStamp{stampTarget: stampTarget{latency: 20 * time.Millisecond}}
		r, _ := NewReplayer(ReplayOptions{Allow: all, Rate: perSecond})
		start := time.Now()
		if _, err := r.Run(context.Background(), q, dst); err != nil {
			t.Fatal(err)
		}
		if got := float64(n) / time.Since(start).Seconds(); got < 0.95*perSecond {
			t.Fatalf("%.0f letters/s with 20 ms batch round trips, want ≥ 950", got)
		}
		if dst.calls.Load() > n/r.Batch()+1 {
			t.Fatalf("%d batch calls for %d letters in batches of %d", dst.calls.Load(), n, r.Batch())
		}
	})
}

type batchStamp struct {
	stampTarget
	calls counter
}

type counter struct {
	mu sync.Mutex
	n  int
}

func (c *counter) Add() {
	c.mu.Lock()
	c.n++
	c.mu.Unlock()
}

func (c *counter) Load() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

func (b *batchStamp) PublishBatch(ctx context.Context, ms []*Outgoing) []error {
	b.calls.Add()
	time.Sleep(b.latency)
	b.mu.Lock()
	for range ms {
		b.at = append(b.at, time.Now())
	}
	b.mu.Unlock()
	return nil
}
