package natsadapter_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

func setup(t *testing.T, n int) (context.Context, jetstream.JetStream) {
	t.Helper()
	js := natstest.JetStream(t)
	// The tests' whole bound, not a pace: tests go on using ctx after a
	// run that took minutes under -race -cpu 1 on a loaded machine.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}}); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, js, n)
	return ctx, js
}

// Every expiredEvery-th message published by publish (ids 500, 1001, ...)
// carries a deadline that has already passed. Routes read the deadline
// header by default, so these are never run.
const expiredEvery = 501

func isExpired(id int) bool { return id%expiredEvery == expiredEvery-1 }

func publish(t *testing.T, ctx context.Context, js jetstream.JetStream, n int) {
	t.Helper()
	const par = 256
	for i := 0; i < n; i += par {
		var futs []jetstream.PubAckFuture
		for j := i; j < min(i+par, n); j++ {
			h := nats.Header{"Id": []string{strconv.Itoa(j)}}
			if isExpired(j) {
				// Already past its deadline: a route with a header
				// deadline policy must never run it.
				h.Set(expiry.DefaultHeader, expiry.FormatDeadline(time.Now().Add(-time.Minute)))
			}
			f, err := js.PublishMsgAsync(&nats.Msg{Subject: "work.x", Data: []byte(strconv.Itoa(j)), Header: h})
			if err != nil {
				t.Fatal(err)
			}
			futs = append(futs, f)
		}
		for _, f := range futs {
			select {
			case <-f.Ok():
			case err := <-f.Err():
				t.Fatal(err)
			case <-ctx.Done():
				t.Fatal(ctx.Err())
			}
		}
	}
}

