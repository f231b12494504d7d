package drain

import (
	"context"
	"errors"
	"math"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/sluicetest"
)

var t0 = time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)

func msgs(n int, published time.Time) []*consumer.Message {
	out := make([]*consumer.Message, n)
	for i := range out {
		out[i] = &consumer.Message{PublishedAt: published}
	}
	return out
}

func newAt(t *testing.T, opts Options, now time.Time) *Source {
	t.Helper()
	s, err := New(sluicetest.NewSource(), opts)
	if err != nil {
		t.Fatal(err)
	}
	s.lim = newLimiter(opts.Rate, s.batch, now)
	return s
}

// TestScheduleHoldsRate: with injected time, 100 batches of 10 at 500/s
// are spaced 20 ms apart (plus jitter below one interval).
func TestScheduleHoldsRate(t *testing.T) {
	s := newAt(t, Options{Rate: 500}, t0)
	if s.batch != 10 || s.jit != 20*time.Millisecond {
		t.Fatalf("batch %d jitter %v", s.batch, s.jit)
	}
	now := t0
	var last time.Time
	for k := range 100 {
		at, ok := s.schedule(now, msgs(10, t0.Add(-time.Hour)))
		if !ok {
			t.Fatal("drain ended on old messages")
		}
		slot := t0.Add(time.Duration(k) * 20 * time.Millisecond)
		if at.Before(slot) || !at.Before(slot.Add(20*time.Millisecond)) {
			t.Fatalf("batch %d at %v, slot %v", k, at.Sub(t0), slot.Sub(t0))
		}
		now, last = at, at
	}
	if rate := 990 / last.Sub(t0).Seconds(); math.Abs(rate-500)/500 > 0.03 {
		t.Fatalf("rate %.1f/s", rate)
	}
}

func TestScheduleEndsWhenCaughtUp(t *testing.T) {
	s := newAt(t, Options{Rate: 100, CaughtUp: time.Second}, t0)
	if _, ok := s.schedule(t0, msgs(1, t0.Add(-time.Minute))); !ok || !s.Draining() {
		t.Fatal("old message ended the drain")
	}
	if _, ok := s.schedule(t0, msgs(1, t0.Add(-500*time.Millisecond))); ok || s.Draining() {
		t.Fatal("fresh batch did not end the drain")
	}
	s.SetRate(50)
	if !s.Draining() {
		t.Fatal("SetRate did not restart the drain")
	}
}

func TestNewRejects(t *testing.T) {
	for _, o := range []Options{{}, {Rate: -1}, {Rate: math.NaN()}, {Rate: 1, Burst: -1}, {Rate: 1, CaughtUp: -1}} {
		if _, err := New(sluicetest.NewSource(), o); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%+v: %v", o, err)
		}
	}
	if _, err := New(nil, Options{Rate: 1}); !errors.Is(err, ErrInvalidOption) {
		t.Error("nil source accepted")
	}
}

// TestFetchPacesRealSource drains 60 messages at 200/s through Fetch: it
// takes about 0.3 s, never more than a batch per fetch, and loses nothing.
func TestFetchPacesRealSource(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		for i := range 60 {
			src.Publish(strconv.Itoa(i), []byte("x"), nil, time.Now().Add(-time.Hour))
		}
		d, err := New(src, Options{Rate: 200, Jitter: -1})
		if err != nil {
			t.Fatal(err)
		}
		ctx := context.Background()
		start := time.Now()
		got := 0
		for got < 60 {
			ms, err := d.Fetch(ctx, 100, 1<<20)
			if err != nil {
				t.Fatal(err)
			}
			if len(ms) > 4 {
				t.Fatalf("fetch returned %d, batch is 4", len(ms))
			}
			for _, m := range ms {
				if err := sluicetest.Settle(ctx, m, consumer.Settlement{Op: consumer.SettleAck}); err != nil {
					t.Fatal(err)
				}
			}
			got += len(ms)
		}
		// 15 batches, the first at once: 14 intervals of 20 ms (fake time:
		// exact, whatever the machine's load).
		if el := time.Since(start); el < 270*time.Millisecond || el > 290*time.Millisecond {
			t.Fatalf("60 messages at 200/s took %v", el)
		}
	})
}

// TestFetchCancelledReturnsBatch: a cancelled wait hands the fetched batch
// over instead of dropping it.
func TestFetchCancelledReturnsBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		for i := range 3 {
			src.Publish(strconv.Itoa(i), []byte("x"), nil, time.Time{})
		}
		d, _ := New(src, Options{Rate: 1, Burst: 1, Jitter: -1})
		ctx, cancel := context.WithCancel(context.Background())
		if ms, err := d.Fetch(ctx, 10, 1<<20); err != nil || len(ms) != 1 {
			t.Fatalf("first: %d %v", len(ms), err)
		}
		go func() { time.Sleep(50 * time.Millisecond); cancel() }() // fake time
		start := time.Now()
		ms, err := d.Fetch(ctx, 10, 1<<20)
		if err != nil || len(ms) != 1 || time.Since(start) != 50*time.Millisecond {
			t.Fatalf("cancelled wait: %d %v after %v", len(ms), err, time.Since(start))
		}
	})
}

// readyInner reports a fixed readiness through SourceInfo.Ready.
type readyInner struct{ *sluicetest.Source }

var errNotBound = errors.New("consumer not bound")

func (s readyInner) Attach(l consumer.RouteLimits) (consumer.SourceInfo, error) {
	info, err := s.Source.Attach(l)
	info.Ready = func() error { return errNotBound }
	return info, err
}

// A drain forwards the wrapped Source's SourceInfo whole, so a route on a
// drain reports its broker's readiness (Consumer.Health).
func TestAttachForwardsReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s, err := New(readyInner{sluicetest.NewSource()}, Options{Rate: 10})
		if err != nil {
			t.Fatal(err)
		}
		c, err := consumer.New(consumer.Options{}, consumer.Route{Name: "r", Source: s,
			Handler: func(context.Context, *consumer.Message) error { return nil }})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		synctest.Wait()
		rh := c.Health().Routes[0]
		cancel()
		<-done
		if rh.State != consumer.StateNotReady || rh.Reason != "source not ready: consumer not bound" {
			t.Fatalf("health %+v", rh)
		}
	})
}
