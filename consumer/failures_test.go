package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/sluicetest"
)

// Item 6 (issue 24): a route remembers a message's failures across its
// redeliveries (when it first failed; that its letter awaits a write). A
// Source may leave Message.Origin empty (sluicetest.Source.Publish does):
// before, every such message shared one memory, so a message that would
// succeed on its retry was dead-lettered with another message's error and
// never run again.
func TestFailureMemoryWithoutOrigin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.HonorDelay = true
		src.Publish("poison", []byte("p"), nil, time.Time{})
		src.Publish("flaky", []byte("f"), nil, time.Time{})
		var sink sluicetest.Sink
		sink.FailWith(func(l *dlq.Letter) error {
			if string(l.Key) == "poison" {
				return errDown
			}
			return nil
		})
		var mu sync.Mutex
		runs := map[string]int{}
		r := route("r", src, func(_ context.Context, m *consumer.Message) error {
			mu.Lock()
			defer mu.Unlock()
			runs[string(m.Key)]++
			switch {
			case string(m.Key) == "poison":
				return consumer.Permanent(errors.New("cannot decode"))
			case runs["flaky"] == 1:
				return errors.New("try again")
			}
			return nil
		})
		r.Workers = 1
		r.DeadLetter.Sink = &sink
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(time.Second)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		rec := ledgerOf(t, src)["flaky"]
		if runs["flaky"] != 2 || rec.Acks != 1 || rec.Terms != 0 {
			t.Errorf("flaky ran %d times, ledger %+v: want run again and acked", runs["flaky"], rec)
		}
		for _, l := range sink.Letters() {
			if string(l.Key) == "flaky" {
				t.Errorf("flaky dead-lettered: %s", l.Err)
			}
		}
		if runs["poison"] != 1 {
			t.Errorf("poison ran %d times: its redeliveries must only be written again", runs["poison"])
		}
	})
}

// Item 6 (issue 24): the memory is bounded, but by forgetting the oldest
// first failures, never a letter still awaited. Before, the whole map was
// cleared at 4 × window + 1,024 entries, and a message awaiting its letter
// ran again on its next redelivery.
func TestFailureMemoryKeepsAwaitedLetters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.HonorDelay = true
		src.PublishMsg(sluicetest.Msg{ID: "poison", Value: []byte("p")})
		const others = 3000
		for i := range others {
			src.PublishMsg(sluicetest.Msg{ID: fmt.Sprintf("m%d", i), Value: []byte("v")})
		}
		var sink sluicetest.Sink
		var repaired atomic.Bool
		sink.FailWith(func(l *dlq.Letter) error {
			if string(l.Key) == "poison" && !repaired.Load() {
				return errDown
			}
			return nil
		})
		var mu sync.Mutex
		runs := map[string]int{}
		r := route("r", src, func(_ context.Context, m *consumer.Message) error {
			mu.Lock()
			defer mu.Unlock()
			runs[string(m.Key)]++
			if string(m.Key) == "poison" {
				return consumer.Permanent(errors.New("cannot decode"))
			}
			if runs[string(m.Key)] == 1 {
				return errors.New("try again") // remembered until it succeeds
			}
			return nil
		})
		r.Workers, r.Window.Messages = 4, 8
		r.Retry = consumer.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Second, MaxDelay: time.Second}
		r.DeadLetter.Sink = &sink
		c, err := consumer.New(consumer.Options{}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		waitFor := func(what string, cond func(consumer.RouteStats) bool) {
			for begin := time.Now(); !cond(c.Stats()[0]); time.Sleep(100 * time.Millisecond) {
				if time.Since(begin) > time.Minute {
					t.Fatalf("%s: not within a minute: %+v", what, c.Stats()[0].Settled)
				}
			}
		}
		waitFor("others succeed", func(s consumer.RouteStats) bool { return s.Settled[consumer.OutcomeSucceeded] >= others })
		repaired.Store(true)
		waitFor("poison dead-lettered", func(s consumer.RouteStats) bool { return s.Settled[consumer.OutcomeDeadLettered] >= 1 })
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if runs["poison"] != 1 {
			t.Errorf("poison ran %d times while %d other failures were remembered: an awaited letter was forgotten", runs["poison"], others)
		}
	})
}
