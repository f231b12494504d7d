package consumer_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
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

// N3 (found by TestSimulation): Run does not wait without limit for a
// reaper whose dead-letter write ignores its ctx, on an Unordered route
// and not a last delivery: it returns within the grace and slack with
// ErrStuckHandlers (a sink ignored its ctx). Before core's bounded waits
// (issue 24 item 1) it waited for the write.
func TestReaperStuckInSinkDoesNotBlockRun(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		soon := expiry.FormatDeadline(time.Now().Add(time.Second))
		src.PublishMsg(sluicetest.Msg{ID: "busy"})
		src.PublishMsg(sluicetest.Msg{ID: "late", Headers: consumer.Headers{expiry.DefaultHeader: {soon}}})
		unstick := make(chan struct{})
		var writes atomic.Int64
		sink := dlq.SinkFunc(func(context.Context, *dlq.Letter) error {
			writes.Add(1)
			<-unstick // ignores its ctx
			return nil
		})
		r := route("r", src, func(ctx context.Context, m *consumer.Message) error {
			<-ctx.Done()
			return ctx.Err()
		})
		r.Workers, r.Window.Messages = 1, 8
		r.DeadLetter = consumer.DeadLetterPolicy{Sink: sink, OnExpired: consumer.ExpiredDeadLetter}
		const grace = time.Second
		c, err := consumer.New(consumer.Options{ShutdownGrace: grace}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(5 * time.Second) // "late" expires in the queue; the reaper's write hangs
		synctest.Wait()
		if writes.Load() != 1 {
			t.Fatalf("%d letter writes, want the reaper's one", writes.Load())
		}
		err, took := stopWithin(t, stop, grace+consumer.ShutdownSlack+time.Second, func() { close(unstick) })
		if !errors.Is(err, consumer.ErrStuckHandlers) || took > grace+consumer.ShutdownSlack {
			t.Errorf("Run returned %v after %v, want ErrStuckHandlers within %v", err, took, grace+consumer.ShutdownSlack)
		}
		select {
		case <-unstick:
		default:
			close(unstick)
		}
		synctest.Wait()
		if s := c.Stats()[0]; s.Held != 0 || settledTotal(s) != s.Fetched {
			t.Errorf("held %d, settled %v of %d", s.Held, s.Settled, s.Fetched)
		}
	})
}

// N4 (found by TestSimulation): after an ordered route's Source closes
// (ErrClosed, no shutdown), a message held back to run again keeps its
// delay: the route's workers wait for it instead of running it again at
// once (before, 50 attempts ran in the same instant; a message shed by
// ShedNak spun a worker until its deadline). Backoff is full jitter, so
// the test sums 49 backoffs of up to a second each: about 24 s, and under
// 5 s with a probability below 1e-20.
func TestHeldBackDelayAfterSourceClosed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.PublishMsg(sluicetest.Msg{ID: "m", Key: []byte("k"), Value: []byte("v")})
		src.Close()
		var runs []time.Time
		r := route("r", src, func(context.Context, *consumer.Message) error {
			runs = append(runs, time.Now())
			return errors.New("retry me")
		})
		r.Ordering, r.Workers = consumer.ByKey, 1
		r.Retry = consumer.RetryPolicy{MaxAttempts: 50, BaseDelay: time.Second, MaxDelay: time.Second}
		// A second route goes on, so the consumer does not stop when the
		// first route's Source closes.
		other := route("other", sluicetest.NewSource(), func(context.Context, *consumer.Message) error { return nil })
		c, err := consumer.New(consumer.Options{}, r, other)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		settled := func() bool { s := c.Stats()[0]; return s.Fetched == 1 && s.Held == 0 }
		for i := 0; i < 1200 && !settled(); i++ {
			time.Sleep(100 * time.Millisecond) // virtual time: up to 2 minutes
		}
		if err := stop(); !errors.Is(err, consumer.ErrClosed) {
			t.Errorf("Run returned %v, want ErrClosed", err)
		}
		if len(runs) != 50 {
			t.Fatalf("%d runs, want 50", len(runs))
		}
		if took := runs[49].Sub(runs[0]); took < 5*time.Second {
			t.Errorf("50 attempts took %v: held-back messages ran again without their delay", took)
		}
		if s := c.Stats()[0]; s.Held != 0 || s.Settled[consumer.OutcomeTerminated] != 1 {
			t.Errorf("held %d, settled %v", s.Held, s.Settled)
		}
	})
}

// gateSource hands out its first batch at once and its second only when
// the test opens the gate, whatever its ctx says (a long poll that answers
// late). Its ackers record the order of the Naks.
type gateSource struct {
	first, second []*consumer.Message
	gate          chan struct{}
	calls         atomic.Int64
}

func (s *gateSource) Attach(consumer.RouteLimits) (consumer.SourceInfo, error) {
	return consumer.SourceInfo{}, nil
}

func (s *gateSource) Fetch(ctx context.Context, _ int, _ int64) ([]*consumer.Message, error) {
	switch s.calls.Add(1) {
	case 1:
		return s.first, nil
	case 2:
		<-s.gate
		return s.second, nil
	}
	<-ctx.Done()
	return nil, ctx.Err()
}

