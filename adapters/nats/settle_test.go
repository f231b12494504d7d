package natsadapter_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
)

// TestBatchConfirmsPlainAcksByLaterAnswer: with the default ConfirmBatch
// most acks go without a reply subject, and each of them is confirmed by
// the server's answer to a later one. A watcher on another connection sees
// every ack in the order the server received them: the first asks for an
// answer (nothing was answered yet on this connection), the last asks for
// one (no plain ack is left waiting for a later answer), and the route
// counts every message settled only once the server took all the acks.
func TestBatchConfirmsPlainAcksByLaterAnswer(t *testing.T) {
	const n, workers = 2000, 8
	ctx, js := setup(t, n)
	acks := ackOrder(t, js.Conn().ConnectedUrl())
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "batch"}, natsadapter.SourceOptions{PollWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// The workers finish in groups, so settlements reach the writer
	// together: the k-th handler run waits for the others of its group.
	groups := make([]chan struct{}, n/workers)
	for i := range groups {
		groups[i] = make(chan struct{})
	}
	counts := make([]atomic.Int64, len(groups))
	var arrived atomic.Int64
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "batch",
		Source:  src,
		Workers: workers,
		Expiry:  expiry.Policy{IgnoreHeader: true},
		Handler: func(context.Context, *consumer.Message) error {
			g := int(arrived.Add(1)-1) / workers
			if g < len(groups) {
				if counts[g].Add(1) == workers {
					close(groups[g])
				}
				<-groups[g]
			}
			return nil
		},
		Window: consumer.WindowPolicy{Messages: 64, Bytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, 45*time.Second, func() bool {
		return c.Stats()[0].Settled[consumer.OutcomeSucceeded] == n
	}, nil)
	info, err := src.Consumer().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 || info.AckFloor.Stream != n {
		t.Fatalf("server: %d ack pending, ack floor %d: a settlement counted confirmed had not landed", info.NumAckPending, info.AckFloor.Stream)
	}
	st := src.Stats()
	deadline := time.Now().Add(5 * time.Second)
	for len(acks()) < n && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	order := acks()
	requests := 0
	for _, r := range order {
		if r {
			requests++
		}
	}
	t.Logf("%d acks: %d asked for an answer, %d plain; covered %d, re-sent %d", len(order), requests, len(order)-requests, st.AcksCovered, st.AcksResent)
	if len(order) != n {
		t.Fatalf("watcher saw %d acks, want %d", len(order), n)
	}
	if !order[0] || !order[n-1] {
		t.Fatalf("first ack asked for an answer: %v, last: %v (want both)", order[0], order[n-1])
	}
	if plain := uint64(n - requests); plain == 0 || st.AcksCovered != plain {
		t.Fatalf("%d plain acks, %d confirmed by a later answer", plain, st.AcksCovered)
	}
}

