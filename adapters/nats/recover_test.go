package natsadapter_test

import (
	"context"
	"errors"
	"strconv"
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
)

// letterBook reads the dead-letter stream as it grows: the class of the
// letter of each origin stream sequence.
type letterBook struct {
	js      jetstream.JetStream
	read    uint64
	classes map[uint64]string
	letters int
}

func (b *letterBook) update(t *testing.T, ctx context.Context) {
	t.Helper()
	st, err := b.js.Stream(ctx, natsadapter.DefaultDLQStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for ; b.read < info.State.LastSeq; b.read++ {
		l, _, err := natsadapter.GetLetter(ctx, b.js, "", b.read+1)
		if err != nil {
			t.Fatal(err)
		}
		b.letters++
		if prev, ok := b.classes[l.Origin.Sequence]; ok {
			t.Errorf("two letters for stream sequence %d (%s, then %s)", l.Origin.Sequence, prev, l.Class)
		}
		b.classes[l.Origin.Sequence] = l.Class
	}
}

// refusingSink is the dead-letter sink with a switch: while refusing, every
// write fails (the store is down).
type refusingSink struct {
	sink     dlq.Sink
	refusing atomic.Bool
	refused  atomic.Int64
}

func (s *refusingSink) Write(ctx context.Context, l *dlq.Letter) error {
	if s.refusing.Load() {
		s.refused.Add(1)
		return errors.New("dlq down")
	}
	return s.sink.Write(ctx, l)
}

// TestMaxDeliverShutdownLosesNothing is issue 24 item 9, first row: 3,000
// messages that each fail once, MaxDeliver 2 = MaxAttempts 2, and a
// graceful stop while hundreds are held. JetStream never delivers a
// message again after its second delivery, so what the stop left
// unsettled on its last delivery (240 lost before) must reach the
// dead-letter store: the restarted Source reads the consumer's
// MAX_DELIVERIES advisories from its stream and dead-letters those
// messages. Every message ends acked (its handler succeeded) or in the
// store.
func TestMaxDeliverShutdownLosesNothing(t *testing.T) {
	const n = 3000
	ctx, js := setup(t, n)
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	succeeded := map[uint64]bool{}
	route := func(src *natsadapter.Source) *consumer.Consumer {
		c, err := consumer.New(consumer.Options{ShutdownGrace: time.Second}, consumer.Route{
			Name:    "md",
			Source:  src,
			Workers: 16,
			Expiry:  expiry.Policy{IgnoreHeader: true},
			Retry:   consumer.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
			Handler: func(_ context.Context, m *consumer.Message) error {
				if m.Attempt == 1 {
					return errors.New("fails once")
				}
				time.Sleep(10 * time.Millisecond)
				mu.Lock()
				succeeded[m.Origin.Sequence] = true
				mu.Unlock()
				return nil
			},
			Window:     consumer.WindowPolicy{Messages: 512, Bytes: 8 << 20},
			DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cfg := jetstream.ConsumerConfig{Durable: "md", AckWait: 2 * time.Second, MaxDeliver: 2}
	opts := natsadapter.SourceOptions{PollWait: 100 * time.Millisecond, Recover: sink}

	// Run 1: stop while at least 200 messages are held.
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	c := route(src)
	var heldAtStop int
	runUntil(t, c, 30*time.Second, func() bool {
		mu.Lock()
		done := len(succeeded)
		mu.Unlock()
		heldAtStop = c.Stats()[0].Held
		return done >= 300 && heldAtStop >= 200
	}, nil)
	s1 := c.Stats()[0]
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("run 1: held %d at the stop; succeeded %d, returned %d, abandoned %d, dead-lettered %d",
		heldAtStop, s1.Settled[consumer.OutcomeSucceeded], s1.Settled[consumer.OutcomeReturned], s1.Settled[consumer.OutcomeAbandoned], s1.Settled[consumer.OutcomeDeadLettered])

	// Run 2: a restarted process on the same durable.
	src, err = natsadapter.NewSourceFor(ctx, js, "WORK", cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	c = route(src)
	book := &letterBook{js: js, classes: map[uint64]string{}}
	accounted := func() int {
		mu.Lock()
		defer mu.Unlock()
		k := 0
		for seq := uint64(1); seq <= n; seq++ {
			if _, ok := book.classes[seq]; ok || succeeded[seq] {
				k++
			}
		}
		return k
	}
	last := time.Now()
	runUntil(t, c, 60*time.Second, func() bool {
		if time.Since(last) < 200*time.Millisecond {
			return false
		}
		last = time.Now()
		book.update(t, ctx)
		return accounted() == n
	}, nil)
	st := src.Stats()
	both := 0
	for seq := range book.classes {
		if succeeded[seq] {
			both++
		}
	}
	t.Logf("after the restart: %d succeeded, %d letters (%d recovered from advisories; %d of them also succeeded), recovery failures %d",
		len(succeeded), book.letters, st.Recovered, both, st.RecoveryFailures)
	if heldAtStop < 200 {
		t.Fatalf("only %d held at the stop", heldAtStop)
	}
	if lost := n - accounted(); lost != 0 {
		t.Fatalf("%d messages neither succeeded nor dead-lettered", lost)
	}
	// Before the core dead-letters held last deliveries at shutdown
	// (class "shutdown", issue 24 item 9, the core's part), the messages
	// the stop abandoned reach the store only through recovery.
	if ab := s1.Settled[consumer.OutcomeAbandoned]; ab > 0 && st.Recovered == 0 {
		t.Fatalf("%d abandoned at the stop, none recovered", ab)
	}
	info, err := src.Consumer().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumPending != 0 || info.NumAckPending != 0 {
		t.Fatalf("durable: %d pending, %d ack pending", info.NumPending, info.NumAckPending)
	}
}

// TestMaxDeliverPoisonWithDLQDownRecovered is issue 24 item 9, second row:
// poison messages on their last delivery while the dead-letter store
// refuses every write are kept and retried until the graceful stop, then
// abandoned (9 lost before). The restarted Source retries their letters
// from the MAX_DELIVERIES advisories while the store still refuses, and
// once it is repaired every one of them is dead-lettered.
func TestMaxDeliverPoisonWithDLQDownRecovered(t *testing.T) {
	const n, every = 200, 10
	ctx, js := setup(t, n)
	real, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sink := &refusingSink{sink: real}
	sink.refusing.Store(true)
	poison := map[uint64]bool{}
	var mu sync.Mutex
	var good atomic.Int64
	route := func(src *natsadapter.Source) *consumer.Consumer {
		c, err := consumer.New(consumer.Options{ShutdownGrace: 500 * time.Millisecond}, consumer.Route{
			Name:    "poison",
			Source:  src,
			Workers: 24, // more than the poison: kept letters retried on workers (before the core's item 10) leave some free
			Expiry:  expiry.Policy{IgnoreHeader: true},
			Retry:   consumer.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: 10 * time.Millisecond},
			Handler: func(_ context.Context, m *consumer.Message) error {
				id, _ := strconv.Atoi(m.Headers.Get("Id"))
				if id%every == 0 {
					mu.Lock()
					poison[m.Origin.Sequence] = true
					mu.Unlock()
					return consumer.Permanent(errors.New("poison"))
				}
				good.Add(1)
				return nil
			},
			Window:     consumer.WindowPolicy{Messages: 64, Bytes: 1 << 20},
			DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	cfg := jetstream.ConsumerConfig{Durable: "poison", AckWait: time.Second, MaxDeliver: 2}
	opts := natsadapter.SourceOptions{PollWait: 100 * time.Millisecond, Recover: sink}
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	c := route(src)
	// Every poison message failed its write once (nak'd) and is held on
	// its last delivery, its write retried.
	runUntil(t, c, 30*time.Second, func() bool {
		s := c.Stats()[0]
		return good.Load() == n-n/every && s.Settled[consumer.OutcomeDLQFailed] >= n/every && s.Held == n/every
	}, nil)
	s1 := c.Stats()[0]
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	t.Logf("run 1 (store down): %d refused writes, abandoned %d, dead-lettered %d", sink.refused.Load(), s1.Settled[consumer.OutcomeAbandoned], s1.Settled[consumer.OutcomeDeadLettered])

	// Restarted with the store still down: recovery fails and retries;
	// once the store is repaired, every poison message gets its letter.
	src, err = natsadapter.NewSourceFor(ctx, js, "WORK", cfg, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	c = route(src)
	book := &letterBook{js: js, classes: map[uint64]string{}}
	runUntil(t, c, 30*time.Second, func() bool {
		if sink.refusing.Load() && src.Stats().RecoveryFailures > 0 {
			sink.refusing.Store(false) // the store is repaired
		}
		book.update(t, ctx)
		return len(book.classes) >= n/every
	}, nil)
	if len(poison) != n/every {
		t.Fatalf("%d poison messages ran, want %d", len(poison), n/every)
	}
	for seq := range poison {
		if _, ok := book.classes[seq]; !ok {
			t.Fatalf("poison message %d lost: no letter", seq)
		}
	}
	st := src.Stats()
	t.Logf("after the restart: %d letters, %d recovered from advisories (%d attempts failed while the store was down), classes %v", book.letters, st.Recovered, st.RecoveryFailures, book.classes)
	if st.Recovered == 0 {
		t.Fatal("nothing recovered from advisories")
	}
}

// TestMaxDeliverKillRecovered is issue 24 item 9, third row: a process
// killed while it runs messages on their last delivery settles nothing and
// writes nothing (its connection is gone). The advisories fire when the
// next process pulls, after AckWait; they land in the Source's advisory
// stream whether or not any process listens, and the restarted Source
// dead-letters every one of those messages. Both Sources run with the
// default recovery: into the route's own sink, nothing set on the Source.
func TestMaxDeliverKillRecovered(t *testing.T) {
	const n = 10
	_, url := natstest.Start(t)
	connect := func() (*nats.Conn, jetstream.JetStream) {
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatal(err)
		}
		return nc, js
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	ncA, jsA := connect()
	if _, err := jsA.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}}); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, jsA, n)
	cfg := jetstream.ConsumerConfig{Durable: "kill", AckWait: time.Second, MaxDeliver: 2}
	newRoute := func(js jetstream.JetStream, handler consumer.Handler) (*natsadapter.Source, *consumer.Consumer) {
		sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
		if err != nil {
			t.Fatal(err)
		}
		// No SourceOptions.Recover: by default the Source recovers into
		// the sink of the route that attaches it.
		src, err := natsadapter.NewSourceFor(ctx, js, "WORK", cfg, natsadapter.SourceOptions{PollWait: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		c, err := consumer.New(consumer.Options{ShutdownGrace: 200 * time.Millisecond}, consumer.Route{
			Name: "kill", Source: src, Workers: n, Handler: handler,
			Expiry:     expiry.Policy{IgnoreHeader: true},
			Retry:      consumer.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
			Window:     consumer.WindowPolicy{Messages: 2 * n, Bytes: 1 << 20},
			DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
		})
		if err != nil {
			t.Fatal(err)
		}
		return src, c
	}
	var last atomic.Int64
	srcA, cA := newRoute(jsA, func(ctx context.Context, m *consumer.Message) error {
		if m.Attempt == 1 {
			return errors.New("fails once")
		}
		last.Add(1)
		<-ctx.Done() // runs until the process dies
		return ctx.Err()
	})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cA.Run(runCtx) }()
	for last.Load() < n {
		if ctx.Err() != nil {
			t.Fatalf("%d of %d on their last delivery", last.Load(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	ncA.Close() // the kill: nothing more reaches the server
	stop()
	<-done
	_ = srcA.Close()

	_, jsB := connect()
	var ran atomic.Int64
	srcB, cB := newRoute(jsB, func(context.Context, *consumer.Message) error { ran.Add(1); return nil })
	defer srcB.Close()
	book := &letterBook{js: jsB, classes: map[uint64]string{}}
	runUntil(t, cB, 30*time.Second, func() bool {
		book.update(t, ctx)
		return len(book.classes) >= n
	}, nil)
	for seq := uint64(1); seq <= n; seq++ {
		if book.classes[seq] != natsadapter.ClassMaxDeliveries {
			t.Fatalf("message %d: letter class %q, want %q", seq, book.classes[seq], natsadapter.ClassMaxDeliveries)
		}
	}
	t.Logf("after the kill: %d letters, %d recovered, handler ran %d times on the restarted route", book.letters, srcB.Stats().Recovered, ran.Load())
	if ran.Load() != 0 {
		t.Fatalf("the restarted route ran %d messages JetStream had given up on", ran.Load())
	}
}

// TestRecoverySkipsAckedDedupesAndDropsGone feeds the advisory stream
// advisories by hand: one for a message whose Ack on its last delivery the
// Source saw confirmed (skipped: its handler succeeded), the same one twice
// for a message never settled (one letter: the writes share the
// Nats-Msg-Id), and one for a sequence the stream no longer has (dropped).
func TestRecoverySkipsAckedDedupesAndDropsGone(t *testing.T) {
	js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, subj := range []string{"work.x", "work.x", "work.other"} {
		if _, err := js.Publish(ctx, subj, []byte(subj)); err != nil {
			t.Fatal(err)
		}
	}
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "hand", FilterSubject: "work.x", MaxDeliver: 1},
		natsadapter.SourceOptions{PollWait: 100 * time.Millisecond, Recover: sink})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name: "hand", Source: src, Workers: 1,
		Handler:    func(context.Context, *consumer.Message) error { return nil },
		Expiry:     expiry.Policy{IgnoreHeader: true},
		Retry:      consumer.RetryPolicy{MaxAttempts: 1},
		Window:     consumer.WindowPolicy{Messages: 4, Bytes: 1 << 20},
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
	})
	if err != nil {
		t.Fatal(err)
	}
	advise := func(seq uint64) {
		b := `{"type":"io.nats.jetstream.advisory.v1.max_deliver","stream":"WORK","consumer":"hand","stream_seq":` + strconv.FormatUint(seq, 10) + `,"deliveries":1}`
		if err := js.Conn().Publish("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.WORK.hand", []byte(b)); err != nil {
			t.Fatal(err)
		}
	}
	published := false
	book := &letterBook{js: js, classes: map[uint64]string{}}
	runUntil(t, c, 20*time.Second, func() bool {
		if !published && c.Stats()[0].Settled[consumer.OutcomeSucceeded] == 2 {
			// Seq 1 was acked (and confirmed) on its last delivery; seq 3
			// was never delivered to this durable; seq 99 does not exist.
			advise(1)
			advise(3)
			advise(3)
			advise(99)
			published = true
		}
		st := src.Stats()
		return published && st.RecoverySkipped == 1 && st.Recovered == 2 && st.RecoveryGone == 1
	}, nil)
	book.update(t, ctx)
	st := src.Stats()
	t.Logf("skipped %d, recovered %d (writes), gone %d; letters %v", st.RecoverySkipped, st.Recovered, st.RecoveryGone, book.classes)
	if book.letters != 1 || book.classes[3] != natsadapter.ClassMaxDeliveries {
		t.Fatalf("%d letters %v, want one for sequence 3", book.letters, book.classes)
	}
}

// TestPoisonOnLastDeliveryWithDLQDownKeepsFlowing is issue 24 item 10 on
// NATS: with MaxDeliver, poison messages on their last delivery are kept
// while the dead-letter store refuses writes, and their writes retried.
// Three times as many as workers must not stop good traffic (1,317 of
// 5,820 good messages after 60 s before the core retried kept letters off
// the workers), and the Source must keep them alive on the server: each
// stays ack-pending, and JetStream gives up on none of them (no
// MAX_DELIVERIES advisory) though AckWait passes several times.
func TestPoisonOnLastDeliveryWithDLQDownKeepsFlowing(t *testing.T) {
	const n, every, workers = 3000, 100, 8 // 30 poison messages
	const ackWait = 2 * time.Second
	ctx, js := setup(t, n)
	real, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sink := &refusingSink{sink: real}
	sink.refusing.Store(true)
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "flow", AckWait: ackWait, MaxDeliver: 2},
		natsadapter.SourceOptions{PollWait: 100 * time.Millisecond, Recover: sink})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var good atomic.Int64
	c, err := consumer.New(consumer.Options{ShutdownGrace: 500 * time.Millisecond}, consumer.Route{
		Name: "flow", Source: src, Workers: workers,
		Expiry: expiry.Policy{IgnoreHeader: true},
		Retry:  consumer.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: 100 * time.Millisecond},
		Handler: func(_ context.Context, m *consumer.Message) error {
			id, _ := strconv.Atoi(m.Headers.Get("Id"))
			if id%every == 0 {
				return consumer.Permanent(errors.New("poison"))
			}
			time.Sleep(time.Millisecond)
			good.Add(1)
			return nil
		},
		Window:     consumer.WindowPolicy{Messages: 64, Bytes: 1 << 20},
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
	})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	var goodAt time.Duration
	var pending int
	runUntil(t, c, 60*time.Second, func() bool {
		if goodAt == 0 && good.Load() == n-n/every {
			goodAt = time.Since(start)
		}
		if goodAt == 0 || time.Since(start) < 3*ackWait {
			return false
		}
		info, err := src.Consumer().Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		pending = info.NumAckPending
		return true
	}, nil)
	adv, err := js.Stream(ctx, natsadapter.RecoveryStream("WORK", "flow"))
	if err != nil {
		t.Fatal(err)
	}
	ainfo, err := adv.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st := c.Stats()[0]
	t.Logf("%d good messages in %v (%.0f/s) with %d poison kept and the store down; %d refused writes; %d ack pending on the server after %v; %d advisories",
		n-n/every, goodAt.Round(time.Millisecond), float64(n-n/every)/goodAt.Seconds(), n/every, sink.refused.Load(), pending, 3*ackWait, ainfo.State.Msgs)
	if pending != n/every {
		t.Fatalf("%d messages ack pending on the server, want the %d kept poison messages", pending, n/every)
	}
	if ainfo.State.Msgs != 0 || src.Stats().RecoveryFailures != 0 {
		t.Fatalf("JetStream gave up on %d kept messages (keep-alive failed)", ainfo.State.Msgs)
	}
	if st.Settled[consumer.OutcomeDLQFailed] < n/every {
		t.Fatalf("only %d failed writes: the poison did not reach its last delivery", st.Settled[consumer.OutcomeDLQFailed])
	}
}

// TestRecoverNothingForEphemeral: an ephemeral consumer goes with its
// process (the next one delivers the stream again), so Recover makes no
// advisory stream for it.
func TestRecoverNothingForEphemeral(t *testing.T) {
	ctx, js := setup(t, 1)
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{MaxDeliver: 2},
		natsadapter.SourceOptions{PollWait: 100 * time.Millisecond, Recover: sink})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := src.Attach(consumer.RouteLimits{Route: "eph", Messages: 4, Bytes: 1 << 20, MaxAttempts: 2}); err != nil {
		t.Fatal(err)
	}
	msgs, err := src.Fetch(ctx, 1, 1<<20)
	if err != nil || len(msgs) != 1 {
		t.Fatalf("fetch: %d, %v", len(msgs), err)
	}
	name := natsadapter.RecoveryStream("WORK", src.Consumer().CachedInfo().Name)
	if _, err := js.Stream(ctx, name); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("advisory stream %s for an ephemeral: %v", name, err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
}

// TestRecoverSetupFailureDoesNotStopTheRoute: when the advisory stream
// cannot be made (here another stream already captures the subject; in
// production, no permission to create streams), Fetch reports it once as a
// fetch error and goes on pulling: the route runs its messages.
func TestRecoverSetupFailureDoesNotStopTheRoute(t *testing.T) {
	const n = 50
	ctx, js := setup(t, n)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SQUAT", Subjects: []string{"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.WORK.>"}}); err != nil {
		t.Fatal(err)
	}
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "squat", MaxDeliver: 2},
		natsadapter.SourceOptions{PollWait: 100 * time.Millisecond, Recover: sink})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var done atomic.Int64
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name: "squat", Source: src, Workers: 4,
		Handler:    func(context.Context, *consumer.Message) error { done.Add(1); return nil },
		Expiry:     expiry.Policy{IgnoreHeader: true},
		Retry:      consumer.RetryPolicy{MaxAttempts: 2},
		Window:     consumer.WindowPolicy{Messages: 16, Bytes: 1 << 20},
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
	})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, 30*time.Second, func() bool { return done.Load() == n }, nil)
	s := c.Stats()[0]
	t.Logf("%d messages run; fetch errors %d (last: %v)", done.Load(), s.Errors.Fetch, s.Errors.Last)
	if s.Errors.Fetch != 1 {
		t.Fatalf("%d fetch errors, want the one failed recovery start", s.Errors.Fetch)
	}
}

