package consumer_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

// One worker is held by message b0 while 20 more arrive into a queue that
// sheds above 5; the drop policy decides which 5 are run, the queue order
// in which order.
func TestQueueDropPolicies(t *testing.T) {
	type want struct {
		ran  []int // ids run after b0, in order; nil: check count only
		keep func(id int) bool
	}
	cases := []struct {
		name  string
		order consumer.QueueOrder
		drop  consumer.DropPolicy
		want  want
	}{
		{"tail-drop", consumer.QueueFIFO, consumer.DropNewest, want{ran: []int{1, 2, 3, 4, 5}}},
		{"head-drop", consumer.QueueFIFO, consumer.DropOldest, want{ran: []int{16, 17, 18, 19, 20}}},
		{"lifo-oldest-drop", consumer.QueueLIFO, consumer.DropOldest, want{ran: []int{20, 19, 18, 17, 16}}},
		{"random", consumer.QueueFIFO, consumer.DropRandom, want{}},
		{"by-criticality", consumer.QueueFIFO, consumer.DropLowestCriticality, want{keep: func(id int) bool { return id%4 == 0 }}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			src := sluicetest.NewSource()
			release, started := make(chan struct{}), make(chan struct{})
			var mu sync.Mutex
			var ran []int
			var classes []backpressure.Criticality
			r := route("q", src, func(ctx context.Context, m *consumer.Message) error {
				if string(m.Key) == "m0" {
					close(started)
					<-release
					return nil
				}
				mu.Lock()
				ran = append(ran, idOf(m))
				c, _ := backpressure.CriticalityFrom(ctx)
				classes = append(classes, c)
				mu.Unlock()
				return nil
			})
			r.Workers, r.Window.Messages, r.Window.MinFetch = 1, 32, 1
			r.Overload.Criticality = backpressure.Critical
			r.Overload.Queue.Order, r.Overload.Queue.DropWhenFull, r.Overload.Queue.MaxLength = tc.order, tc.drop, 5
			r.Overload.OnShed = consumer.ShedAck
			c, err := consumer.New(consumer.Options{}, r)
			if err != nil {
				t.Fatal(err)
			}
			stop := start(t, c)
			src.Publish("m0", []byte("x"), nil, time.Time{})
			// m0 must be running, not only fetched: a head drop would
			// otherwise shed m0 itself from the queue (seen under -race).
			<-started
			for i := 1; i <= 20; i++ {
				var h consumer.Headers
				if i%4 != 0 { // a quarter stays CRITICAL, the rest says SHEDDABLE
					h = consumer.Headers{consumer.CriticalityHeader: {"SHEDDABLE"}}
				}
				src.Publish(fmt.Sprintf("m%d", i), []byte("x"), h, time.Time{})
			}
			// Fetched counts a message before it is queued or shed: wait
			// for the sheds too, or the worker released below races the
			// last admissions (more than MaxLength ran under -race).
			eventually(t, "fetched and shed", func() bool {
				s := c.Stats()[0]
				return s.Fetched == 21 && s.Settled[consumer.OutcomeShed] == 15
			})
			close(release)
			eventually(t, "settled", func() bool { s := c.Stats()[0]; return s.Held == 0 })
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			s := c.Stats()[0]
			mu.Lock()
			defer mu.Unlock()
			if s.Settled[consumer.OutcomeShed] != 15 || len(ran) != 5 {
				t.Fatalf("shed %d, ran %v", s.Settled[consumer.OutcomeShed], ran)
			}
			var byReason uint64
			for _, n := range s.Overload.Shed[consumer.ShedQueueFull] {
				byReason += n
			}
			if byReason != 15 {
				t.Fatalf("Shed[queue_full] %v", s.Overload.Shed[consumer.ShedQueueFull])
			}
			if tc.want.ran != nil && fmt.Sprint(ran) != fmt.Sprint(tc.want.ran) {
				t.Fatalf("ran %v, want %v", ran, tc.want.ran)
			}
			if tc.want.keep != nil {
				for i, id := range ran {
					if !tc.want.keep(id) || classes[i] != backpressure.Critical {
						t.Fatalf("ran %v (classes %v): a sheddable message survived", ran, classes)
					}
				}
				if s.Overload.Shed[consumer.ShedQueueFull][backpressure.Sheddable] != 15 {
					t.Fatalf("shed by class %v", s.Overload.Shed[consumer.ShedQueueFull])
				}
			}
			ledger, errs := src.Ledger()
			if len(errs) > 0 {
				t.Fatal(errs)
			}
			for id, rec := range ledger {
				if rec.Acks != 1 || rec.Naks != 0 {
					t.Fatalf("%s %+v", id, rec)
				}
			}
		})
	}
}

