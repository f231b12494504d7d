package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

func route(name string, src consumer.Source, h consumer.Handler) consumer.Route {
	return consumer.Route{
		Name:    name,
		Source:  src,
		Handler: h,
		Workers: 2,
		Retry:   consumer.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		Window:  consumer.WindowPolicy{Messages: 3, Bytes: 1 << 20},
	}
}

// runObserver reports each handler run's outcome on done once the route has
// dealt with its result: a test's way to know a (stuck) worker is through.
type runObserver struct{ done chan consumer.Outcome }

func (o *runObserver) ObserveRoute(consumer.RouteInfo, func() consumer.RouteStats) consumer.RouteObserver {
	return o
}
func (o *runObserver) HandlerDone(out consumer.Outcome, _ time.Duration) { o.done <- out }

// start runs c in the background and returns a stop func that cancels and
// returns Run's error.
func start(t *testing.T, c *consumer.Consumer) func() error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	var once sync.Once
	var err error
	stop := func() error {
		once.Do(func() { cancel(); err = <-errc })
		return err
	}
	t.Cleanup(func() { _ = stop() })
	return stop
}

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func settledTotal(s consumer.RouteStats) uint64 {
	var n uint64
	for _, v := range s.Settled {
		n += v
	}
	return n
}

func TestNewValidates(t *testing.T) {
	src := sluicetest.NewSource()
	ok := func(context.Context, *consumer.Message) error { return nil }
	base := route("r", src, ok)
	cases := map[string]func(r *consumer.Route){
		"negative workers":  func(r *consumer.Route) { r.Workers = -1 },
		"huge workers":      func(r *consumer.Route) { r.Workers = 1 << 40 },
		"negative window":   func(r *consumer.Route) { r.Window.Messages = -1 },
		"huge window":       func(r *consumer.Route) { r.Window.Messages = 1 << 26 },
		"negative bytes":    func(r *consumer.Route) { r.Window.Bytes = -1 },
		"negative delay":    func(r *consumer.Route) { r.Retry.BaseDelay = -time.Second },
		"attempts too many": func(r *consumer.Route) { r.Retry.MaxAttempts = 5000 },
		"no handler":        func(r *consumer.Route) { r.Handler = nil },
		"no name":           func(r *consumer.Route) { r.Name = "" },
		"bad expiry":        func(r *consumer.Route) { r.Expiry.MaxAge = -time.Second },
	}
	for name, mut := range cases {
		r := base
		mut(&r)
		if _, err := consumer.New(consumer.Options{}, r); !errors.Is(err, consumer.ErrInvalidOption) {
			t.Errorf("%s: err = %v, want ErrInvalidOption", name, err)
		}
	}
	if _, err := consumer.New(consumer.Options{}, base, base); !errors.Is(err, consumer.ErrInvalidOption) {
		t.Error("duplicate route names accepted")
	}
	if _, err := consumer.New(consumer.Options{ShutdownGrace: -1}, base); !errors.Is(err, consumer.ErrInvalidOption) {
		t.Error("negative grace accepted")
	}
}