type orderAcker struct {
	name string
	log  *[]string
	mu   *sync.Mutex
}

func (a orderAcker) Settle(_ context.Context, s consumer.Settlement) error {
	a.mu.Lock()
	*a.log = append(*a.log, a.name+":"+s.Op.String())
	a.mu.Unlock()
	return nil
}
func (orderAcker) InProgress(context.Context) error { return nil }

// An ordered route hands a key's messages back in order at shutdown, also
// for messages without an Origin (sluicetest.Source, custom Sources): a
// message fetched after the shutdown began is handed back after its key's
// earlier messages, though another message without an Origin was handed
// back before it. Before, the route remembered handed-back messages by
// Origin alone, so after one such hand-back every message without an
// Origin counted as a redelivery of it and was handed back at once, ahead
// of its key.
func TestShutdownHandsBackInKeyOrderWithoutOrigin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		var log []string
		msg := func(name, key string) *consumer.Message {
			m := &consumer.Message{}
			consumer.InitMessage(m, orderAcker{name: name, log: &log, mu: &mu})
			m.Topic, m.Key, m.Value, m.Attempt = "t", []byte(key), []byte(name), 1
			return m
		}
		src := &gateSource{
			first:  []*consumer.Message{msg("k1", "k"), msg("k2", "k")},
			second: []*consumer.Message{msg("j1", "j"), msg("k3", "k")},
			gate:   make(chan struct{}),
		}
		r := route("r", src, func(ctx context.Context, m *consumer.Message) error {
			if string(m.Value) == "k1" {
				time.Sleep(time.Second) // runs into the shutdown, within the grace
			}
			return nil
		})
		r.Ordering, r.Workers, r.Window.Messages = consumer.ByKey, 1, 8
		c, err := consumer.New(consumer.Options{ShutdownGrace: 5 * time.Second}, r)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		synctest.Wait() // k1 runs, k2 waits behind it, the second Fetch waits
		if src.calls.Load() != 2 {
			t.Fatalf("%d fetches, want the second one waiting", src.calls.Load())
		}
		cancel()
		synctest.Wait()
		close(src.gate) // the second batch arrives after the shutdown began
		if err := <-done; err != nil {
			t.Fatalf("Run: %v", err)
		}
		mu.Lock()
		defer mu.Unlock()
		pos := map[string]int{}
		for i, e := range log {
			pos[e] = i + 1
		}
		if pos["k1:ack"] == 0 || pos["k2:nak"] == 0 || pos["k3:nak"] == 0 || pos["j1:nak"] == 0 {
			t.Fatalf("settlements %v: want k1 acked, k2, k3 and j1 nak'd", log)
		}
		if pos["k3:nak"] < pos["k2:nak"] {
			t.Errorf("settlements %v: k3 handed back before k2, its key's earlier message", log)
		}
	})
}

// Run writes no shutdown letter on its own goroutine past the slack (found
// by TestSimulation, seed 968). An ordered route's kept head is abandoned
// when the grace ends; its key's next message, a last delivery, is then
// handed back by Run, which dead-letters it (ClassShutdown). That write
// ignores its ctx: Run returns at the grace and slack with ErrStuckHandlers
// instead of waiting for it (before: Run returned only when the write did,
// with nil).
func TestRunDoesNotWaitForAStuckShutdownLetter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.MaxDeliver = 1
		src.PublishMsg(sluicetest.Msg{ID: "head", Key: []byte("k"), Value: []byte("v")})
		src.PublishMsg(sluicetest.Msg{ID: "next", Key: []byte("k"), Value: []byte("v")})
		unstick := make(chan struct{})
		sink := dlq.SinkFunc(func(_ context.Context, l *dlq.Letter) error {
			if l.Class == consumer.ClassShutdown {
				<-unstick // ignores its ctx
				return nil
			}
			return errDown
		})
		r := route("r", src, func(context.Context, *consumer.Message) error {
			return consumer.Permanent(errors.New("poison"))
		})
		r.Ordering, r.Workers, r.Retry.MaxAttempts = consumer.ByKey, 1, 1
		r.DeadLetter.Sink = sink
		const grace = time.Second
		c, err := consumer.New(consumer.Options{ShutdownGrace: grace}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		time.Sleep(time.Second) // head's letter is kept, next waits behind it
		synctest.Wait()
		err, took := stopWithin(t, stop, grace+consumer.ShutdownSlack+time.Second, func() { close(unstick) })
		if !errors.Is(err, consumer.ErrStuckHandlers) || took > grace+consumer.ShutdownSlack {
			t.Errorf("Run returned %v after %v, want ErrStuckHandlers within %v", err, took, grace+consumer.ShutdownSlack)
		}
		select {
		case <-unstick:
		default:
			close(unstick)
		}
		synctest.Wait()
		if s := c.Stats()[0]; s.Held != 0 || s.Settled[consumer.OutcomeAbandoned] != 1 || s.Settled[consumer.OutcomeDeadLettered] != 1 {
			t.Errorf("held %d, settled %v: want head abandoned, next dead-lettered (shutdown)", s.Held, s.Settled)
		}
	})
}