// Shed by the default ShedNak: the broker keeps the message and redelivers
// it, so nothing is lost.
func TestShedNakKeepsMessagesInBroker(t *testing.T) {
	src := sluicetest.NewSource()
	src.HonorDelay = true
	release := make(chan struct{})
	r := route("q", src, func(ctx context.Context, m *consumer.Message) error {
		if string(m.Key) == "m0" {
			<-release
		}
		return nil
	})
	r.Workers, r.Window.Messages, r.Window.MinFetch, r.Overload.Queue.MaxLength, r.Overload.ShedDelay = 1, 32, 1, 2, 20*time.Millisecond
	c, err := consumer.New(consumer.Options{}, r)
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, c)
	src.Publish("m0", []byte("x"), nil, time.Time{})
	eventually(t, "m0 running", func() bool { return c.Stats()[0].Fetched == 1 })
	for i := 1; i <= 10; i++ {
		src.Publish(fmt.Sprintf("m%d", i), []byte("x"), nil, time.Time{})
	}
	eventually(t, "shedding", func() bool { return c.Stats()[0].Settled[consumer.OutcomeShed] >= 8 })
	close(release)
	eventually(t, "all succeeded", func() bool { return c.Stats()[0].Settled[consumer.OutcomeSucceeded] == 11 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	ledger, errs := src.Ledger()
	if len(errs) > 0 {
		t.Fatal(errs)
	}
	naks := 0
	for _, rec := range ledger {
		if rec.Acks != 1 {
			t.Fatalf("%+v", rec)
		}
		naks += rec.Naks
	}
	if uint64(naks) != c.Stats()[0].Settled[consumer.OutcomeShed] {
		t.Fatalf("naks %d, shed %d", naks, c.Stats()[0].Settled[consumer.OutcomeShed])
	}
}

// A message picked with less than ShedNearDeadline left is shed, not run.
// In fake time: "old" has 50 ms left when published, and a descheduled
// test (-race -cpu 1 on a loaded machine) let it expire before the pick,
// so it was counted expired, not shed.
func TestShedNearDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		now := time.Now()
		src.Publish("fresh", []byte("x"), nil, now)
		src.Publish("old", []byte("x"), nil, now.Add(-450*time.Millisecond))
		var ran sync.Map
		r := route("d", src, func(ctx context.Context, m *consumer.Message) error { ran.Store(string(m.Key), true); return nil })
		r.Expiry = expiry.Policy{MaxAge: 500 * time.Millisecond}
		r.Overload.ShedNearDeadline = 200 * time.Millisecond
		r.Overload.OnShed = consumer.ShedAck
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		eventually(t, "settled", func() bool { return settledTotal(c.Stats()[0]) == 2 })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		s := c.Stats()[0]
		if _, ok := ran.Load("old"); ok || s.Overload.Shed[consumer.ShedNearDeadline][backpressure.Sheddable] != 1 {
			t.Fatalf("old ran or not counted: %+v", s.Overload.Shed)
		}
		if _, ok := ran.Load("fresh"); !ok {
			t.Fatal("fresh not run")
		}
	})
}