// The pull asks only for what the window has free, and in-flight never
// exceeds the window while a backlog waits in the source.
func TestPullNeverExceedsWindow(t *testing.T) {
	src := sluicetest.NewSource()
	for i := range 200 {
		src.Publish(strconv.Itoa(i), make([]byte, 100), nil, time.Time{})
	}
	var running, peak atomic.Int32
	h := func(ctx context.Context, m *consumer.Message) error {
		n := running.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(200 * time.Microsecond)
		running.Add(-1)
		return nil
	}
	r := route("r", src, h)
	r.Workers, r.Window.Messages, r.Window.Bytes = 4, 10, 650 // bytes bind first: 6 × ~103 B
	c, err := consumer.New(consumer.Options{}, r)
	if err != nil {
		t.Fatal(err)
	}
	stop := start(t, c)
	eventually(t, "all succeeded", func() bool { return c.Stats()[0].Settled[consumer.OutcomeSucceeded] == 200 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	s := c.Stats()[0]
	if s.Window.Peak > 10 || s.Window.PeakBytes > 650 {
		t.Fatalf("peak %d msgs / %d bytes over window 10 / 650", s.Window.Peak, s.Window.PeakBytes)
	}
	for _, a := range src.Asks() {
		if a.Messages > 10 || a.Bytes > 650 || a.Messages <= 0 || a.Bytes <= 0 {
			t.Fatalf("fetch asked for %+v, beyond the window", a)
		}
	}
	if s.Window.Blocked <= 0 {
		t.Fatal("no time recorded blocked on the window")
	}
	checkLedger(t, src, 200)
}

// The core port of the admission scenario: 2 workers, window 3; failing,
// panicking and shutdown paths all return their slot.
func TestEverySettlementReturnsItsSlot(t *testing.T) {
	src := sluicetest.NewSource()
	gate := make(chan struct{})
	var calls atomic.Int32
	h := func(ctx context.Context, m *consumer.Message) error {
		calls.Add(1)
		key := string(m.Key)
		if strings.HasPrefix(key, "block") {
			key = "block"
		}
		switch key {
		case "fail":
			return errors.New("boom")
		case "panic":
			panic("handler bug")
		case "block":
			select {
			case <-gate:
			case <-ctx.Done():
			}
			return ctx.Err()
		}
		return nil
	}
	r := route("r", src, h)
	r.Retry.MaxAttempts = 1
	c, _ := consumer.New(consumer.Options{ShutdownGrace: 50 * time.Millisecond}, r)
	stop := start(t, c)
	for _, id := range []string{"fail", "panic", "ok"} {
		src.Publish(id, nil, nil, time.Time{})
	}
	eventually(t, "three settled", func() bool { return settledTotal(c.Stats()[0]) == 3 })
	s := c.Stats()[0]
	if s.Held != 0 || s.Errors.Panics != 1 || s.Settled[consumer.OutcomeTerminated] != 2 || s.Settled[consumer.OutcomeSucceeded] != 1 {
		t.Fatalf("stats %+v", s)
	}
	// Three blocking handlers fill the window (2 running + 1 queued).
	for i := range 3 {
		src.Publish(fmt.Sprintf("block-%d", i), nil, nil, time.Time{})
	}
	eventually(t, "window full", func() bool { return c.Stats()[0].Held == 3 })
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	s = c.Stats()[0]
	if s.Held != 0 {
		t.Fatalf("in flight after shutdown: %d", s.Held)
	}
	if s.Fetched != settledTotal(s) {
		t.Fatalf("ledger: fetched %d, settled %d", s.Fetched, settledTotal(s))
	}
}

// At shutdown, a message that has not started is returned (nak'd), and the
// message of a handler that ignores cancellation past the grace is left
// unsettled (abandoned): settling it would let another consumer run it
// while it still runs here. When the stuck handler finally returns, its
// result is ignored.
func TestShutdownReturnsQueuedAndAbandonsStuck(t *testing.T) {
	src := sluicetest.NewSource()
	release := make(chan struct{})
	var returned sync.WaitGroup
	var started atomic.Int32
	h := func(ctx context.Context, m *consumer.Message) error {
		defer returned.Done()
		started.Add(1)
		<-release // ignores ctx: a stuck handler
		return nil
	}
	r := route("r", src, h) // 2 workers, window 3
	runs := &runObserver{done: make(chan consumer.Outcome, 2)}
	c, _ := consumer.New(consumer.Options{ShutdownGrace: 20 * time.Millisecond, Observer: runs}, r)
	returned.Add(2)
	stop := start(t, c)
	for i := range 5 {
		src.Publish(strconv.Itoa(i), nil, nil, time.Time{})
	}
	// Both handlers running, not only the window full: a message still
	// queued at the stop is returned, not stuck (a CI failure).
	eventually(t, "window full, both handlers running", func() bool { return c.Stats()[0].Held == 3 && started.Load() == 2 })
	err := stop()
	if !errors.Is(err, consumer.ErrStuckHandlers) {
		t.Fatalf("Run = %v, want ErrStuckHandlers", err)
	}
	s := c.Stats()[0]
	if s.Settled[consumer.OutcomeAbandoned] != 2 || s.Settled[consumer.OutcomeReturned] != 1 || s.Held != 0 {
		t.Fatalf("abandoned %d, returned %d, held %d", s.Settled[consumer.OutcomeAbandoned], s.Settled[consumer.OutcomeReturned], s.Held)
	}
	close(release)
	returned.Wait()
	<-runs.done // the Observer hears of each run once finish has dealt with it
	<-runs.done
	if after := c.Stats()[0]; after.Settled != s.Settled {
		t.Fatalf("a stuck handler's late result was counted: %v, then %v", s.Settled, after.Settled)
	}
	ledger, violations := src.Ledger()
	if len(violations) > 0 {
		t.Fatalf("violations: %v", violations)
	}
	pending := 0
	for _, rec := range ledger {
		if rec.Pending {
			pending++ // abandoned: the broker redelivers it after its ack deadline
		}
		if rec.Acks+rec.Terms > 0 {
			t.Fatalf("a message was settled for good at shutdown: %+v", rec)
		}
	}
	if pending != 2 {
		t.Fatalf("%d messages left to the broker, want the 2 stuck ones", pending)
	}
}

func TestExpiredNeverReachesHandler(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	src := sluicetest.NewSource()
	var ran sync.Map
	h := func(ctx context.Context, m *consumer.Message) error {
		ran.Store(string(m.Key), true)
		if _, ok := ctx.Deadline(); !ok {
			return errors.New("handler ctx has no deadline")
		}
		return nil
	}
	r := route("r", src, h)
	r.Expiry = expiry.Policy{MaxAge: time.Minute, Skew: time.Second}
	c, _ := consumer.New(consumer.Options{Clock: clock}, r)
	now := clock.Now()
	hdr := func(d time.Time) consumer.Headers {
		return consumer.Headers{expiry.DefaultHeader: {expiry.FormatDeadline(d)}}
	}
	src.Publish("dead-header", nil, hdr(now.Add(-2*time.Second)), now)
	src.Publish("within-skew", nil, hdr(now.Add(-500*time.Millisecond)), now)
	src.Publish("old", nil, nil, now.Add(-2*time.Minute))
	src.Publish("fresh", nil, hdr(now.Add(time.Hour)), now)
	src.Publish("malformed", nil, consumer.Headers{expiry.DefaultHeader: {"soon"}}, now)
	stop := start(t, c)
	eventually(t, "all settled", func() bool { return settledTotal(c.Stats()[0]) == 5 })
	_ = stop()
	for _, id := range []string{"dead-header", "old"} {
		if _, ok := ran.Load(id); ok {
			t.Errorf("expired %s reached the handler", id)
		}
	}
	for _, id := range []string{"within-skew", "fresh", "malformed"} {
		if _, ok := ran.Load(id); !ok {
			t.Errorf("%s did not run", id)
		}
	}
	s := c.Stats()[0]
	if s.Settled[consumer.OutcomeExpired] != 2 || s.Errors.MalformedDeadlines != 1 || s.Settled[consumer.OutcomeSucceeded] != 3 {
		t.Fatalf("stats: expired %d malformed %d succeeded %d", s.Settled[consumer.OutcomeExpired], s.Errors.MalformedDeadlines, s.Settled[consumer.OutcomeSucceeded])
	}
}

// A message that is fine at fetch but expires while queued is discarded
// right before the handler.
func TestExpiresWhileQueued(t *testing.T) {
	clock := &fakeClock{now: time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)}
	src := sluicetest.NewSource()
	gate := make(chan struct{})
	var ran atomic.Int32
	h := func(ctx context.Context, m *consumer.Message) error {
		ran.Add(1)
		if string(m.Key) == "first" {
			<-gate
		}
		return nil
	}
	r := route("r", src, h)
	r.Workers = 1
	r.Expiry = expiry.Policy{}
	c, _ := consumer.New(consumer.Options{Clock: clock}, r)
	now := clock.Now()
	src.Publish("first", nil, nil, now)
	src.Publish("second", nil, consumer.Headers{expiry.DefaultHeader: {expiry.FormatDeadline(now.Add(time.Second))}}, now)
	stop := start(t, c)
	eventually(t, "both fetched", func() bool { return c.Stats()[0].Fetched == 2 })
	clock.Advance(2 * time.Second)
	close(gate)
	eventually(t, "settled", func() bool { return settledTotal(c.Stats()[0]) == 2 })
	_ = stop()
	if ran.Load() != 1 || c.Stats()[0].Settled[consumer.OutcomeExpired] != 1 {
		t.Fatalf("ran %d, expired %d", ran.Load(), c.Stats()[0].Settled[consumer.OutcomeExpired])
	}
}

func TestRetriesThenDeadLetter(t *testing.T) {
	src := sluicetest.NewSource()
	var letters []*dlq.Letter
	var mu sync.Mutex
	sink := dlq.SinkFunc(func(ctx context.Context, l *dlq.Letter) error {
		mu.Lock()
		letters = append(letters, l)
		mu.Unlock()
		return nil
	})
	attempts := map[string]int{}
	h := func(ctx context.Context, m *consumer.Message) error {
		mu.Lock()
		attempts[string(m.Key)]++
		mu.Unlock()
		if string(m.Key) == "poison" {
			return consumer.Permanent(errors.New("cannot parse"))
		}
		return errors.New("downstream 503")
	}
	r := route("r", src, h)
	r.DeadLetter.Sink = sink
	r.Retry.MaxAttempts = 3
	c, _ := consumer.New(consumer.Options{}, r)
	src.Publish("flaky", []byte("v"), consumer.Headers{"X-App": {"1"}}, time.Time{})
	src.Publish("poison", []byte("p"), nil, time.Time{})
	stop := start(t, c)
	eventually(t, "dead letters", func() bool { return c.Stats()[0].Settled[consumer.OutcomeDeadLettered] == 2 })
	_ = stop()
	mu.Lock()
	defer mu.Unlock()
	if attempts["flaky"] != 3 || attempts["poison"] != 1 {
		t.Fatalf("attempts %v, want flaky 3, poison 1", attempts)
	}
	byKey := map[string]*dlq.Letter{}
	for _, l := range letters {
		byKey[string(l.Key)] = l
	}
	if l := byKey["flaky"]; l == nil || l.Class != dlq.ClassExhausted || l.Attempts != 3 || l.Route != "r" ||
		l.Headers["X-App"][0] != "1" || l.FirstFailure.After(l.LastFailure) {
		t.Fatalf("flaky letter %+v", l)
	}
	if l := byKey["poison"]; l == nil || l.Class != dlq.ClassPermanent {
		t.Fatalf("poison letter %+v", l)
	}
	if s := c.Stats()[0]; s.Settled[consumer.OutcomeRetried] != 2 {
		t.Fatalf("retried %d, want 2", s.Settled[consumer.OutcomeRetried])
	}
	ledger, _ := src.Ledger()
	if ledger["flaky"].Terms != 1 || ledger["flaky"].Naks != 2 || ledger["flaky"].Acks != 0 {
		t.Fatalf("flaky ledger %+v", ledger["flaky"])
	}
}

// A failing DLQ write naks the original: it is redelivered, never lost.
func TestDeadLetterFailureNaks(t *testing.T) {
	src := sluicetest.NewSource()
	var fail atomic.Bool
	fail.Store(true)
	var stored atomic.Int32
	sink := dlq.SinkFunc(func(ctx context.Context, l *dlq.Letter) error {
		if fail.Load() {
			return errors.New("dlq unavailable")
		}
		stored.Add(1)
		return nil
	})
	h := func(ctx context.Context, m *consumer.Message) error { return consumer.Permanent(errors.New("bad")) }
	r := route("r", src, h)
	r.DeadLetter.Sink = sink
	c, _ := consumer.New(consumer.Options{}, r)
	src.Publish("x", nil, nil, time.Time{})
	stop := start(t, c)
	eventually(t, "dlq failures", func() bool { return c.Stats()[0].Settled[consumer.OutcomeDLQFailed] >= 2 })
	if led, _ := src.Ledger(); led["x"].Terms != 0 || led["x"].Acks != 0 {
		t.Fatalf("original settled while DLQ failing: %+v", led["x"])
	}
	fail.Store(false)
	eventually(t, "dead-lettered", func() bool { return stored.Load() == 1 })
	_ = stop()
	if led, _ := src.Ledger(); led["x"].Terms != 1 {
		t.Fatalf("ledger %+v", led["x"])
	}
}

func TestOverloadedIsNotRetriedInProcess(t *testing.T) {
	src := sluicetest.NewSource()
	var calls atomic.Int32
	h := func(ctx context.Context, m *consumer.Message) error {
		if calls.Add(1) == 1 {
			return backpressure.Overloaded(errors.New("downstream shedding"))
		}
		return nil
	}
	c, _ := consumer.New(consumer.Options{}, route("r", src, h))
	src.Publish("x", nil, nil, time.Time{})
	stop := start(t, c)
	eventually(t, "success", func() bool { return c.Stats()[0].Settled[consumer.OutcomeSucceeded] == 1 })
	_ = stop()
	s := c.Stats()[0]
	if s.Settled[consumer.OutcomeOverloaded] != 1 || s.Settled[consumer.OutcomeRetried] != 0 {
		t.Fatalf("overloaded %d retried %d", s.Settled[consumer.OutcomeOverloaded], s.Settled[consumer.OutcomeRetried])
	}
	if !backpressure.IsOverloaded(backpressure.Overloaded(nil)) || backpressure.IsOverloaded(errors.New("x")) {
		t.Fatal("IsOverloaded")
	}
}

func TestOversizeAdmittedAloneOrDeadLettered(t *testing.T) {
	for _, policy := range []consumer.OversizeAction{consumer.OversizeAdmitAlone, consumer.OversizeDeadLetter} {
		src := sluicetest.NewSource()
		var ranBig atomic.Bool
		h := func(ctx context.Context, m *consumer.Message) error {
			if string(m.Key) == "big" {
				ranBig.Store(true)
			}
			return nil
		}
		r := route("r", src, h)
		r.Window.Bytes = 1000
		r.DeadLetter.OnOversize = policy
		var letters atomic.Int32
		r.DeadLetter.Sink = dlq.SinkFunc(func(context.Context, *dlq.Letter) error { letters.Add(1); return nil })
		c, _ := consumer.New(consumer.Options{}, r)
		src.Publish("a", make([]byte, 100), nil, time.Time{})
		src.PublishSized("big", make([]byte, 10), nil, time.Time{}, 5000)
		src.Publish("b", make([]byte, 100), nil, time.Time{})
		stop := start(t, c)
		eventually(t, "settled", func() bool { return settledTotal(c.Stats()[0]) == 3 })
		_ = stop()
		if policy == consumer.OversizeAdmitAlone && (!ranBig.Load() || letters.Load() != 0) {
			t.Fatalf("admit alone: ran %v letters %d", ranBig.Load(), letters.Load())
		}
		if policy == consumer.OversizeDeadLetter && (ranBig.Load() || letters.Load() != 1) {
			t.Fatalf("dead letter: ran %v letters %d", ranBig.Load(), letters.Load())
		}
	}
}

// Route "report" with a handler that blocks forever does not delay
// "critical": separate windows and workers. In fake time: critical's 500
// messages take no fake time at all unless something waits on a timer
// behind the stuck route (a wall-clock bound judged the machine's load).
func TestIsolationBetweenRoutes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		critSrc, repSrc := sluicetest.NewSource(), sluicetest.NewSource()
		stuck := make(chan struct{})
		defer close(stuck)
		report := route("report", repSrc, func(ctx context.Context, m *consumer.Message) error {
			select {
			case <-stuck:
			case <-ctx.Done():
			}
			return nil
		})
		crit := route("critical", critSrc, func(ctx context.Context, m *consumer.Message) error { return nil })
		crit.Overload.Criticality = backpressure.Critical
		c, _ := consumer.New(consumer.Options{ShutdownGrace: 10 * time.Millisecond}, crit, report)
		for i := range 50 {
			repSrc.Publish(strconv.Itoa(i), nil, nil, time.Time{})
		}
		stop := start(t, c)
		eventually(t, "report window full", func() bool { return c.Stats()[1].Held == 3 })
		begin := time.Now()
		for i := range 500 {
			critSrc.Publish(strconv.Itoa(i), nil, nil, time.Time{})
		}
		eventually(t, "critical done", func() bool { return c.Stats()[0].Settled[consumer.OutcomeSucceeded] == 500 })
		d := time.Since(begin)
		t.Logf("critical: 500 settled in %v of fake time", d)
		if d > time.Second {
			t.Fatalf("critical took %v of fake time behind a stuck report route", d)
		}
		_ = stop()
	})
}

