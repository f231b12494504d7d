package natsadapter_test

import (
	"context"
	"errors"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
)

// faultRig is a server on a fixed port and store dir, so it can be
// restarted under a connected client, plus a reconnecting client.
type faultRig struct {
	confirm natsadapter.ConfirmMode // of the Sources faultRun makes
	mu      sync.Mutex
	srv     *server.Server
	dir     string
	port    int
	nc      *nats.Conn
	js      jetstream.JetStream
}

func newFaultRig(t *testing.T) *faultRig {
	t.Helper()
	r := &faultRig{dir: t.TempDir()}
	s, err := natstest.RunAt(r.dir, -1)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(s.ClientURL())
	r.port, _ = strconv.Atoi(u.Port())
	r.srv = s
	r.nc, err = nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if r.js, err = jetstream.New(r.nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.nc.Close()
		r.mu.Lock()
		defer r.mu.Unlock()
		r.srv.Shutdown()
		r.srv.WaitForShutdown()
	})
	return r
}

// restart stops the server, waits down, and starts it again on the same
// port and store.
func (r *faultRig) restart(t *testing.T, down time.Duration) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.srv.Shutdown()
	r.srv.WaitForShutdown()
	time.Sleep(down)
	s, err := natstest.RunAt(r.dir, r.port)
	if err != nil {
		t.Fatal(err)
	}
	r.srv = s
}

// forEachConfirm runs test once per confirmed settlement mode.
func forEachConfirm(t *testing.T, test func(*testing.T, natsadapter.ConfirmMode)) {
	for _, m := range []natsadapter.ConfirmMode{natsadapter.ConfirmBatch, natsadapter.ConfirmReply} {
		t.Run(m.String(), func(t *testing.T) { test(t, m) })
	}
}

// faultRun consumes n published messages while fault runs once after
// `after` handled messages, and checks that every message was handled
// and the consumer ends with nothing pending. It returns the duplicates.
func faultRun(t *testing.T, r *faultRig, n, after int, fault func()) (dups int64, s consumer.RouteStats) {
	t.Helper()
	return faultRunWith(t, r, n, after, fault, nil)
}

