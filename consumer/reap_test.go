package consumer_test

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

// Item 2 (issue 24): on an ordered route the reaper settles a message
// waiting behind its key's head. Before, it left the message in the key's
// wait list while it settled it (here: while its letter is written), so
// the head's end promoted it and a worker ran it: handled and dead-lettered.
// The route's clock is moved back while the letter is written, so the
// worker's own deadline check passes, as it does when the handler's learned
// latency drops between the reaper's pass and the worker's pick.
func TestOrderReapedMessageNeverRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clock := &fakeClock{now: time.Now()}
		src := sluicetest.NewSource()
		soon := expiry.FormatDeadline(clock.Now().Add(time.Second))
		src.PublishMsg(sluicetest.Msg{ID: "0", Key: []byte("k"), Value: []byte("0")})
		src.PublishMsg(sluicetest.Msg{ID: "1", Key: []byte("k"), Value: []byte("1"), Headers: consumer.Headers{expiry.DefaultHeader: {soon}}})
		gate := make(chan struct{})
		writing, written := make(chan struct{}), make(chan struct{})
		var mu sync.Mutex
		var ran []string
		c, err := consumer.New(consumer.Options{Clock: clock}, consumer.Route{
			Name: "reap", Source: src, Workers: 2, Ordering: consumer.ByKey,
			Window: consumer.WindowPolicy{Messages: 8},
			Handler: func(_ context.Context, m *consumer.Message) error {
				mu.Lock()
				ran = append(ran, string(m.Value))
				mu.Unlock()
				if string(m.Value) == "0" {
					<-gate
				}
				return nil
			},
			DeadLetter: consumer.DeadLetterPolicy{OnExpired: consumer.ExpiredDeadLetter,
				Sink: dlq.SinkFunc(func(context.Context, *dlq.Letter) error {
					close(writing)
					<-written
					return nil
				})},
		})
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		synctest.Wait() // "0" runs, "1" waits behind it
		clock.Advance(2 * time.Second)
		<-writing // the reaper took "1" and writes its letter
		clock.Advance(-2 * time.Second)
		close(gate) // "0" ends: its key's next message may go
		synctest.Wait()
		close(written)
		synctest.Wait()
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(ran) != 1 || ran[0] != "0" {
			t.Errorf("handler ran %v: the reaped message must never run", ran)
		}
		rec := ledgerOf(t, src)["1"]
		if rec.Terms != 1 || rec.Acks+rec.Naks != 0 {
			t.Errorf("1: %+v: want terminated after its letter", rec)
		}
		if s := c.Stats()[0]; s.Settled[consumer.OutcomeExpired] != 1 || s.Settled[consumer.OutcomeSucceeded] != 1 {
			t.Errorf("settled %v", s.Settled)
		}
	})
}