// Over randomized runs every fetched message ends in exactly one terminal
// state and the window returns to zero.
func TestLedgerProperty(t *testing.T) {
	for seed := range uint64(5) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 42))
			src := sluicetest.NewSource()
			const n = 2000
			for i := range n {
				src.Publish(strconv.Itoa(i), make([]byte, rng.IntN(200)), nil, time.Time{})
			}
			var mu sync.Mutex
			h := func(ctx context.Context, m *consumer.Message) error {
				mu.Lock()
				x := rng.IntN(100)
				mu.Unlock()
				switch {
				case x < 5:
					panic("random panic")
				case x < 15:
					return errors.New("retryable")
				case x < 18:
					return consumer.Permanent(errors.New("poison"))
				case x < 20:
					return backpressure.Overloaded(nil)
				}
				return nil
			}
			r := route("r", src, h)
			r.Workers, r.Window.Messages, r.Window.Bytes = 4, 16, 2000
			r.DeadLetter.Sink = dlq.SinkFunc(func(context.Context, *dlq.Letter) error { return nil })
			r.Retry.MaxAttempts = 1000 // overloaded/retried come back until they succeed or die
			c, _ := consumer.New(consumer.Options{}, r)
			stop := start(t, c)
			eventually(t, "drained", func() bool {
				s := c.Stats()[0]
				return src.Queued() == 0 && s.Held == 0 && s.Settled[consumer.OutcomeSucceeded]+s.Settled[consumer.OutcomeDeadLettered] == n
			})
			if err := stop(); err != nil {
				t.Fatal(err)
			}
			s := c.Stats()[0]
			if s.Fetched != settledTotal(s) {
				t.Fatalf("fetched %d != settled %d", s.Fetched, settledTotal(s))
			}
			if w := s.Window; w.InUse != 0 || w.InUseBytes != 0 {
				t.Fatalf("window not empty: %d/%d", w.InUse, w.InUseBytes)
			}
			checkLedger(t, src, n)
		})
	}
}

// checkLedger: every id settled exactly once finally (ack or term), no
// protocol violations, nothing pending.
func checkLedger(t *testing.T, src *sluicetest.Source, n int) {
	t.Helper()
	ledger, violations := src.Ledger()
	if len(violations) > 0 {
		t.Fatalf("violations: %v", violations[:min(5, len(violations))])
	}
	if len(ledger) != n {
		t.Fatalf("ledger has %d ids, want %d", len(ledger), n)
	}
	for id, rec := range ledger {
		if rec.Pending || rec.Acks+rec.Terms != 1 || rec.Deliveries != rec.Acks+rec.Terms+rec.Naks {
			t.Fatalf("%s: %+v", id, rec)
		}
	}
}

type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}