// faultRunWith is faultRun that also hands the Source to withSource.
func faultRunWith(t *testing.T, r *faultRig, n, after int, fault func(), withSource func(*natsadapter.Source)) (dups int64, s consumer.RouteStats) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := r.js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, r.js, n)
	const window = 32
	src, err := natsadapter.NewSourceFor(ctx, r.js, "WORK", jetstream.ConsumerConfig{Durable: "fault", AckWait: 2 * time.Second}, natsadapter.SourceOptions{PollWait: 200 * time.Millisecond, AckTimeout: time.Second, Confirm: r.confirm})
	if err != nil {
		t.Fatal(err)
	}
	if withSource != nil {
		withSource(src)
	}
	var mu sync.Mutex
	seen := map[int]int{}
	var handled, dup atomic.Int64
	c, err := consumer.New(consumer.Options{ShutdownGrace: time.Second}, consumer.Route{
		Expiry:  expiry.Policy{IgnoreHeader: true}, // not about deadlines: run every message publish made
		Name:    "fault",
		Source:  src,
		Workers: 4,
		Retry:   consumer.RetryPolicy{MaxAttempts: 100, BaseDelay: time.Millisecond, MaxDelay: 50 * time.Millisecond},
		Handler: func(_ context.Context, m *consumer.Message) error {
			time.Sleep(200 * time.Microsecond)
			id, _ := strconv.Atoi(m.Headers.Get("Id"))
			mu.Lock()
			seen[id]++
			if seen[id] > 1 {
				dup.Add(1)
			}
			mu.Unlock()
			handled.Add(1)
			return nil
		},
		Window: consumer.WindowPolicy{Messages: window, Bytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	complete := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == n
	}
	runUntil(t, c, 45*time.Second, func() bool {
		if complete() {
			info, err := src.Consumer().Info(ctx)
			return err == nil && info.NumAckPending == 0 && info.NumPending == 0
		}
		return false
	}, func() {
		if handled.Load() >= int64(after) {
			once.Do(fault)
		}
	})
	return dup.Load(), c.Stats()[0]
}

func TestServerRestartMidStream(t *testing.T) { forEachConfirm(t, testServerRestartMidStream) }

func testServerRestartMidStream(t *testing.T, mode natsadapter.ConfirmMode) {
	r := newFaultRig(t)
	r.confirm = mode
	const n = 3000
	var src *natsadapter.Source
	dups, s := faultRunWith(t, r, n, 1000, func() { r.restart(t, 300*time.Millisecond) }, func(s *natsadapter.Source) { src = s })
	st := src.Stats()
	// Settlements in flight when the server went down are re-sent after
	// the reconnect. With ConfirmReply one that still does not land is
	// reported (a settle error). The server may also have read an ack and
	// gone down before applying it: after the restart it redelivers the
	// message while the client still waits for that ack's answer, and the
	// Source settles the redelivery instead of handing it to the route
	// (TestRedeliveryWhileAckUnansweredIsNotHandledAgain). Only if the
	// re-sent ack is answered before the redelivery is read can both
	// deliveries be handled (each confirmed once; 0 duplicates in 10 runs
	// here). So every duplicate is accounted for by a settlement that was
	// in doubt (re-sent or reported), never by one the server confirmed on
	// the first send. With ConfirmBatch this holds too: after the
	// reconnect every settlement asks for its own answer until one is
	// answered, so no plain ack reaches a restarted server that has not
	// loaded its consumer yet (which drops it silently).
	t.Logf("restart: duplicates %d, settle errors %d, acks re-sent %d, redeliveries settled by the Source %d, fetch errors %d, fetched %d", dups, s.Errors.Settle, st.AcksResent, st.RedeliveriesSettled, s.Errors.Fetch, s.Fetched)
	if dups > 2*32 {
		t.Fatalf("%d duplicates, more than two windows", dups)
	}
	if uint64(dups) > s.Errors.Settle+st.AcksResent {
		t.Fatalf("%d duplicates but %d settle errors and %d acks re-sent: a settlement the server confirmed at once did not land", dups, s.Errors.Settle, st.AcksResent)
	}
}

func TestClientDisconnectMidBatch(t *testing.T) { forEachConfirm(t, testClientDisconnectMidBatch) }

func testClientDisconnectMidBatch(t *testing.T, mode natsadapter.ConfirmMode) {
	r := newFaultRig(t)
	r.confirm = mode
	const n = 3000
	dups, s := faultRun(t, r, n, 1000, func() {
		cid, err := r.nc.GetClientID()
		if err != nil {
			t.Error(err)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if err := r.srv.DisconnectClientByID(cid); err != nil {
			t.Error(err)
		}
	})
	t.Logf("disconnect: duplicates %d, settle errors %d, fetch errors %d, fetched %d", dups, s.Errors.Settle, s.Errors.Fetch, s.Fetched)
	if dups > 2*32 {
		t.Fatalf("%d duplicates, more than two windows", dups)
	}
}

// TestServerKilledBetweenAckAndReply stops the server after it received a
// confirmed ack but before its reply reached the client (a proxy holds the
// server's traffic back), then starts it again. The ack is re-sent after
// the reconnect and confirmed: the message is neither lost nor counted
// settled twice.
func TestServerKilledBetweenAckAndReply(t *testing.T) {
	forEachConfirm(t, testServerKilledBetweenAckAndReply)
}

func testServerKilledBetweenAckAndReply(t *testing.T, mode natsadapter.ConfirmMode) {
	r := newFaultRig(t)
	proxy, err := natstest.NewProxy("127.0.0.1:" + strconv.Itoa(r.port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	nc, err := nats.Connect(proxy.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond), nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := r.js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	const n, target = 200, 100
	publish(t, ctx, r.js, n)
	// Deliveries the server sent while its replies were held are lost with
	// the connection and come back after AckWait (3 s); the target's ack
	// is re-sent right after the reconnect, long before that.
	//
	// The sniffer sees the server receive the target's +ACK, on a direct
	// connection (not through the proxy).
	acked := make(chan struct{})
	var once sync.Once
	sniff, err := r.nc.Subscribe("$JS.ACK.WORK.>", func(m *nats.Msg) {
		tok := strings.Split(m.Subject, ".")
		if len(tok) > 5 && tok[5] == strconv.Itoa(target+1) && string(m.Data) == "+ACK" {
			once.Do(func() { close(acked) })
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sniff.Unsubscribe()
	if err := r.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "kill", AckWait: 3 * time.Second}, natsadapter.SourceOptions{PollWait: 200 * time.Millisecond, AckTimeout: 2 * time.Second, Confirm: mode})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[int]int{}
	var handled atomic.Int64
	c, err := consumer.New(consumer.Options{ShutdownGrace: time.Second}, consumer.Route{
		Expiry:  expiry.Policy{IgnoreHeader: true}, // not about deadlines: run every message publish made
		Name:    "kill",
		Source:  src,
		Workers: 4,
		Handler: func(_ context.Context, m *consumer.Message) error {
			id, _ := strconv.Atoi(m.Headers.Get("Id"))
			if id == target {
				proxy.HoldReplies() // its ack reaches the server, the reply does not come back
			}
			mu.Lock()
			seen[id]++
			mu.Unlock()
			handled.Add(1)
			return nil
		},
		Window: consumer.WindowPolicy{Messages: 32, Bytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	var restarted atomic.Bool
	runUntil(t, c, 45*time.Second, func() bool {
		mu.Lock()
		all := len(seen) == n
		mu.Unlock()
		if !all || !restarted.Load() {
			return false
		}
		info, err := src.Consumer().Info(ctx)
		s := c.Stats()[0]
		return err == nil && info.NumAckPending == 0 && info.NumPending == 0 && s.Held == 0
	}, func() {
		select {
		case <-acked:
			if restarted.CompareAndSwap(false, true) {
				// The server dies: its connections drop with what it had
				// sent (the held reply), and it comes back on its store.
				proxy.Cut()
				proxy.Release()
				r.restart(t, 100*time.Millisecond)
			}
		default:
		}
	})
	s := c.Stats()[0]
	st := src.Stats()
	mu.Lock()
	defer mu.Unlock()
	dups := 0
	for id := range n {
		switch seen[id] {
		case 0:
			t.Fatalf("message %d lost", id)
		case 1:
		default:
			dups += seen[id] - 1
		}
	}
	var settled uint64
	for _, v := range s.Settled {
		settled += v
	}
	t.Logf("handled %d, duplicates %d, acks re-sent %d, unconfirmed %d; stats %+v", handled.Load(), dups, st.AcksResent, st.AcksUnconfirmed, s)
	if settled != s.Fetched || s.Settled[consumer.OutcomeSucceeded] != uint64(handled.Load()) {
		t.Fatalf("settled %d of %d fetched, %d succeeded for %d handler runs", settled, s.Fetched, s.Settled[consumer.OutcomeSucceeded], handled.Load())
	}
	if st.AcksResent == 0 {
		t.Fatal("no ack was re-sent: the reply was not lost")
	}
	if seen[target] != 1 {
		t.Fatalf("target handled %d times: its ack was lost", seen[target])
	}
}

// TestRedeliveryWhileAckUnansweredIsNotHandledAgain: the server redelivers
// a message whose ack it has not applied (here the ack waits in a proxy;
// after a restart, the server read it and went down before applying it)
// while the client still waits for that ack's answer. The handler already
// ran to its end, so the Source settles the redelivery the same way
// instead of handing it to the route: the handler runs once. Before, the
// route handled it a second time and both deliveries were confirmed (the
// duplicates TestServerRestartMidStream saw).
func TestRedeliveryWhileAckUnansweredIsNotHandledAgain(t *testing.T) {
	forEachConfirm(t, testRedeliveryWhileAckUnanswered)
}

func testRedeliveryWhileAckUnanswered(t *testing.T, mode natsadapter.ConfirmMode) {
	r := newFaultRig(t)
	proxy, err := natstest.NewProxy("127.0.0.1:" + strconv.Itoa(r.port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	nc, err := nats.Connect(proxy.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := r.js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}}); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, r.js, 1)
	// AckWait 1 s: the server redelivers while the first ack is held. The
	// pull request the redelivery answers waits up to PollWait; the ack's
	// answer is awaited far longer (AckTimeout), so nothing gives up.
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "dup", AckWait: time.Second},
		natsadapter.SourceOptions{PollWait: 20 * time.Second, AckTimeout: 30 * time.Second, Confirm: mode})
	if err != nil {
		t.Fatal(err)
	}
	var runs atomic.Int64
	c, err := consumer.New(consumer.Options{ShutdownGrace: time.Second}, consumer.Route{
		Expiry:  expiry.Policy{IgnoreHeader: true},
		Name:    "dup",
		Source:  src,
		Workers: 1,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			if runs.Add(1) > 1 {
				return nil
			}
			// Hold the client's traffic once the next pull request waits on
			// the server (the redelivery will answer it): the ack of this
			// delivery then does not reach the server.
			for {
				info, err := r.js.Consumer(ctx, "WORK", "dup")
				if err != nil {
					return err
				}
				if info.CachedInfo().NumWaiting > 0 {
					break
				}
				time.Sleep(5 * time.Millisecond)
			}
			proxy.HoldSends()
			return nil
		},
		Window: consumer.WindowPolicy{Messages: 8, Bytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	released := false
	runUntil(t, c, 45*time.Second, func() bool {
		if !released {
			return false
		}
		info, err := r.js.Consumer(ctx, "WORK", "dup")
		s := c.Stats()[0]
		return err == nil && info.CachedInfo().NumAckPending == 0 && s.Held == 0 && s.Settled[consumer.OutcomeSucceeded] == s.Fetched
	}, func() {
		if !released && (src.Stats().RedeliveriesSettled > 0 || runs.Load() > 1) {
			proxy.Release()
			released = true
		}
	})
	s, st := c.Stats()[0], src.Stats()
	t.Logf("handler runs %d, fetched %d, redeliveries settled by the Source %d, acks re-sent %d, unconfirmed %d", runs.Load(), s.Fetched, st.RedeliveriesSettled, st.AcksResent, st.AcksUnconfirmed)
	if runs.Load() != 1 || s.Fetched != 1 || st.RedeliveriesSettled != 1 {
		t.Fatalf("handler ran %d times for one message, fetched %d, %d redeliveries settled by the Source", runs.Load(), s.Fetched, st.RedeliveriesSettled)
	}
	if s.Settled[consumer.OutcomeSucceeded] != 1 || s.Errors.Settle != 0 {
		t.Fatalf("stats %+v: the first delivery's ack was not confirmed once", s)
	}
}

// TestDurableDeletedIsRecreated deletes the durable a NewSourceFor Source
// created while the route runs: the Source recreates it from the last ack
// floor it saw, says so in the fetch error, and nothing is lost.
func TestDurableDeletedIsRecreated(t *testing.T) {
	r := newFaultRig(t)
	const n = 3000
	var src *natsadapter.Source
	dups, s := faultRunWith(t, r, n, 1500, func() {
		if err := r.js.DeleteConsumer(context.Background(), "WORK", "fault"); err != nil {
			t.Error(err)
		}
	}, func(s *natsadapter.Source) { src = s })
	st := src.Stats()
	t.Logf("deleted: duplicates %d, recreated %d, fetch errors %d, settle errors %d, fetched %d", dups, st.Recreated, s.Errors.Fetch, s.Errors.Settle, s.Fetched)
	if st.Recreated != 1 || s.Errors.Fetch == 0 {
		t.Fatalf("recreated %d times, %d fetch errors", st.Recreated, s.Errors.Fetch)
	}
	if dups >= n/2 {
		t.Fatalf("%d duplicates: the recreated durable started from the beginning", dups)
	}
}

// TestUserDurableDeletedFailsRoute deletes a durable the user created
// (NewSource): the Source cannot know how to recreate it, so the route
// stops with an error that says what happened.
func TestUserDurableDeletedFailsRoute(t *testing.T) {
	ctx, js := setup(t, 100)
	cons, err := js.CreateOrUpdateConsumer(ctx, "WORK", jetstream.ConsumerConfig{Durable: "theirs", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	src, err := natsadapter.NewSource(js, cons, natsadapter.SourceOptions{PollWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Expiry:  expiry.Policy{IgnoreHeader: true}, // not about deadlines: run every message publish made
		Name:    "theirs",
		Source:  src,
		Workers: 2,
		Handler: func(context.Context, *consumer.Message) error { handled.Add(1); return nil },
		Window:  consumer.WindowPolicy{Messages: 16, Bytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	for handled.Load() < 100 {
		select {
		case err := <-errc:
			t.Fatalf("run ended early: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if err := js.DeleteConsumer(ctx, "WORK", "theirs"); err != nil {
		t.Fatal(err)
	}
	select {
	case err = <-errc:
	case <-time.After(10 * time.Second):
		t.Fatal("route still running 10s after its durable was deleted")
	}
	if !errors.Is(err, natsadapter.ErrConsumerDeleted) || !errors.Is(err, consumer.ErrClosed) || !strings.Contains(err.Error(), `"theirs"`) {
		t.Fatalf("run returned %v", err)
	}
	// Health says the route stopped, and why (issue 29).
	if rh := c.Health().Routes[0]; rh.State != consumer.StateStopped || !strings.Contains(rh.Reason, "created outside sluice, so not recreated") {
		t.Fatalf("health %+v", rh)
	}
}

// TestPoisonWithDLQDownKeepsFlowing is issue 13.1: with the dead-letter
// sink refusing every write, poison messages are nak'd with backoff again
// and again; JetStream keeps each ack-pending for its delay. With
// MaxAckPending sized to the window they filled it and good messages
// stopped arriving (2,550 never delivered in 60 s). The Source now sizes
// MaxAckPending with a reserve for delayed naks, so good traffic keeps its
// pace: it is timed against the same backlog without poison.
func TestPoisonWithDLQDownKeepsFlowing(t *testing.T) {
	const n, every, window = 10000, 100, 64 // 100 poison messages
	run := func(poison bool) (time.Duration, *natsadapter.Source, consumer.RouteStats) {
		ctx, js := setup(t, n)
		src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "poison", AckWait: 30 * time.Second},
			natsadapter.SourceOptions{PollWait: 200 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		var good atomic.Int64
		c, err := consumer.New(consumer.Options{}, consumer.Route{
			Expiry:  expiry.Policy{IgnoreHeader: true}, // not about deadlines: run every message publish made
			Name:    "poison",
			Source:  src,
			Workers: 8,
			Retry:   consumer.RetryPolicy{BaseDelay: 500 * time.Millisecond, MaxDelay: 5 * time.Second},
			Handler: func(_ context.Context, m *consumer.Message) error {
				id, _ := strconv.Atoi(m.Headers.Get("Id"))
				if poison && id%every == 0 {
					return consumer.Permanent(errors.New("poison"))
				}
				time.Sleep(time.Millisecond)
				good.Add(1)
				return nil
			},
			Window:     consumer.WindowPolicy{Messages: window, Bytes: 1 << 20},
			DeadLetter: consumer.DeadLetterPolicy{Sink: dlq.SinkFunc(func(context.Context, *dlq.Letter) error { return errors.New("dlq down") })},
		})
		if err != nil {
			t.Fatal(err)
		}
		want := int64(n)
		if poison {
			want = n - n/every
		}
		start := time.Now()
		// A bound for a stalled run, not a pace (the ratio below judges
		// the pace): under -race -cpu 1 with a CPU hog the run with
		// poison took 45 s of the 60 s this allowed.
		runUntil(t, c, 4*time.Minute, func() bool { return good.Load() >= want }, nil)
		return time.Since(start), src, c.Stats()[0]
	}
	clean, _, _ := run(false)
	dirty, src, s := run(true)
	st := src.Stats()
	ratio := (float64(n-n/every) / dirty.Seconds()) / (float64(n) / clean.Seconds())
	t.Logf("good messages: %.0f/s with 1%% poison and the DLQ down, %.0f/s without poison (%.2fx); DLQ failures %d, delayed naks now %d, MaxAckPending %d (raised %d times)",
		float64(n-n/every)/dirty.Seconds(), float64(n)/clean.Seconds(), ratio, s.Settled[consumer.OutcomeDLQFailed], st.DelayedNaks, st.MaxAckPending, st.AckPendingRaises)
	if s.Settled[consumer.OutcomeDLQFailed] < n/every {
		t.Fatalf("only %d failed dead-letter writes: the poison did not cycle", s.Settled[consumer.OutcomeDLQFailed])
	}
	// The stall this guards against left good traffic near 0x (2,550 of
	// 9,900 undelivered after 60 s); on quiet cores the ratio is 0.85-1.6x.
	// The bar sits well below that so load from other packages under -race
	// (one run measured 0.49x) does not fail it; the figure is logged.
	if ratio < 0.25 {
		t.Fatalf("good traffic at %.2fx of its pace without poison: stalled", ratio)
	}
}

// TestDelayedNaksRaiseMaxAckPending: more delayed naks than the initial
// reserve (window 16 + 256) make the Source raise MaxAckPending, so the
// server keeps delivering new messages while hundreds wait out their delay.
func TestDelayedNaksRaiseMaxAckPending(t *testing.T) {
	const n, window = 1000, 16
	ctx, js := setup(t, n)
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "delays", AckWait: 30 * time.Second},
		natsadapter.SourceOptions{PollWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var first, done atomic.Int64
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Expiry:  expiry.Policy{IgnoreHeader: true}, // not about deadlines: run every message publish made
		Name:    "delays",
		Source:  src,
		Workers: 4,
		Retry:   consumer.RetryPolicy{BaseDelay: 2 * time.Second, MaxDelay: 2 * time.Second},
		Handler: func(_ context.Context, m *consumer.Message) error {
			if m.Attempt == 1 {
				first.Add(1)
				return errors.New("later")
			}
			done.Add(1)
			return nil
		},
		Window: consumer.WindowPolicy{Messages: window, Bytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	var peak atomic.Int64
	runUntil(t, c, 30*time.Second, func() bool { return done.Load() >= n }, func() {
		if d := int64(src.Stats().DelayedNaks); d > peak.Load() {
			peak.Store(d)
		}
	})
	st := src.Stats()
	t.Logf("first attempts %d, peak delayed naks %d, MaxAckPending %d, raised %d times", first.Load(), peak.Load(), st.MaxAckPending, st.AckPendingRaises)
	if st.AckPendingRaises == 0 || st.MaxAckPending <= window+256 {
		t.Fatalf("MaxAckPending %d, raised %d times, with %d delayed naks at the peak", st.MaxAckPending, st.AckPendingRaises, peak.Load())
	}
	info, err := src.Consumer().Info(ctx)
	if err != nil || info.Config.MaxAckPending != st.MaxAckPending {
		t.Fatalf("server MaxAckPending %v, err %v", info.Config.MaxAckPending, err)
	}
}

// TestUnansweredAckIsNotConfirmed holds every reply of the server back: the
// ack is re-sent twice after AckTimeout, then completes with
// ErrAckUnconfirmed and is counted as a settle error, not as a confirmed
// settlement (the server did get it here, so nothing is redelivered).
func TestUnansweredAckIsNotConfirmed(t *testing.T) {
	forEachConfirm(t, testUnansweredAckIsNotConfirmed)
}

func testUnansweredAckIsNotConfirmed(t *testing.T, mode natsadapter.ConfirmMode) {
	r := newFaultRig(t)
	proxy, err := natstest.NewProxy("127.0.0.1:" + strconv.Itoa(r.port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = proxy.Close() })
	nc, err := nats.Connect(proxy.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := r.js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}}); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, r.js, 1)
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "mute", AckWait: 5 * time.Second}, natsadapter.SourceOptions{PollWait: 100 * time.Millisecond, AckTimeout: 200 * time.Millisecond, Confirm: mode})
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "mute",
		Source:  src,
		Workers: 1,
		Handler: func(context.Context, *consumer.Message) error {
			proxy.HoldReplies()
			handled.Add(1)
			return nil
		},
		Window: consumer.WindowPolicy{Messages: 4, Bytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, 10*time.Second, func() bool { return src.Stats().AcksUnconfirmed == 1 && c.Stats()[0].Held == 0 }, nil)
	proxy.Release()
	st, s := src.Stats(), c.Stats()[0]
	if st.AcksResent != 2 || s.Errors.Settle != 1 || handled.Load() != 1 {
		t.Fatalf("resent %d, settle errors %d, handled %d", st.AcksResent, s.Errors.Settle, handled.Load())
	}
	info, err := r.js.Consumer(ctx, "WORK", "mute")
	if err != nil {
		t.Fatal(err)
	}
	if ci := info.CachedInfo(); ci.NumAckPending != 0 || ci.AckFloor.Stream != 1 {
		t.Fatalf("server: ack pending %d, ack floor %d", ci.NumAckPending, ci.AckFloor.Stream)
	}
}