// The handler ctx carries the message's class (the route's, lowered by the
// producer's header, never raised), and PropagateCriticality copies it to
// outgoing headers.
func TestCriticalityPropagates(t *testing.T) {
	src := sluicetest.NewSource()
	src.Publish("plain", []byte("x"), nil, time.Time{})
	src.Publish("lower", []byte("x"), consumer.Headers{consumer.CriticalityHeader: {"sheddable_plus"}}, time.Time{})
	src.Publish("raise", []byte("x"), consumer.Headers{consumer.CriticalityHeader: {"CRITICAL_PLUS"}}, time.Time{})
	var got sync.Map
	r := route("p", src, func(ctx context.Context, m *consumer.Message) error {
		out := consumer.Headers{}
		if !consumer.PropagateCriticality(ctx, out) {
			return consumer.Permanent(fmt.Errorf("no class on ctx"))
		}
		got.Store(string(m.Key), out.Get(consumer.CriticalityHeader))
		return nil
	})
	r.Overload.Criticality = backpressure.Critical
	c, err := consumer.New(consumer.Options{}, r)
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, c)
	eventually(t, "settled", func() bool { return c.Stats()[0].Settled[consumer.OutcomeSucceeded] == 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	for k, want := range map[string]string{"plain": "CRITICAL", "lower": "SHEDDABLE_PLUS", "raise": "CRITICAL"} {
		if v, _ := got.Load(k); v != want {
			t.Errorf("%s: %v, want %s", k, v, want)
		}
	}
}

// The route's window follows its AdaptiveLimit: a downstream with 4 slots
// of 4 ms (latency grows beyond 4 concurrent), target 7 ms. When the
// service time doubles the limit drops to its minimum; when it recovers the
// limit climbs back.
func TestAdaptiveLimitDrivesWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		al, _ := backpressure.NewAdaptiveLimit(backpressure.AdaptiveLimitOptions{Min: 2, Max: 32, Initial: 2,
			Target: 7 * time.Millisecond, Interval: 100 * time.Millisecond, MinSamples: 5})
		src := sluicetest.NewSource()
		var mu sync.Mutex
		busy, service := 0, 4*time.Millisecond
		r := route("adaptive", src, func(ctx context.Context, m *consumer.Message) error {
			mu.Lock()
			busy++
			d := service * time.Duration(max(4, busy)) / 4
			mu.Unlock()
			time.Sleep(d)
			mu.Lock()
			busy--
			mu.Unlock()
			return nil
		})
		r.Workers, r.Window.Messages, r.Window.MinFetch = 32, 32, 1
		r.Overload.AdaptiveLimit = al
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		for i := range 20000 {
			src.Publish(fmt.Sprintf("m%d", i), []byte("x"), nil, time.Time{})
		}
		var trace []int
		sample := func(d time.Duration) int {
			end := time.Now().Add(d)
			for time.Now().Before(end) {
				time.Sleep(100 * time.Millisecond)
				s := c.Stats()[0]
				if s.Window.Limit < 2 || s.Window.Limit > 32 || !s.Window.Adaptive {
					t.Fatalf("limit %d out of bounds", s.Window.Limit)
				}
				trace = append(trace, s.Window.Limit)
			}
			return trace[len(trace)-1]
		}
		normal := sample(1500 * time.Millisecond)
		mu.Lock()
		service *= 2
		mu.Unlock()
		slow := sample(1500 * time.Millisecond)
		mu.Lock()
		service /= 2
		mu.Unlock()
		back := sample(1500 * time.Millisecond)
		_ = stop()
		t.Logf("adaptive window limit every 100 ms: %v", trace)
		t.Logf("normal %d, service time doubled %d, recovered %d (bounds 2..32)", normal, slow, back)
		if normal < 3 || slow > normal-1 || back < normal-2 {
			t.Fatalf("normal %d slow %d back %d", normal, slow, back)
		}
	})
}

// Near-deadline shedding happens at fetch too: the message does not wait in
// the window for a worker (here the only worker is busy) only to be shed.
// In fake time, for the reason TestShedNearDeadline gives; the shed Nak
// is held its ShedDelay (HonorDelay), or the redelivery loop would spin
// without fake time ever moving.
func TestShedNearDeadlineAtFetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.HonorDelay = true
		now := time.Now()
		src.Publish("busy", []byte("x"), nil, now)
		src.Publish("old", []byte("x"), nil, now.Add(-450*time.Millisecond))
		release := make(chan struct{})
		r := route("d", src, func(ctx context.Context, m *consumer.Message) error {
			if string(m.Key) == "busy" {
				select {
				case <-release:
				case <-ctx.Done():
				}
			}
			return nil
		})
		r.Workers = 1
		r.Expiry = expiry.Policy{MaxAge: 500 * time.Millisecond}
		r.Overload.ShedNearDeadline = 200 * time.Millisecond
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		eventually(t, "old shed while the worker is busy", func() bool {
			return c.Stats()[0].Overload.Shed[consumer.ShedNearDeadline][backpressure.Sheddable] >= 1
		})
		close(release)
		eventually(t, "busy settled", func() bool { return c.Stats()[0].Settled[consumer.OutcomeSucceeded] == 1 })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	})
}