// TestRecoverDefaultsAndOff: by default a Source on a durable with
// MaxDeliver makes its advisory stream when the route that attaches it has
// a dead-letter sink; it makes none for a route without a sink, nor with
// NoRecover (even with Recover set).
func TestRecoverDefaultsAndOff(t *testing.T) {
	ctx, js := setup(t, 3)
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		durable    string
		opts       natsadapter.SourceOptions
		routeSink  dlq.Sink
		wantStream bool
	}{
		{"withsink", natsadapter.SourceOptions{}, sink, true},
		{"nosink", natsadapter.SourceOptions{}, nil, false},
		{"off", natsadapter.SourceOptions{NoRecover: true, Recover: sink}, sink, false},
	} {
		c.opts.PollWait = 100 * time.Millisecond
		src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: c.durable, MaxDeliver: 2}, c.opts)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := src.Attach(consumer.RouteLimits{Route: c.durable, Messages: 4, Bytes: 1 << 20, MaxAttempts: 2, DeadLetter: c.routeSink}); err != nil {
			t.Fatal(err)
		}
		if msgs, err := src.Fetch(ctx, 1, 1<<20); err != nil || len(msgs) != 1 {
			t.Fatalf("%s: fetch: %d, %v", c.durable, len(msgs), err)
		}
		_, err = js.Stream(ctx, natsadapter.RecoveryStream("WORK", c.durable))
		if got := err == nil; got != c.wantStream {
			t.Errorf("%s: advisory stream made: %v (%v), want %v", c.durable, got, err, c.wantStream)
		}
		if err := src.Close(); err != nil {
			t.Fatal(err)
		}
	}
}