// runUntil runs c until cond holds or timeout, then stops it.
func runUntil(t *testing.T, c *consumer.Consumer, timeout time.Duration, cond func() bool, tick func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("timed out; stats %+v", c.Stats())
		}
		if tick != nil {
			tick()
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestLedgerNothingLost(t *testing.T) { forEachConfirm(t, testLedgerNothingLost) }

func testLedgerNothingLost(t *testing.T, mode natsadapter.ConfirmMode) {
	const n = 10000
	ctx, js := setup(t, n)
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "ledger", AckWait: 10 * time.Second}, natsadapter.SourceOptions{PollWait: 200 * time.Millisecond, Confirm: mode})
	if err != nil {
		t.Fatal(err)
	}
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	acked := map[int]int{}
	var dups atomic.Int64
	// done[seq] is set when the handler succeeded or the dead letter was
	// written; an ack watcher on another connection checks that every
	// +ACK / +TERM it sees on $JS.ACK.> comes after that.
	var done sync.Map
	// Messages were published in id order, so sequence = id+1 (the
	// handler checks); an expired message is acked with no work to wait for.
	obs := watchAcks(t, js, "WORK", func(kind string, seq uint64) bool {
		if kind == "+ACK" && isExpired(int(seq-1)) {
			return true
		}
		_, ok := done.Load(seq)
		return ok
	})
	var badSeq atomic.Int64
	var ranExpired atomic.Int64
	h := func(_ context.Context, m *consumer.Message) error {
		time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
		id, _ := strconv.Atoi(m.Headers.Get("Id"))
		if isExpired(id) {
			ranExpired.Add(1)
		}
		if m.Origin.Sequence != uint64(id)+1 {
			badSeq.Add(1)
		}
		switch {
		case id%997 == 0:
			return consumer.Permanent(errors.New("poison"))
		case rand.IntN(100) < 3:
			return errors.New("flaky")
		}
		mu.Lock()
		acked[id]++
		if acked[id] > 1 {
			dups.Add(1)
		}
		mu.Unlock()
		done.Store(m.Origin.Sequence, true)
		return nil
	}
	dead := dlq.SinkFunc(func(ctx context.Context, l *dlq.Letter) error {
		err := sink.Write(ctx, l)
		if err == nil {
			done.Store(l.Origin.Sequence, true)
		}
		return err
	})
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:       "ledger",
		Source:     src,
		Handler:    h,
		Workers:    8,
		Expiry:     expiry.Policy{},
		Retry:      consumer.RetryPolicy{MaxAttempts: 10, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond},
		Window:     consumer.WindowPolicy{Messages: 64, Bytes: 1 << 20},
		DeadLetter: consumer.DeadLetterPolicy{Sink: dead},
	})
	if err != nil {
		t.Fatal(err)
	}
	poison, expired := 0, 0
	for i := 0; i < n; i++ {
		switch {
		case isExpired(i):
			expired++
		case i%997 == 0:
			poison++
		}
	}
	start := time.Now()
	// A bound for a stuck run, not a pace: under -race -cpu 1 with a CPU
	// hog 40 s settled about 8,700 of the 10,000.
	runUntil(t, c, 4*time.Minute, func() bool {
		s := c.Stats()[0]
		return s.Settled[consumer.OutcomeSucceeded]+s.Settled[consumer.OutcomeDeadLettered]+s.Settled[consumer.OutcomeExpired] >= n
	}, nil)
	t.Logf("settled %d in %v; stats %+v", n, time.Since(start), c.Stats()[0])

	// Read the DLQ back.
	dcons, err := js.CreateOrUpdateConsumer(ctx, natsadapter.DefaultDLQStream, jetstream.ConsumerConfig{AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	deadIDs := map[int]bool{}
	for len(deadIDs) < poison {
		b, err := dcons.Fetch(poison, jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range b.Messages() {
			got++
			l, err := dlq.Decode(nil, m.Data(), m.Headers())
			if err != nil {
				t.Fatal(err)
			}
			id, _ := strconv.Atoi(l.Headers["Id"][0])
			if l.Class != dlq.ClassPermanent || l.Origin.Stream != "WORK" || l.Origin.Sequence == 0 ||
				l.Origin.Group != "ledger" || l.Route != "ledger" || l.Origin.Topic != "work.x" || string(l.Value) != strconv.Itoa(id) {
				t.Fatalf("bad letter %+v", l)
			}
			deadIDs[id] = true
		}
		if got == 0 {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if badSeq.Load() > 0 {
		t.Fatalf("%d messages with sequence != id+1", badSeq.Load())
	}
	if got := c.Stats()[0].Settled[consumer.OutcomeExpired]; got != uint64(expired) || ranExpired.Load() != 0 {
		t.Fatalf("expired: %d settled, want %d; handler ran %d expired messages", got, expired, ranExpired.Load())
	}
	for i := 0; i < n; i++ {
		if isExpired(i) {
			if acked[i] > 0 || deadIDs[i] {
				t.Fatalf("expired %d was processed", i)
			}
			continue
		}
		if i%997 == 0 {
			if !deadIDs[i] || acked[i] > 0 {
				t.Fatalf("poison %d: dead %v acked %d", i, deadIDs[i], acked[i])
			}
		} else if acked[i] == 0 {
			t.Fatalf("message %d lost", i)
		}
	}
	info, err := src.Consumer().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 || info.NumPending != 0 {
		t.Fatalf("consumer not drained: ack pending %d, pending %d", info.NumAckPending, info.NumPending)
	}
	obs.wait(t, n-poison, poison) // n-poison: expired messages are acked too (ExpiredAck)
	t.Logf("duplicates: %d, dead letters: %d, acks seen %d, terms seen %d", dups.Load(), len(deadIDs), obs.acks.Load(), obs.terms.Load())
}

// ackWatch counts the acks of one stream as the server receives them.
type ackWatch struct {
	acks, terms, early atomic.Int64
	firstEarly         atomic.Value
}

// watchAcks subscribes to $JS.ACK.<stream>.> on its own connection and
// calls settled for every +ACK and +TERM: it must already hold for that
// stream sequence, or the ack came before the work was done.
func watchAcks(t *testing.T, js jetstream.JetStream, stream string, settled func(kind string, seq uint64) bool) *ackWatch {
	t.Helper()
	nc, err := nats.Connect(js.Conn().ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	w := &ackWatch{}
	_, err = nc.Subscribe("$JS.ACK."+stream+".>", func(m *nats.Msg) {
		kind := string(m.Data)
		if i := strings.IndexByte(kind, ' '); i >= 0 {
			kind = kind[:i]
		}
		if kind != "+ACK" && kind != "+TERM" {
			return
		}
		tok := strings.Split(m.Subject, ".")
		seq, _ := strconv.ParseUint(tok[5], 10, 64) // $JS.ACK.<stream>.<consumer>.<delivered>.<sseq>...
		if kind == "+ACK" {
			w.acks.Add(1)
		} else {
			w.terms.Add(1)
		}
		if !settled(kind, seq) {
			if w.early.Add(1) == 1 {
				w.firstEarly.Store(kind + " " + strconv.FormatUint(seq, 10))
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return w
}

// wait checks that the watcher saw at least acks +ACKs and terms +TERMs,
// none of them early.
func (w *ackWatch) wait(t *testing.T, acks, terms int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for w.acks.Load() < int64(acks) || w.terms.Load() < int64(terms) {
		if time.Now().After(deadline) {
			t.Fatalf("ack watcher saw %d +ACK (want %d), %d +TERM (want %d)", w.acks.Load(), acks, w.terms.Load(), terms)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if n := w.early.Load(); n > 0 {
		t.Fatalf("%d acks reached the server before their work was done, first: %v", n, w.firstEarly.Load())
	}
}

func TestWindowBound(t *testing.T) {
	const window, bytesWin = 16, 64   // bytes bind first: about 8 messages
	ctx, js := setup(t, 10*window*10) // far above the window
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "win"}, natsadapter.SourceOptions{PollWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "win",
		Source:  src,
		Workers: 4,
		Handler: func(context.Context, *consumer.Message) error {
			time.Sleep(time.Millisecond)
			handled.Add(1)
			return nil
		},
		Window: consumer.WindowPolicy{Messages: window, Bytes: bytesWin},
	})
	if err != nil {
		t.Fatal(err)
	}
	var sawBacklog atomic.Bool
	runUntil(t, c, 20*time.Second, func() bool { return handled.Load() >= 300 }, func() {
		if info, err := src.Consumer().Info(ctx); err == nil && info.NumPending >= 10*window {
			sawBacklog.Store(true)
		}
	})
	s := c.Stats()[0]
	if s.Window.Peak > window || s.Window.PeakBytes > bytesWin {
		t.Fatalf("window exceeded: peak %d msgs %d bytes", s.Window.Peak, s.Window.PeakBytes)
	}
	if !sawBacklog.Load() {
		t.Fatal("never saw a 10x backlog waiting in the stream")
	}
	info, _ := src.Consumer().Info(ctx)
	if info.NumAckPending > window {
		t.Fatalf("server ack pending %d > window", info.NumAckPending)
	}
	t.Logf("peak %d/%d msgs, %d/%d bytes", s.Window.Peak, window, s.Window.PeakBytes, bytesWin)
}

func TestSlowHandlerKeptAlive(t *testing.T) {
	ctx, js := setup(t, 2)
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "slow", AckWait: time.Second}, natsadapter.SourceOptions{PollWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var attempts []int
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "slow",
		Source:  src,
		Workers: 2,
		Handler: func(_ context.Context, m *consumer.Message) error {
			mu.Lock()
			attempts = append(attempts, m.Attempt)
			mu.Unlock()
			time.Sleep(2500 * time.Millisecond)
			return nil
		},
		Window: consumer.WindowPolicy{Messages: 4, Bytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, 15*time.Second, func() bool { return c.Stats()[0].Settled[consumer.OutcomeSucceeded] >= 2 }, nil)
	time.Sleep(300 * time.Millisecond)
	s := c.Stats()[0]
	mu.Lock()
	defer mu.Unlock()
	if len(attempts) != 2 || attempts[0] != 1 || attempts[1] != 1 || s.Fetched != 2 {
		t.Fatalf("redelivered: attempts %v fetched %d", attempts, s.Fetched)
	}
	if s.KeepAlives == 0 {
		t.Fatal("no keep-alives")
	}
	info, _ := src.Consumer().Info(ctx)
	if info.NumRedelivered != 0 || info.NumAckPending != 0 {
		t.Fatalf("redelivered %d, ack pending %d", info.NumRedelivered, info.NumAckPending)
	}
}

func TestDLQFailureKeepsOriginal(t *testing.T) {
	ctx, js := setup(t, 1)
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "dlqfail"}, natsadapter.SourceOptions{PollWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{Stream: "DEAD", SubjectPrefix: "dead"})
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctx, "DEAD"); err != nil { // every write now fails: no stream on the subject
		t.Fatal(err)
	}
	var runs, writes, maxAttempt atomic.Int64
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "dlqfail",
		Source:  src,
		Workers: 1,
		Retry:   consumer.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		Handler: func(_ context.Context, m *consumer.Message) error {
			runs.Add(1)
			return consumer.Permanent(errors.New("poison"))
		},
		Window: consumer.WindowPolicy{Messages: 4, Bytes: 1 << 20},
		DeadLetter: consumer.DeadLetterPolicy{Sink: dlq.SinkFunc(func(ctx context.Context, l *dlq.Letter) error {
			writes.Add(1)
			if int64(l.Attempts) > maxAttempt.Load() {
				maxAttempt.Store(int64(l.Attempts))
			}
			ctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancel()
			return sink.Write(ctx, l)
		})},
	})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, 15*time.Second, func() bool { return maxAttempt.Load() >= 3 }, nil)
	s := c.Stats()[0]
	if s.Settled[consumer.OutcomeDLQFailed] < 2 || s.Settled[consumer.OutcomeDeadLettered] != 0 {
		t.Fatalf("stats %+v", s)
	}
	// Its redeliveries are written to the sink again, never run again.
	if runs.Load() != 1 || writes.Load() < 3 {
		t.Fatalf("handler ran %d times, %d dead-letter writes: want 1 run, a write per delivery", runs.Load(), writes.Load())
	}
	info, err := src.Consumer().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.AckFloor.Stream != 0 {
		t.Fatalf("original was settled: ack floor %d", info.AckFloor.Stream)
	}
}

func TestOversizeMessageFetchedAlone(t *testing.T) {
	ctx, js := setup(t, 0)
	big := make([]byte, 4096)
	if _, err := js.Publish(ctx, "work.big", big); err != nil {
		t.Fatal(err)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, "WORK", jetstream.ConsumerConfig{Durable: "big", AckPolicy: jetstream.AckExplicitPolicy})
	if err != nil {
		t.Fatal(err)
	}
	src, err := natsadapter.NewSource(js, cons, natsadapter.SourceOptions{PollWait: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := src.Fetch(ctx, 10, 100)
	if err != nil || len(msgs) != 1 || len(msgs[0].Value) != 4096 {
		t.Fatalf("got %d msgs, err %v", len(msgs), err)
	}
	if err := sluicetest.Settle(ctx, msgs[0], consumer.Settlement{Op: consumer.SettleAck}); err != nil {
		t.Fatal(err)
	}
	// Nothing left: Fetch returns (nil, nil) within PollWait.
	start := time.Now()
	msgs, err = src.Fetch(ctx, 10, 100)
	if err != nil || len(msgs) != 0 || time.Since(start) > 3*time.Second {
		t.Fatalf("empty fetch: %d msgs, err %v, took %v", len(msgs), err, time.Since(start))
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := src.Fetch(cctx, 10, 100); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled fetch: %v", err)
	}
}

func TestNewSourceForRejectsSmallMaxAckPending(t *testing.T) {
	ctx, js := setup(t, 0)
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "small", MaxAckPending: 4}, natsadapter.SourceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = consumer.New(consumer.Options{}, consumer.Route{Name: "small", Source: src,
		Handler: func(context.Context, *consumer.Message) error { return nil },
		Window:  consumer.WindowPolicy{Messages: 8}})
	if !errors.Is(err, consumer.ErrInvalidOption) {
		t.Fatalf("MaxAckPending 4 under a window of 8: %v", err)
	}
}

func TestDeadLetterSinkDedupes(t *testing.T) {
	ctx, js := setup(t, 0)
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l := &dlq.Letter{Value: []byte("v"), Route: "r.1", Class: dlq.ClassPermanent, Err: "boom", Attempts: 2,
		Headers: map[string][]string{jetstream.MsgIDHeader: {"order-7"}},
		Origin:  dlq.Origin{Stream: "WORK", Sequence: 42, Partition: -1}}
	for range 3 {
		if err := sink.Write(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	st, err := js.Stream(ctx, natsadapter.DefaultDLQStream)
	if err != nil {
		t.Fatal(err)
	}
	if n := st.CachedInfo().State.Msgs; n != 1 {
		t.Fatalf("%d letters stored, want 1", n)
	}
	m, err := st.GetLastMsgForSubject(ctx, sink.Subject("r.1"))
	if err != nil {
		t.Fatal(err)
	}
	got, err := dlq.Decode(nil, m.Data, m.Header)
	if err != nil || got.Origin.Sequence != 42 || got.Attempts != 2 || got.Route != "r.1" {
		t.Fatalf("letter %+v, err %v", got, err)
	}
	// The producer's id is kept; the letter's own id is the DLQ dedup id.
	if id := m.Header.Get(natsadapter.HeaderOriginalMsgID); id != "order-7" {
		t.Fatalf("original msg id %q", id)
	}
	if id := m.Header.Get(jetstream.MsgIDHeader); id != natsadapter.DedupID(l) || id == "" {
		t.Fatalf("letter msg id %q", id)
	}
	if l.Headers[jetstream.MsgIDHeader][0] != "order-7" {
		t.Fatal("Write modified the letter's headers")
	}
}

func TestParseAckSubject(t *testing.T) {
	nc := natstest.JetStream(t)
	ctx := context.Background()
	if _, err := nc.CreateStream(ctx, jetstream.StreamConfig{Name: "META", Subjects: []string{"meta.>"}}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := nc.Publish(ctx, "meta.x", []byte("x")); err != nil {
			t.Fatal(err)
		}
	}
	src, err := natsadapter.NewSourceFor(ctx, nc, "META", jetstream.ConsumerConfig{Durable: "m"}, natsadapter.SourceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Fetch hands over what has arrived; the rest of the pull follows.
	var msgs []*consumer.Message
	for len(msgs) < 2 {
		got, err := src.Fetch(ctx, 10-len(msgs), 1<<20)
		if err != nil || len(got) == 0 {
			t.Fatalf("fetch: %d msgs, %v (have %d)", len(got), err, len(msgs))
		}
		msgs = append(msgs, got...)
	}
	// Our parse must agree with nats.go's own on a live ack subject.
	for i, m := range msgs {
		md, err := natsadapter.MetadataOf(m)
		if err != nil {
			t.Fatal(err)
		}
		if m.Origin.Sequence != md.Sequence.Stream || m.Attempt != int(md.NumDelivered) ||
			!m.PublishedAt.Equal(md.Timestamp) || m.Origin.Stream != md.Stream || m.Origin.Group != md.Consumer {
			t.Errorf("msg %d: parsed %+v/%d/%v, nats.go says %+v", i, m.Origin, m.Attempt, m.PublishedAt, md)
		}
		if m.Origin.Sequence != uint64(i+1) || m.Attempt != 1 || m.Topic != "meta.x" {
			t.Errorf("msg %d: seq %d attempt %d topic %q", i, m.Origin.Sequence, m.Attempt, m.Topic)
		}
		_ = sluicetest.Settle(ctx, m, consumer.Settlement{Op: consumer.SettleAck})
	}
}

// A batch the stream cannot fill is handed over at once, not after
// PollWait: the pull is no_wait with an expiry.
func TestPartialBatchNotHeldForPollWait(t *testing.T) {
	ctx, js := setup(t, 0)
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "lat"},
		natsadapter.SourceOptions{PollWait: 10 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	handled := make(chan time.Time, 16)
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "lat",
		Source:  src,
		Workers: 2,
		Handler: func(context.Context, *consumer.Message) error { handled <- time.Now(); return nil },
		Window:  consumer.WindowPolicy{Messages: 64, Bytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	defer func() {
		cancel()
		if err := <-errc; err != nil {
			t.Error(err)
		}
	}()
	for round := range 3 {
		start := time.Now()
		publish(t, ctx, js, 3) // far below the 64-message pull
		for range 3 {
			select {
			case at := <-handled:
				if d := at.Sub(start); d > 2*time.Second {
					t.Fatalf("round %d: handled after %v", round, d)
				}
			case <-time.After(5 * time.Second):
				t.Fatalf("round %d: not handled within 5s (PollWait is 10s)", round)
			}
		}
	}
}

func TestNewSourceChecksWrappedConsumer(t *testing.T) {
	ctx, js := setup(t, 0)
	cons, err := js.CreateOrUpdateConsumer(ctx, "WORK", jetstream.ConsumerConfig{Durable: "theirs", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: 8})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		window int
		ok     bool
	}{{64, false}, {8, true}} {
		src, err := natsadapter.NewSource(js, cons, natsadapter.SourceOptions{})
		if err != nil {
			t.Fatal(err)
		}
		_, err = src.Attach(consumer.RouteLimits{Route: "r", Messages: tc.window, Bytes: 1 << 20})
		if tc.ok != (err == nil) || err != nil && !errors.Is(err, consumer.ErrInvalidOption) {
			t.Fatalf("MaxAckPending 8, window %d: %v", tc.window, err)
		}
	}
	none, err := js.CreateOrUpdateConsumer(ctx, "WORK", jetstream.ConsumerConfig{Durable: "noack", AckPolicy: jetstream.AckNonePolicy})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := natsadapter.NewSource(js, none, natsadapter.SourceOptions{}); !errors.Is(err, consumer.ErrInvalidOption) {
		t.Fatalf("AckPolicy none: %v", err)
	}
}

func TestRouteRefusesMoreAttemptsThanMaxDeliver(t *testing.T) {
	ctx, js := setup(t, 0)
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "md", MaxDeliver: 2}, natsadapter.SourceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	_, err = consumer.New(consumer.Options{}, consumer.Route{
		Name:    "md",
		Source:  src,
		Workers: 1,
		Handler: func(context.Context, *consumer.Message) error { return nil },
		Window:  consumer.WindowPolicy{Messages: 8, Bytes: 1 << 20},
	}) // default MaxAttempts 3
	if !errors.Is(err, consumer.ErrInvalidOption) {
		t.Fatalf("MaxAttempts 3 with MaxDeliver 2: %v", err)
	}
}

// A user message with a header named Status and no payload looks like the
// server's pull status messages; it is still a delivery (it carries an ack
// subject) and reaches the handler.
func TestStatusHeaderMessageReachesHandler(t *testing.T) {
	ctx, js := setup(t, 0)
	for _, m := range []*nats.Msg{
		{Subject: "work.x", Data: []byte("a"), Header: nats.Header{"Id": {"0"}}},
		{Subject: "work.x", Header: nats.Header{"Id": {"1"}, "Status": {"404"}, "Description": {"No Messages"}}},
		{Subject: "work.x", Header: nats.Header{"Id": {"2"}, "Status": {"100"}}},
		{Subject: "work.x", Data: []byte("d"), Header: nats.Header{"Id": {"3"}}},
	} {
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "status"}, natsadapter.SourceOptions{PollWait: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	got := map[string]string{}
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "status",
		Source:  src,
		Workers: 1,
		Handler: func(_ context.Context, m *consumer.Message) error {
			mu.Lock()
			got[m.Headers.Get("Id")] = m.Headers.Get("Status")
			mu.Unlock()
			return nil
		},
		Window: consumer.WindowPolicy{Messages: 8, Bytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, 10*time.Second, func() bool { return c.Stats()[0].Settled[consumer.OutcomeSucceeded] >= 4 }, nil)
	mu.Lock()
	defer mu.Unlock()
	if len(got) != 4 || got["1"] != "404" || got["2"] != "100" {
		t.Fatalf("handled %v", got)
	}
	if s := c.Stats()[0]; s.Fetched != 4 {
		t.Fatalf("fetched %d", s.Fetched)
	}
	if n := src.Stats().StatusHeaderDeliveries; n != 2 {
		t.Fatalf("StatusHeaderDeliveries %d, want 2", n)
	}
	info, err := src.Consumer().Info(ctx)
	if err != nil || info.NumAckPending != 0 || info.NumPending != 0 {
		t.Fatalf("not drained: %+v, %v", info, err)
	}
}