// TestBatchAsksForAnswersAgainAfterReconnect: after a reconnect the server
// may be one that restarted and has not loaded the consumer yet, and it
// drops plain acks to it silently; an answer to a later settlement would
// then confirm acks that never landed. So until a settlement sent on the
// new connection is answered, each one asks for its own answer: the first
// ack after the reconnect is not plain, though acks on the connection
// before were.
func TestBatchAsksForAnswersAgainAfterReconnect(t *testing.T) {
	const workers = 8
	r := newFaultRig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := r.js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}}); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, r.js, 3*workers)
	acks := ackOrder(t, r.srv.ClientURL())
	src, err := natsadapter.NewSourceFor(ctx, r.js, "WORK", jetstream.ConsumerConfig{Durable: "again", AckWait: 30 * time.Second}, natsadapter.SourceOptions{PollWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// Three groups of workers messages, each finishing together once
	// released: the first two before the reconnect, the third after.
	groups := []chan struct{}{make(chan struct{}), make(chan struct{}), make(chan struct{})}
	var arrived atomic.Int64
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "again",
		Source:  src,
		Workers: workers,
		Expiry:  expiry.Policy{IgnoreHeader: true},
		Handler: func(context.Context, *consumer.Message) error {
			<-groups[int(arrived.Add(1)-1)/workers]
			return nil
		},
		Window: consumer.WindowPolicy{Messages: 64, Bytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for !cond() {
			if ctx.Err() != nil {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	settled := func(k int) func() bool {
		return func() bool {
			return c.Stats()[0].Settled[consumer.OutcomeSucceeded] == uint64(k) && len(acks()) == k
		}
	}
	for g := range 2 {
		close(groups[g])
		waitFor("a group settled", settled((g+1)*workers))
		waitFor("the group's workers waiting", func() bool { return arrived.Load() == int64((g+2)*workers) })
	}
	if before := acks(); !slices.Contains(before, false) {
		t.Fatalf("no plain ack before the reconnect (%v): the test shows nothing", before)
	}
	cid, err := r.nc.GetClientID()
	if err != nil {
		t.Fatal(err)
	}
	r.mu.Lock()
	err = r.srv.DisconnectClientByID(cid)
	r.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	waitFor("the reconnect", func() bool { return r.nc.Stats().Reconnects == 1 && r.nc.IsConnected() })
	close(groups[2])
	waitFor("the last group settled", settled(3*workers))
	after := acks()[2*workers:]
	t.Logf("acks before the reconnect %v, after %v", acks()[:2*workers], after)
	if !after[0] {
		t.Fatal("the first ack after the reconnect was plain: nothing said the consumer took acks on the new connection")
	}
}

// TestBatchAcksToDeletedConsumerFailFast: plain acks to a consumer that
// was deleted are dropped without a word; only the answer to the batch's
// last ack says so (503, no responders). The plain ones before it are then
// re-sent at once, each asking for its own answer, and given up within a
// few sweeps, instead of each waiting AckTimeout three times while
// the stopping route waits for them (TestUserDurableDeletedFailsRoute ran
// past 10 s that way under load).
func TestBatchAcksToDeletedConsumerFailFast(t *testing.T) {
	const n, workers = 100, 8
	ctx, js := setup(t, n+workers)
	cons, err := js.CreateOrUpdateConsumer(ctx, "WORK", jetstream.ConsumerConfig{Durable: "gone", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	// AckTimeout far above the bound judged below, and the grace above
	// both: giving up by timeout (or by the grace) cannot pass for failing
	// fast, while the fast path (a few 200 ms sweeps) has room on a loaded
	// machine. With the default 5 s the bound had to sit at 4 s.
	src, err := natsadapter.NewSource(js, cons, natsadapter.SourceOptions{PollWait: 100 * time.Millisecond, AckTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	gate := make(chan struct{})
	var arrived atomic.Int64
	c, err := consumer.New(consumer.Options{ShutdownGrace: 2 * time.Minute}, consumer.Route{
		Expiry:  expiry.Policy{IgnoreHeader: true},
		Name:    "gone",
		Source:  src,
		Workers: workers,
		Handler: func(context.Context, *consumer.Message) error {
			if arrived.Add(1) > n {
				<-gate
			}
			return nil
		},
		// Room beside the gated runs: the route fetches again only once a
		// quarter of the window is free (MinFetch).
		Window: consumer.WindowPolicy{Messages: 2 * workers, Bytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	stuck := time.Now().Add(20 * time.Second)
	for arrived.Load() < n+workers || c.Stats()[0].Settled[consumer.OutcomeSucceeded] < n {
		select {
		case err := <-errc:
			t.Fatalf("run ended early: %v", err)
		case <-time.After(5 * time.Millisecond):
		}
		if time.Now().After(stuck) {
			t.Fatalf("%d handler runs, route %+v, source %+v", arrived.Load(), c.Stats()[0], src.Stats())
		}
	}
	if src.Stats().AcksCovered == 0 {
		t.Fatal("no plain ack before the deletion: the test shows nothing")
	}
	if err := js.DeleteConsumer(ctx, "WORK", "gone"); err != nil {
		t.Fatal(err)
	}
	released := time.Now()
	close(gate) // the last workers acks go to a consumer that is gone
	select {
	case err = <-errc:
	case <-time.After(3 * time.Minute):
		t.Fatal("route still running 3 min after its durable was deleted")
	}
	took := time.Since(released)
	s, st := c.Stats()[0], src.Stats()
	t.Logf("run ended %v after the release: %v; settle errors %d, unconfirmed %d, re-sent %d", took, err, s.Errors.Settle, st.AcksUnconfirmed, st.AcksResent)
	if !errors.Is(err, natsadapter.ErrConsumerDeleted) {
		t.Fatalf("run returned %v", err)
	}
	if s.Errors.Settle != workers {
		t.Fatalf("%d settle errors, want the %d acks sent after the deletion", s.Errors.Settle, workers)
	}
	if took > 30*time.Second {
		t.Fatalf("the acks to the deleted consumer took %v to give up on (AckTimeout is 1 min)", took)
	}
}

// ackOrder watches, on its own connection to url, the +ACKs on the WORK
// stream in the order the server receives them, and returns what it saw
// so far: true for an ack that asked for an answer, false for a plain one.
func ackOrder(t *testing.T, url string) func() []bool {
	t.Helper()
	var mu sync.Mutex
	var order []bool
	wnc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wnc.Close)
	if _, err := wnc.Subscribe("$JS.ACK.WORK.>", func(m *nats.Msg) {
		if string(m.Data) == "+ACK" {
			mu.Lock()
			order = append(order, m.Reply != "")
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := wnc.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() []bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(order)
	}
}
