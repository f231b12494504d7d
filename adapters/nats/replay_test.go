package natsadapter_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"os"
	"slices"
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
	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
)

// replayRig is a server with an ORDERS stream (the replay target) and the
// dead-letter stream.
type replayRig struct {
	ctx  context.Context
	js   jetstream.JetStream
	sink *natsadapter.DeadLetterSink
	seq  atomic.Uint64 // origin sequences of seeded letters, unique per rig
}

func newReplayRig(t testing.TB) *replayRig {
	t.Helper()
	js := natstest.JetStream(t)
	// A bound for a stuck rig, not a pace: seeding and replaying 10k
	// letters ran past 90 s under -race -cpu 1 with a CPU hog.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &replayRig{ctx: ctx, js: js, sink: sink}
}

// seed writes n letters for route through the real sink, 32 at a time. The
// value of letter i is "<route>-<i>".
func (r *replayRig) seed(t testing.TB, route string, n int, edit func(i int, l *dlq.Letter)) {
	t.Helper()
	base := r.seq.Add(uint64(n)) - uint64(n)
	var wg sync.WaitGroup
	errs := make(chan error, 32)
	for w := range 32 {
		wg.Go(func() {
			for i := w; i < n; i += 32 {
				at := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC).Add(time.Duration(i) * time.Millisecond)
				l := &dlq.Letter{Value: []byte(route + "-" + strconv.Itoa(i)), Route: route,
					Headers: map[string][]string{"App": {"x"}, expiry.DefaultHeader: {"1"}},
					Err:     "boom", Class: dlq.ClassPermanent, Attempts: 1, FirstFailure: at, LastFailure: at,
					Origin: dlq.Origin{Topic: "orders." + route, Stream: "ORDERS", Sequence: base + uint64(i) + 1, Group: route, Partition: -1}}
				if edit != nil {
					edit(i, l)
				}
				if err := r.sink.Write(r.ctx, l); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

func (r *replayRig) count(t testing.TB, stream string) int {
	t.Helper()
	st, err := r.js.Stream(r.ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return int(info.State.Msgs)
}

type stored struct {
	value   string
	at      time.Time
	headers nats.Header
}

// readAll returns every message of stream, in order.
func (r *replayRig) readAll(t testing.TB, stream string) []stored {
	t.Helper()
	n := r.count(t, stream)
	cons, err := r.js.OrderedConsumer(r.ctx, stream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var out []stored
	for tries := 0; len(out) < n; tries++ {
		if tries > 100 {
			t.Fatalf("read %d of %d messages of %s", len(out), n, stream)
		}
		batch, err := cons.Fetch(min(n-len(out), 1000), jetstream.FetchMaxWait(2*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				t.Fatal(err)
			}
			out = append(out, stored{string(m.Data()), md.Timestamp, m.Headers()})
		}
	}
	return out
}

func (r *replayRig) source(t testing.TB, subject string) *natsadapter.LetterSource {
	t.Helper()
	src, err := natsadapter.NewLetterSource(r.ctx, r.js, natsadapter.LetterSourceOptions{Subject: subject})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close(context.Background()) })
	return src
}

// onceEach checks that got holds every want value exactly once and
// returns the number of duplicates.
func onceEach(t *testing.T, got []stored, want func(i int) string, n int) {
	t.Helper()
	seen := map[string]int{}
	for _, m := range got {
		seen[m.value]++
	}
	lost, dups := 0, 0
	for i := range n {
		switch c := seen[want(i)]; {
		case c == 0:
			lost++
		case c > 1:
			dups += c - 1
		}
	}
	if lost > 0 || dups > 0 || len(got) != n {
		t.Fatalf("target holds %d messages for %d letters: %d lost, %d duplicated", len(got), n, lost, dups)
	}
}

// TestReplayCompleteness replays 10k letters: every letter lands once in
// ORDERS with a fresh deadline, its replay count and its original headers,
// and the DLQ is empty after. The pace is claimed by the synctest tests in
// package dlq and measured on this broker by BenchmarkReplayPace.
func TestReplayCompleteness(t *testing.T) {
	const n = 10000
	r := newReplayRig(t)
	r.seed(t, "pay", n, nil)
	rp, err := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{"orders.>"}, Rate: 5000, Deadline: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	rep, err := rp.Run(r.ctx, r.source(t, ""), natsadapter.NewReplayTarget(r.js))
	if err != nil {
		t.Fatal(err)
	}
	if rep.Replayed != n || rep.Moved() != n {
		t.Fatalf("report %+v", rep)
	}
	if c := r.count(t, natsadapter.DefaultDLQStream); c != 0 {
		t.Fatalf("%d letters left in the DLQ", c)
	}
	got := r.readAll(t, "ORDERS")
	onceEach(t, got, func(i int) string { return "pay-" + strconv.Itoa(i) }, n)

	// Fresh deadline, replay count, original headers, no envelope.
	h := got[0].headers
	if h.Get("App") != "x" || h.Get(dlq.HeaderReplayCount) != "1" || h.Get(dlq.HeaderClass) != "" {
		t.Fatalf("republished headers %v", h)
	}
	dl, err := expiry.ParseDeadline(h.Get(expiry.DefaultHeader))
	if err != nil || dl.Before(start.Add(time.Minute)) {
		t.Fatalf("deadline %v (%v), want ≥ start+1m", dl, err)
	}
}

// TestReplayCancelAndResume cancels a replay mid-way, then resumes it with a
// new source: every letter lands exactly once.
func TestReplayCancelAndResume(t *testing.T) {
	const n = 2000
	r := newReplayRig(t)
	r.seed(t, "pay", n, nil)
	// Cancelled once 100 letters have moved, not after 400 ms of wall
	// time: a loaded machine may move none in that time, or all.
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	rp, err := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{">"}, Rate: 2000, Progress: func(p dlq.Progress) {
		if p.Moved() >= 100 {
			cancel()
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	first, err := rp.Run(ctx, r.source(t, ""), natsadapter.NewReplayTarget(r.js))
	cancel()
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled run: %v", err)
	}
	left := r.count(t, natsadapter.DefaultDLQStream)
	if first.Replayed == 0 || left == 0 || first.Replayed+left != n {
		t.Fatalf("after cancel: replayed %d, %d left in the DLQ, want a split of %d", first.Replayed, left, n)
	}
	second, err := rp.Run(r.ctx, r.source(t, ""), natsadapter.NewReplayTarget(r.js))
	if err != nil {
		t.Fatal(err)
	}
	if c := r.count(t, natsadapter.DefaultDLQStream); c != 0 {
		t.Fatalf("%d letters left after resume", c)
	}
	onceEach(t, r.readAll(t, "ORDERS"), func(i int) string { return "pay-" + strconv.Itoa(i) }, n)
	t.Logf("cancelled after %d, resumed %d", first.Replayed, second.Replayed)
}

// TestReplayTargetFailureKeepsLetter: a republish the target does not
// confirm leaves the letter in the DLQ, and the replay stops.
func TestReplayTargetFailureKeepsLetter(t *testing.T) {
	r := newReplayRig(t)
	r.seed(t, "pay", 50, nil)
	real := natsadapter.NewReplayTarget(r.js)
	var tries atomic.Int64
	target := dlq.TargetFunc(func(ctx context.Context, m *dlq.Outgoing) error {
		if string(m.Value) == "pay-7" {
			tries.Add(1)
			return errors.New("injected: broker refused")
		}
		return real.Publish(ctx, m)
	})
	rp, err := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{">"}, Rate: math.Inf(1), Burst: 10, Concurrency: 1, Attempts: 2})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := rp.Run(r.ctx, r.source(t, ""), target)
	if !errors.Is(err, dlq.ErrPublish) {
		t.Fatalf("run: %v", err)
	}
	if tries.Load() != 2 {
		t.Fatalf("publish of pay-7 tried %d times, want 2", tries.Load())
	}
	dlqLeft := r.readAll(t, natsadapter.DefaultDLQStream)
	landed := r.readAll(t, "ORDERS")
	if len(dlqLeft)+len(landed) != 50 || rep.Replayed != len(landed) {
		t.Fatalf("%d in DLQ + %d landed != 50 (report %+v)", len(dlqLeft), len(landed), rep)
	}
	if !slices.ContainsFunc(dlqLeft, func(s stored) bool { return s.value == "pay-7" }) ||
		slices.ContainsFunc(landed, func(s stored) bool { return s.value == "pay-7" }) {
		t.Fatal("pay-7 left the DLQ although its republish failed")
	}

}

// TestReplayRefusesCraftedDestinations (issue 12.12): anyone who can
// publish to sluice.dlq.> can craft a letter. One naming the JetStream
// purge API must not purge anything even with the widest allow-list; one
// with no origin and one whose origin no stream captures are parked with
// their reasons, and the run goes on to replay the rest.
func TestReplayRefusesCraftedDestinations(t *testing.T) {
	r := newReplayRig(t)
	if _, err := r.js.CreateStream(r.ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if _, err := r.js.Publish(r.ctx, "work.items", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	r.seed(t, "pay", 6, func(i int, l *dlq.Letter) {
		switch i {
		case 1:
			l.Origin.Topic = "$JS.API.STREAM.PURGE.WORK"
		case 2:
			l.Origin.Topic = ""
		case 3:
			l.Origin.Topic = "nowhere.x"
		case 4:
			l.Origin.Topic = "_INBOX.someone.1"
		}
	})
	// A letter written by hand, as an attacker would: just the headers.
	crafted := &nats.Msg{Subject: "sluice.dlq.evil", Data: []byte("{}"), Header: nats.Header{
		dlq.HeaderClass: {"permanent"}, dlq.HeaderError: {"x"}, dlq.HeaderOriginTopic: {"$JS.API.STREAM.PURGE.WORK"}}}
	if _, err := r.js.PublishMsg(r.ctx, crafted); err != nil {
		t.Fatal(err)
	}
	park, err := natsadapter.NewParkSink(r.ctx, r.js)
	if err != nil {
		t.Fatal(err)
	}
	rp, err := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{">"}, Rate: math.Inf(1), Park: park})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := rp.Run(r.ctx, r.source(t, ""), natsadapter.NewReplayTarget(r.js))
	if err != nil {
		t.Fatalf("the run stopped: %v (%+v)", err, rep)
	}
	if c := r.count(t, "WORK"); c != 5 {
		t.Fatalf("WORK holds %d messages after the replay, want 5: a letter purged it", c)
	}
	if rep.Replayed != 2 || rep.Refused != 5 || rep.Parked != 5 || r.count(t, natsadapter.DefaultDLQStream) != 0 {
		t.Fatalf("report %+v, %d left in the DLQ", rep, r.count(t, natsadapter.DefaultDLQStream))
	}
	parked := r.readAll(t, natsadapter.DefaultParkStream)
	reasons := map[string]bool{}
	for _, m := range parked {
		reasons[m.headers.Get(dlq.HeaderParkReason)] = true
	}
	for _, want := range []string{"server's APIs", "names no destination", "no stream captures", "_INBOX"} {
		if !slices.ContainsFunc(slices.Collect(maps.Keys(reasons)), func(r string) bool { return strings.Contains(r, want) }) {
			t.Errorf("no parked letter says %q; reasons %v", want, reasons)
		}
	}
}

// TestReplayLoopGuardEndToEnd runs a real sluice consumer whose handler
// always fails permanently: die → replay → die → replay → die, then the
// letter is parked instead of replayed a third time.
func TestReplayLoopGuardEndToEnd(t *testing.T) {
	r := newReplayRig(t)
	if _, err := r.js.Publish(r.ctx, "orders.new", []byte("doomed")); err != nil {
		t.Fatal(err)
	}
	src, err := natsadapter.NewSourceFor(r.ctx, r.js, "ORDERS", jetstream.ConsumerConfig{Durable: "orders"},
		natsadapter.SourceOptions{PollWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	c, err := consumer.New(consumer.Options{ShutdownGrace: time.Second}, consumer.Route{
		Name:    "orders",
		Source:  src,
		Workers: 1,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			handled.Add(1)
			return consumer.Permanent(errors.New("cannot parse"))
		},
		Window:     consumer.WindowPolicy{Messages: 8, Bytes: 1 << 20},
		Overload:   consumer.OverloadPolicy{Criticality: backpressure.Critical},
		DeadLetter: consumer.DeadLetterPolicy{Sink: r.sink},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(r.ctx)
	done := make(chan error, 1)
	go func() { done <- c.Run(runCtx) }()
	defer func() {
		stop()
		<-done
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !cond(); {
			if time.Now().After(deadline) {
				t.Fatalf("timed out waiting for %s", what)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	park, err := natsadapter.NewParkSink(r.ctx, r.js)
	if err != nil {
		t.Fatal(err)
	}
	rp, err := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{">"}, Rate: math.Inf(1), MaxReplays: 2, Park: park})
	if err != nil {
		t.Fatal(err)
	}
	for pass := range 3 {
		waitFor(fmt.Sprintf("dead letter %d", pass+1), func() bool { return r.count(t, natsadapter.DefaultDLQStream) == 1 })
		l, _, err := natsadapter.GetLetter(r.ctx, r.js, "", lastSeq(t, r, natsadapter.DefaultDLQStream))
		if err != nil {
			t.Fatal(err)
		}
		if l.Replays != pass {
			t.Fatalf("pass %d: letter says Replays=%d", pass, l.Replays)
		}
		rep, err := rp.Run(r.ctx, r.source(t, ""), natsadapter.NewReplayTarget(r.js))
		if err != nil {
			t.Fatal(err)
		}
		wantReplayed, wantParked := 1, 0
		if pass == 2 {
			wantReplayed, wantParked = 0, 1
		}
		if rep.Replayed != wantReplayed || rep.Parked != wantParked {
			t.Fatalf("pass %d: %+v", pass, rep)
		}
	}
	waitFor("the DLQ to empty", func() bool { return r.count(t, natsadapter.DefaultDLQStream) == 0 })
	parked := r.readAll(t, natsadapter.DefaultParkStream)
	if len(parked) != 1 || parked[0].value != "doomed" || parked[0].headers.Get(dlq.HeaderReplays) != "2" {
		t.Fatalf("parked %+v", parked)
	}
	time.Sleep(200 * time.Millisecond) // nothing else may arrive
	if h := handled.Load(); h != 3 || r.count(t, "ORDERS") != 3 {
		t.Fatalf("handled %d times, ORDERS holds %d; want 3 and 3 (original + 2 replays)", h, r.count(t, "ORDERS"))
	}
}

func lastSeq(t *testing.T, r *replayRig, stream string) uint64 {
	t.Helper()
	st, err := r.js.Stream(r.ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(r.ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// TestBacklogDrainMode moves a plain backlog stream (not dead letters) into
// a target subject with the same Replayer: paced, each message deleted from
// the backlog after its republish, producer ids kept.
func TestBacklogDrainMode(t *testing.T) {
	r := newReplayRig(t)
	if _, err := r.js.CreateStream(r.ctx, jetstream.StreamConfig{Name: "BACKLOG", Subjects: []string{"backlog.>"}}); err != nil {
		t.Fatal(err)
	}
	const n = 300
	for i := range n {
		msg := &nats.Msg{Subject: "backlog.orders", Data: []byte("b-" + strconv.Itoa(i)), Header: nats.Header{"App": {"y"}}}
		if _, err := r.js.PublishMsg(r.ctx, msg, jetstream.WithMsgID("order-"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	src, err := natsadapter.NewLetterSource(r.ctx, r.js, natsadapter.LetterSourceOptions{Stream: "BACKLOG", Backlog: true})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close(context.Background())
	rp, err := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{">"}, Rate: 1000, Topic: "orders.drained"})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := rp.Run(r.ctx, src, natsadapter.NewReplayTarget(r.js))
	if err != nil || rep.Replayed != n {
		t.Fatalf("%v %+v", err, rep)
	}
	if c := r.count(t, "BACKLOG"); c != 0 {
		t.Fatalf("%d left in the backlog", c)
	}
	got := r.readAll(t, "ORDERS")
	onceEach(t, got, func(i int) string { return "b-" + strconv.Itoa(i) }, n)
	i := slices.IndexFunc(got, func(s stored) bool { return s.value == "b-0" })
	if h := got[i].headers; h.Get(jetstream.MsgIDHeader) != "order-0" || h.Get("App") != "y" || h.Get(dlq.HeaderReplayCount) != "1" {
		t.Fatalf("headers %v", h)
	}
	if rep.Elapsed < 200*time.Millisecond {
		t.Fatalf("300 at 1000/s took %v: not paced", rep.Elapsed)
	}
}

// Replaying the dead-letter stream back into the origin at 500 letters/s,
// with a fresh 5-minute deadline and parking after 3 replays.
func ExampleNewLetterSource() {
	dir, _ := os.MkdirTemp("", "sluice-replay-example")
	defer os.RemoveAll(dir)
	srv, err := natstest.Run(dir)
	if err != nil {
		panic(err)
	}
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	_, _ = js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	sink, _ := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{}) // what the consumer writes to
	for i := range 20 {
		_ = sink.Write(ctx, &dlq.Letter{Value: []byte(strconv.Itoa(i)), Class: dlq.ClassPermanent, Err: "bad", Route: "orders",
			Origin: dlq.Origin{Topic: "orders.new", Stream: "ORDERS", Sequence: uint64(i + 1), Partition: -1}})
	}

	src, err := natsadapter.NewLetterSource(ctx, js, natsadapter.LetterSourceOptions{}) // SLUICE_DLQ, every subject
	if err != nil {
		panic(err)
	}
	defer src.Close(ctx)
	park, _ := natsadapter.NewParkSink(ctx, js)
	r, _ := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{"orders.>"}, Rate: 500, Deadline: 5 * time.Minute, MaxReplays: 3, Park: park})
	rep, err := r.Run(ctx, src, natsadapter.NewReplayTarget(js))
	fmt.Println(rep.Replayed, "replayed,", rep.Parked, "parked, error:", err)
	st, _ := js.Stream(ctx, natsadapter.DefaultDLQStream)
	info, _ := st.Info(ctx)
	fmt.Println(info.State.Msgs, "letters left")
	// Output:
	// 20 replayed, 0 parked, error: <nil>
	// 0 letters left
}
