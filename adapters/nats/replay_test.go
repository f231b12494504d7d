package natsadapter_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/internal/natstest"
)

// replayRig is a server with an ORDERS stream (the replay target) and the
// dead-letter stream.
type replayRig struct {
	ctx  context.Context
	js   jetstream.JetStream
	sink *natsadapter.DeadLetterSink
	seq  atomic.Uint64 // origin sequences of seeded letters, unique per rig
}

func newReplayRig(t *testing.T) *replayRig {
	t.Helper()
	js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
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
func (r *replayRig) seed(t *testing.T, route string, n int, edit func(i int, l *dlq.Letter)) {
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

func (r *replayRig) count(t *testing.T, stream string) int {
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
func (r *replayRig) readAll(t *testing.T, stream string) []stored {
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

func (r *replayRig) source(t *testing.T, subject string) *natsadapter.LetterSource {
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

// TestReplayRateAndCompleteness replays 10k letters at 1k/s: every letter
// lands once in ORDERS, the DLQ is empty after, and each full 2 s window
// of the server's stored timestamps is within ±5% of 2000.
func TestReplayRateAndCompleteness(t *testing.T) {
	if testing.Short() {
		t.Skip("10 s of paced replay")
	}
	const n, perSecond = 10000, 1000
	r := newReplayRig(t)
	r.seed(t, "pay", n, nil)
	rp, err := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{">"}, Rate: perSecond, Deadline: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	src := r.source(t, "")
	probe := startStallProbe(t)
	start := time.Now()
	rep, err := rp.Run(r.ctx, src, natsadapter.NewReplayTarget(r.js))
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

	t0 := got[0].at
	for _, m := range got {
		if m.at.Before(t0) { // times are the server's; keep the earliest
			t0 = m.at
		}
	}
	const win = 2 * time.Second
	var last time.Time
	for _, m := range got {
		if m.at.After(last) {
			last = m.at
		}
	}
	windows := int(last.Sub(t0) / win)
	counts := make([]int, windows)
	for _, m := range got {
		if k := int(m.at.Sub(t0) / win); k < windows {
			counts[k]++
		}
	}
	want := perSecond * win.Seconds()
	worst, clean := 0.0, 0
	for k, c := range counts {
		from := t0.Add(time.Duration(k) * win)
		if d := probe.stalled(from.Add(-100*time.Millisecond), from.Add(win)); d > 0 {
			t.Logf("window %d: %d letters, not judged: the process stalled %v (machine overloaded)", k, c, d.Round(time.Millisecond))
			continue
		}
		clean++
		dev := (float64(c) - want) / want
		if math.Abs(dev) > math.Abs(worst) {
			worst = dev
		}
		if math.Abs(dev) > 0.05 {
			t.Errorf("window %d: %d letters, want %.0f ±5%%", k, c, want)
		}
	}
	if windows < 4 {
		t.Fatalf("only %d full 2 s windows in %v", windows, last.Sub(t0))
	}
	t.Logf("10k at 1k/s: %v overall (%.1f/s), 2 s windows %v, %d judged, worst deviation %+.2f%%, batch %d, jitter %v",
		rep.Elapsed.Round(time.Millisecond), rep.Rate, counts, clean, 100*worst, rp.Batch(), rp.Jitter())
	if clean < 2 {
		t.Skipf("machine too loaded to judge the pace: %d of %d windows stalled", windows-clean, windows)
	}
}

// stallProbe notices when the process does not get the CPU: a goroutine
// sleeps 2 ms in a loop and records every wake-up later than 40 ms. A pace
// measured across such a stall says something about the machine, not the
// replayer.
type stallProbe struct {
	mu     sync.Mutex
	stalls [][2]time.Time
	stop   chan struct{}
	done   chan struct{}
}

func startStallProbe(t *testing.T) *stallProbe {
	p := &stallProbe{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			start := time.Now()
			select {
			case <-p.stop:
				return
			case <-time.After(2 * time.Millisecond):
			}
			if end := time.Now(); end.Sub(start) > 40*time.Millisecond {
				p.mu.Lock()
				p.stalls = append(p.stalls, [2]time.Time{start, end})
				p.mu.Unlock()
			}
		}
	}()
	t.Cleanup(func() {
		close(p.stop)
		<-p.done
	})
	return p
}

// stalled returns the longest stall overlapping [from, to), 0 if none.
func (p *stallProbe) stalled(from, to time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	var longest time.Duration
	for _, s := range p.stalls {
		if s[0].Before(to) && s[1].After(from) {
			longest = max(longest, s[1].Sub(s[0]))
		}
	}
	return longest
}

// TestReplayCancelAndResume cancels a replay mid-way, then resumes it with a
// new source: every letter lands exactly once.
func TestReplayCancelAndResume(t *testing.T) {
	const n = 2000
	r := newReplayRig(t)
	r.seed(t, "pay", n, nil)
	rp, err := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{">"}, Rate: 2000})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(r.ctx, 400*time.Millisecond)
	first, err := rp.Run(ctx, r.source(t, ""), natsadapter.NewReplayTarget(r.js))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
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

	// A subject no stream captures: a clear error, nothing removed.
	r2 := newReplayRig(t)
	r2.seed(t, "pay", 3, func(i int, l *dlq.Letter) { l.Origin.Topic = "nowhere.x" })
	_, err = rp.Run(r2.ctx, r2.source(t, ""), natsadapter.NewReplayTarget(r2.js))
	if !errors.Is(err, dlq.ErrPublish) || r2.count(t, natsadapter.DefaultDLQStream) != 3 {
		t.Fatalf("no stream for subject: %v, %d left", err, r2.count(t, natsadapter.DefaultDLQStream))
	}
	t.Logf("no stream: %v", err)
}

// TestReplayLoopGuardEndToEnd runs a real sluice consumer whose handler
// always fails permanently: die → replay → die → replay → die, then the
// letter is parked instead of replayed a third time.
func TestReplayLoopGuardEndToEnd(t *testing.T) {
	r := newReplayRig(t)
	if _, err := r.js.Publish(r.ctx, "orders.new", []byte("doomed")); err != nil {
		t.Fatal(err)
	}
	src, err := natsadapter.NewSourceFor(r.ctx, r.js, "ORDERS", jetstream.ConsumerConfig{Durable: "orders"}, 8,
		natsadapter.SourceOptions{PollWait: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var handled atomic.Int64
	c, err := consumer.New(consumer.Options{ShutdownGrace: time.Second}, consumer.Route{
		Name: "orders", Source: src, Criticality: backpressure.Critical, Workers: 1, MaxInFlight: 8, MaxInFlightBytes: 1 << 20,
		DeadLetter: r.sink, Group: "orders",
		Handler: func(ctx context.Context, m *consumer.Message) error {
			handled.Add(1)
			return consumer.Permanent(errors.New("cannot parse"))
		},
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

// TestReplayersStartedTogetherSpread starts 8 replayers at once, each on
// its own DLQ subject, into one target: the busiest 100 ms bucket of the
// target's stored timestamps is at most twice the mean.
func TestReplayersStartedTogetherSpread(t *testing.T) {
	ratio, fine, buckets, stall := spreadRun(t, 0)
	t.Logf("8 replayers × 500 at 250/s, jitter on: busiest 100 ms bucket %.2f× the mean over %d buckets (10 ms buckets: %.2f×)",
		ratio, buckets, fine)
	if stall > 0 {
		// A stalled process releases its banked batches together: that
		// burst is the machine's, not the jitter's.
		t.Skipf("the process stalled %v during the run (machine overloaded): not judged", stall.Round(time.Millisecond))
	}
	if ratio > 2 {
		t.Fatalf("busiest 100 ms bucket is %.2f× the mean", ratio)
	}
	if testing.Short() {
		return
	}
	// The control, for the record: the same run without jitter.
	ratio, fine, buckets, _ = spreadRun(t, -1)
	t.Logf("8 replayers × 500 at 250/s, jitter off: busiest 100 ms bucket %.2f× the mean over %d buckets (10 ms buckets: %.2f×)",
		ratio, buckets, fine)
}

// spreadRun starts 8 replayers together, each on its own DLQ subject, into
// one target, and returns the busiest 100 ms and 10 ms buckets of the
// target's stored timestamps over their means.
func spreadRun(t *testing.T, jitter time.Duration) (ratio, fine float64, buckets int, stall time.Duration) {
	const replayers, each, perSecond = 8, 500, 250
	r := newReplayRig(t)
	for i := range replayers {
		r.seed(t, "r"+strconv.Itoa(i), each, nil)
	}
	rp, err := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{">"}, Rate: perSecond, Jitter: jitter})
	if err != nil {
		t.Fatal(err)
	}
	srcs := make([]*natsadapter.LetterSource, replayers)
	for i := range srcs {
		srcs[i] = r.source(t, r.sink.Subject("r"+strconv.Itoa(i)))
	}
	probe := startStallProbe(t)
	runStart := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, replayers)
	gate := make(chan struct{})
	for i := range replayers {
		wg.Go(func() {
			<-gate
			_, errs[i] = rp.Run(r.ctx, srcs[i], natsadapter.NewReplayTarget(r.js))
		})
	}
	close(gate)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	got := r.readAll(t, "ORDERS")
	if len(got) != replayers*each {
		t.Fatalf("landed %d of %d", len(got), replayers*each)
	}
	ratio, buckets = peakToMean(got, 100*time.Millisecond)
	fine, _ = peakToMean(got, 10*time.Millisecond)
	return ratio, fine, buckets, probe.stalled(runStart, time.Now())
}

// peakToMean buckets the stored times from the first one and returns the
// busiest full bucket over the mean of the full buckets.
func peakToMean(got []stored, width time.Duration) (float64, int) {
	t0, last := got[0].at, got[0].at
	for _, m := range got {
		if m.at.Before(t0) {
			t0 = m.at
		}
		if m.at.After(last) {
			last = m.at
		}
	}
	n := int(last.Sub(t0) / width)
	if n == 0 {
		return math.Inf(1), 0
	}
	counts := make([]int, n)
	total := 0
	for _, m := range got {
		if k := int(m.at.Sub(t0) / width); k < n {
			counts[k]++
			total++
		}
	}
	return float64(slices.Max(counts)) / (float64(total) / float64(n)), n
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
