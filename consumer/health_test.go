package consumer_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

// readySource is a sluicetest.Source whose SourceInfo.Ready reports what
// the test sets, as an adapter reports its broker connection.
type readySource struct {
	*sluicetest.Source
	mu  sync.Mutex
	err error
}

func (s *readySource) set(err error) { s.mu.Lock(); s.err = err; s.mu.Unlock() }

func (s *readySource) Attach(l consumer.RouteLimits) (consumer.SourceInfo, error) {
	info, err := s.Source.Attach(l)
	info.Ready = func() error { s.mu.Lock(); defer s.mu.Unlock(); return s.err }
	return info, err
}

func healthOf(t *testing.T, c *consumer.Consumer) consumer.RouteHealth {
	t.Helper()
	h := c.Health()
	if len(h.Routes) != 1 {
		t.Fatalf("health has %d routes", len(h.Routes))
	}
	return h.Routes[0]
}

func wantState(t *testing.T, c *consumer.Consumer, want consumer.RouteState, reason string) consumer.RouteHealth {
	t.Helper()
	rh := healthOf(t, c)
	if rh.State != want || !strings.Contains(rh.Reason, reason) {
		t.Fatalf("health %+v: want %s with a reason containing %q", rh, want, reason)
	}
	return rh
}

// A handler that hangs makes its route stuck StuckAfter after the message
// was fetched; the consumer is then not live once the grace has passed
// too, and both come back once the handler returns.
func TestHealthStuckHandlerAndBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		release := make(chan struct{})
		r := route("r", src, func(ctx context.Context, m *consumer.Message) error {
			if string(m.Key) == "hang" {
				<-release
			}
			return nil
		})
		c, err := consumer.New(consumer.Options{Health: consumer.HealthPolicy{StuckAfter: 10 * time.Second}}, r)
		if err != nil {
			t.Fatal(err)
		}
		wantState(t, c, consumer.StateStopped, "Run has not started")
		stop := start(t, c)
		synctest.Wait()
		wantState(t, c, consumer.StateIdle, "holds nothing")
		if ok, why := c.Health().Ready(); !ok {
			t.Fatalf("an idle route is not ready: %s", why)
		}

		src.Publish("hang", nil, nil, time.Time{})
		synctest.Wait()
		wantState(t, c, consumer.StateProgressing, "holds 1 messages")
		time.Sleep(10 * time.Second) // exactly StuckAfter: not yet
		wantState(t, c, consumer.StateProgressing, "")
		time.Sleep(time.Second)
		rh := wantState(t, c, consumer.StateStuck, "holds 1 messages and settled none for 11s")
		if want := time.Now().Add(-time.Second); !rh.Since.Equal(want) {
			t.Fatalf("stuck since %v, want %v (fetch + StuckAfter)", rh.Since, want)
		}
		h := c.Health()
		if ok, _ := h.Ready(); ok {
			t.Fatal("a stuck route is ready")
		}
		if ok, _ := h.Live(5 * time.Second); !ok {
			t.Fatal("not live within the grace")
		}
		time.Sleep(5 * time.Second)
		if ok, why := c.Health().Live(5 * time.Second); ok || !strings.Contains(why, `route "r" stuck since`) {
			t.Fatalf("live %v %q after the grace", ok, why)
		}

		close(release)
		synctest.Wait()
		rh = wantState(t, c, consumer.StateIdle, "holds nothing")
		if !rh.LastSettled.Equal(time.Now()) {
			t.Fatalf("LastSettled %v, want now", rh.LastSettled)
		}
		if ok, why := c.Health().Live(0); !ok {
			t.Fatalf("not live after the handler returned: %s", why)
		}
		if got := c.Stats()[0].Health.State; got != consumer.StateIdle {
			t.Fatalf("RouteStats.Health.State %s", got)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
		wantState(t, c, consumer.StateStopped, "shutting down")
	})
}

// A route that keeps settling is not stuck, however long some message has
// been held, as long as settlements are seen within StuckAfter.
func TestHealthProgressWithOneHungHandlerIsNotStuck(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		release := make(chan struct{})
		r := route("r", src, func(ctx context.Context, m *consumer.Message) error {
			if string(m.Key) == "hang" {
				<-release
			}
			return nil
		})
		c, err := consumer.New(consumer.Options{Health: consumer.HealthPolicy{StuckAfter: 10 * time.Second}}, r)
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		src.Publish("hang", nil, nil, time.Time{})
		for i := range 6 {
			time.Sleep(5 * time.Second)
			src.Publish(string(rune('a'+i)), nil, nil, time.Time{})
			synctest.Wait()
			wantState(t, c, consumer.StateProgressing, "holds 1 messages, oldest held")
		}
		close(release)
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	})
}

