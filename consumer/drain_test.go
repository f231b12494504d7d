package consumer_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/sluicetest"
)

// N1 (found by TestSimulation): a message waiting on its key is not
// stranded when the key's head settles after Run is done with the route.
// The head's dead letter is kept; the letter retrier's write then ignores
// its ctx, so Run gives up on it (ErrStuckHandlers) and returns. When the
// write comes back, the head is abandoned and its key's next message is
// released with no worker left to run it: it is handed back, so it has an
// outcome, Held is 0 and its window capacity returns. Before the fix it was
// queued for workers that had stopped: no outcome, Held 1 after Run.
func TestKeyReleasedAfterRunIsHandedBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.PublishMsg(sluicetest.Msg{ID: "head", Key: []byte("k"), Value: []byte("v")})
		src.PublishMsg(sluicetest.Msg{ID: "next", Key: []byte("k"), Value: []byte("v")})
		var sink sluicetest.Sink
		unstick := make(chan struct{})
		var writes atomic.Int64
		sink.FailWith(func(*dlq.Letter) error {
			if writes.Add(1) > 1 {
				<-unstick // ignores its ctx
			}
			return errDown
		})
		r := route("r", src, func(context.Context, *consumer.Message) error {
			return consumer.Permanent(errors.New("poison"))
		})
		r.Ordering, r.Workers, r.Retry.MaxAttempts = consumer.ByKey, 1, 1
		r.DeadLetter.Sink = &sink
		const grace = 100 * time.Millisecond
		c, err := consumer.New(consumer.Options{ShutdownGrace: grace}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(time.Second) // the retrier is inside its second write
		synctest.Wait()
		if w := writes.Load(); w != 2 {
			t.Fatalf("%d letter writes, want 2 (the second one hanging)", w)
		}
		err, took := stopWithin(t, stop, grace+consumer.ShutdownSlack+time.Second, func() {})
		if !errors.Is(err, consumer.ErrStuckHandlers) || took > grace+consumer.ShutdownSlack {
			t.Fatalf("Run returned %v after %v, want ErrStuckHandlers within the grace and slack", err, took)
		}
		close(unstick)
		synctest.Wait()
		s := c.Stats()[0]
		if s.Held != 0 || s.Window.InUse != 0 || s.Settled[consumer.OutcomeAbandoned] != 1 || s.Settled[consumer.OutcomeReturned] != 1 {
			t.Errorf("after the stuck write ended: held %d, window in use %d, settled %v; want the head abandoned, the next returned",
				s.Held, s.Window.InUse, s.Settled)
		}
		l := ledgerOf(t, src)
		if rec := l["next"]; rec.Naks != 1 {
			t.Errorf("next: %+v, want handed back (one Nak)", rec)
		}
	})
}