// A Source that reports itself not ready makes its route not ready, with
// the Source's reason, and ready again once it recovers.
func TestHealthSourceNotReadyAndBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := &readySource{Source: sluicetest.NewSource()}
		c, err := consumer.New(consumer.Options{}, route("r", src, func(context.Context, *consumer.Message) error { return nil }))
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		synctest.Wait()
		src.set(errors.New("connection to the broker is down"))
		rh := wantState(t, c, consumer.StateNotReady, "source not ready: connection to the broker is down")
		if ok, why := c.Health().Ready(); ok || !strings.Contains(why, `route "r" not_ready: source not ready`) {
			t.Fatalf("ready %v %q", ok, why)
		}
		if ok, _ := c.Health().Live(0); !ok {
			t.Fatal("a route whose broker is down is not live: a restart would not bring the broker back")
		}
		time.Sleep(time.Second)
		src.set(nil)
		rh2 := wantState(t, c, consumer.StateIdle, "")
		if !rh2.Since.After(rh.Since) {
			t.Fatalf("since %v, not after %v", rh2.Since, rh.Since)
		}
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	})
}

// A route whose Source closed has failed, with the Source's error as the
// reason, while Run goes on for the other routes: not ready, and not live
// after the grace (only a restart brings it back). Once Run returns, every
// route is stopped and the consumer is live again.
func TestHealthSourceClosedFailsRoute(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, b := sluicetest.NewSource(), sluicetest.NewSource()
		ok := func(context.Context, *consumer.Message) error { return nil }
		c, err := consumer.New(consumer.Options{}, route("a", a, ok), route("b", b, ok))
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		a.Close()
		synctest.Wait()
		h := c.Health()
		if h.Routes[0].State != consumer.StateFailed || !strings.Contains(h.Routes[0].Reason, consumer.ErrClosed.Error()) ||
			h.Routes[1].State != consumer.StateIdle {
			t.Fatalf("health %+v", h.Routes)
		}
		if ok, why := h.Ready(); ok || !strings.Contains(why, `route "a" failed: the source closed`) {
			t.Fatalf("ready %v %q", ok, why)
		}
		if ok, _ := h.Live(time.Second); !ok {
			t.Fatal("not live within the grace")
		}
		time.Sleep(time.Second)
		if ok, why := c.Health().Live(time.Second); ok || !strings.Contains(why, `route "a" failed since`) {
			t.Fatalf("live %v %q after the grace", ok, why)
		}
		if err := stop(); !errors.Is(err, consumer.ErrClosed) {
			t.Fatalf("Run: %v", err)
		}
		h = c.Health()
		if h.Routes[0].State != consumer.StateStopped || !strings.Contains(h.Routes[0].Reason, "Run returned: ") {
			t.Fatalf("after Run: %+v", h.Routes[0])
		}
		if ok, why := h.Live(0); !ok {
			t.Fatalf("not live after Run returned: %s", why)
		}
	})
}

// A route that expires what it fetches is shedding (pressure high), and
// idle again once the stale messages are gone and the pressure's hold has
// passed.
func TestHealthSheddingAndBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		c, err := consumer.New(consumer.Options{}, route("r", src, func(context.Context, *consumer.Message) error { return nil }))
		if err != nil {
			t.Fatal(err)
		}
		stop := start(t, c)
		synctest.Wait()
		healthOf(t, c) // the pressure gauge's first evaluation
		time.Sleep(200 * time.Millisecond)
		past := consumer.Headers{}
		past.Set(expiry.DefaultHeader, expiry.FormatDeadline(time.Now().Add(-time.Second)))
		for i := range 20 {
			src.Publish(string(rune('a'+i)), nil, past, time.Time{})
		}
		synctest.Wait()
		wantState(t, c, consumer.StateShedding, "pressure high")
		time.Sleep(5 * time.Second)
		healthOf(t, c)
		time.Sleep(5 * time.Second)
		wantState(t, c, consumer.StateIdle, "holds nothing")
		if err := stop(); err != nil {
			t.Fatal(err)
		}
	})
}

// Each option is refused on its own: a negative ShutdownGrace does not
// blame a zero LogInterval (issue 29).
func TestNegativeOptionsNameOnlyTheCulprit(t *testing.T) {
	src := sluicetest.NewSource()
	r := route("r", src, func(context.Context, *consumer.Message) error { return nil })
	for _, tc := range []struct {
		opts      consumer.Options
		want, not string
	}{
		{consumer.Options{ShutdownGrace: -time.Second}, "ShutdownGrace -1s is negative", "LogInterval"},
		{consumer.Options{LogInterval: -time.Second}, "LogInterval -1s is negative", "ShutdownGrace"},
		{consumer.Options{Health: consumer.HealthPolicy{StuckAfter: -time.Second}}, "StuckAfter -1s is negative", "LogInterval"},
	} {
		_, err := consumer.New(tc.opts, r)
		if !errors.Is(err, consumer.ErrInvalidOption) || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), tc.not) {
			t.Errorf("New(%+v): %v; want %q without %q", tc.opts, err, tc.want, tc.not)
		}
	}
}

func TestRouteStateNames(t *testing.T) {
	var names []string
	for _, s := range consumer.RouteStates() {
		names = append(names, s.String())
	}
	if got := strings.Join(names, " "); got != "stopped failed not_ready stuck shedding progressing idle" {
		t.Fatalf("states %q", got)
	}
	if consumer.RouteState(-1).String() != "unknown" {
		t.Fatal("an unknown state has a name")
	}
}
