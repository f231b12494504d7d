package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

// recordHook writes down, per message and delivery, what the route told it.
type recordHook struct {
	route string
	mu    sync.Mutex
	log   map[string][]string // "id#attempt" -> events
	waits []consumer.Waits
	bad   []string
}

type ctxKey struct{}

func (h *recordHook) HookRoute(info consumer.RouteInfo) consumer.MessageHook {
	h.route = info.Name
	h.log = map[string][]string{}
	return h
}

func delivery(m *consumer.Message) string { return fmt.Sprintf("%s#%d", m.Key, m.Attempt) }

func (h *recordHook) Held(ctx context.Context, m *consumer.Message, w consumer.Waits) context.Context {
	h.mu.Lock()
	defer h.mu.Unlock()
	id := delivery(m)
	if len(h.log[id]) > 0 {
		h.bad = append(h.bad, id+": Held twice")
	}
	h.log[id] = append(h.log[id], "held")
	h.waits = append(h.waits, w)
	return context.WithValue(ctx, ctxKey{}, id)
}

func (h *recordHook) Event(ctx context.Context, m *consumer.Message, e consumer.Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	id := delivery(m)
	if ctx.Value(ctxKey{}) != id {
		h.bad = append(h.bad, fmt.Sprintf("%s: %v event without Held's ctx", id, e.Kind))
	}
	evs := h.log[id]
	if len(evs) == 0 || strings.HasPrefix(evs[len(evs)-1], "settled") {
		h.bad = append(h.bad, fmt.Sprintf("%s: %v after %v", id, e.Kind, evs))
	}
	s := e.Kind.String()
	switch e.Kind {
	case consumer.EventEnd:
		if e.Err != nil {
			s += " err"
		}
	case consumer.EventShed:
		s += " " + e.Shed.String()
	case consumer.EventLetter:
		s += " " + e.Class
		if e.Letter != nil {
			e.Letter.Trace = map[string]string{"traceparent": id}
		}
	case consumer.EventSettled:
		s += " " + e.Outcome.String() + " " + e.Settlement.Op.String()
		if e.Settlement.Op == consumer.SettleNak && e.Settlement.Delay > 0 {
			s += " delayed"
		}
	}
	h.log[id] = append(evs, s)
}

func (h *recordHook) events(id string) string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return strings.Join(h.log[id], ", ")
}

// Each path a message can take tells the hook its story, in order, with
// Held's context everywhere (the handler's too), and the hook's letter
// annotation reaches the sink.
func TestHookStory(t *testing.T) {
	src := sluicetest.NewSource()
	sink := &sluicetest.Sink{}
	past := consumer.Headers{expiry.DefaultHeader: {expiry.FormatDeadline(time.Now().Add(-time.Minute))}}
	soon := consumer.Headers{expiry.DefaultHeader: {expiry.FormatDeadline(time.Now().Add(time.Minute))}}
	src.Publish("ok", nil, nil, time.Time{})
	src.Publish("flaky", nil, nil, time.Time{})
	src.Publish("poison", nil, nil, time.Time{})
	src.Publish("old", nil, past, time.Time{})
	src.Publish("rushed", nil, soon, time.Time{})
	hook := &recordHook{}
	var ctxBad []string
	var mu sync.Mutex
	c, err := consumer.New(consumer.Options{Hook: hook}, consumer.Route{
		Name: "orders", Source: src, Workers: 2,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			if ctx.Value(ctxKey{}) != delivery(m) {
				mu.Lock()
				ctxBad = append(ctxBad, delivery(m))
				mu.Unlock()
			}
			switch string(m.Key) {
			case "flaky":
				return errors.New("downstream 503")
			case "poison":
				return consumer.Permanent(errors.New("cannot decode"))
			}
			return nil
		},
		Retry:      consumer.RetryPolicy{MaxAttempts: 3, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
		Overload:   consumer.OverloadPolicy{ShedNearDeadline: time.Hour, OnShed: consumer.ShedAck},
	})
	if err != nil {
		t.Fatal(err)
	}
	_, err = sluicetest.RunUntil(context.Background(), c, 10*time.Second, func(s []consumer.RouteStats) bool {
		return s[0].Settled[consumer.OutcomeDeadLettered] == 2 && s[0].Held == 0 && sluicetest.Final(s[0]) == 4
	})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"ok#1":     "held, start, end, settled succeeded ack",
		"flaky#1":  "held, start, end err, settled retried nak delayed",
		"flaky#2":  "held, start, end err, settled retried nak delayed",
		"flaky#3":  "held, start, end err, letter exhausted, settled dead_lettered term",
		"poison#1": "held, start, end err, letter permanent, settled dead_lettered term",
		"old#1":    "held, settled expired ack",
		"rushed#1": "held, shed near_deadline, settled shed ack",
	}
	for id, w := range want {
		// A retry's backoff of up to 1 ms may draw 0 ("delayed" is absent then).
		if got := hook.events(id); got != w && got != strings.Replace(w, " delayed", "", -1) {
			t.Errorf("%s: %s\n  want %s", id, got, w)
		}
	}
	if len(hook.log) != len(want) {
		t.Errorf("deliveries seen: %v", hook.log)
	}
	if hook.bad != nil || ctxBad != nil {
		t.Errorf("hook saw %v; handler ctx without Held's value: %v", hook.bad, ctxBad)
	}
	if hook.route != "orders" {
		t.Errorf("HookRoute got %q", hook.route)
	}
	for _, l := range sink.Letters() {
		if id := fmt.Sprintf("%s#%d", l.Key, l.Attempts); l.Trace["traceparent"] != id {
			t.Errorf("letter %s: Trace %v, want the hook's annotation", id, l.Trace)
		}
	}
}

// The hook hears how long the route waited for its window before the fetch
// that brought a message: here one slot, held 50 ms by each handler run.
func TestHookWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		for i := range 3 {
			src.Publish(fmt.Sprint(i), nil, nil, time.Time{})
		}
		hook := &recordHook{}
		c, err := consumer.New(consumer.Options{Hook: hook}, consumer.Route{
			Name: "slow", Source: src, Workers: 1,
			Handler: func(ctx context.Context, m *consumer.Message) error { time.Sleep(50 * time.Millisecond); return nil },
			Window:  consumer.WindowPolicy{Messages: 1},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- c.Run(ctx) }()
		for c.Stats()[0].Settled[consumer.OutcomeSucceeded] < 3 {
			time.Sleep(time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		hook.mu.Lock()
		defer hook.mu.Unlock()
		if len(hook.waits) != 3 {
			t.Fatalf("waits: %v", hook.waits)
		}
		if hook.waits[0].Window != 0 {
			t.Errorf("first fetch waited %v for an empty window", hook.waits[0].Window)
		}
		for _, w := range hook.waits[1:] {
			if w.Window < 50*time.Millisecond || w.Window > 52*time.Millisecond {
				t.Errorf("waited %v for the window, want the handler's 50 ms", w.Window)
			}
		}
	})
}

func TestHookTypedNil(t *testing.T) {
	var h *recordHook
	_, err := consumer.New(consumer.Options{Hook: h}, consumer.Route{Name: "r", Source: sluicetest.NewSource(),
		Handler: func(context.Context, *consumer.Message) error { return nil }})
	if !errors.Is(err, consumer.ErrInvalidOption) {
		t.Fatalf("typed nil Hook: %v", err)
	}
}

// The hook hears how long the Throttle held the pull back before the
// fetch: here it refuses the first two draws, each followed by a
// ThrottleWait pause.
func TestHookThrottleWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		draws := 0
		th, err := backpressure.NewThrottle(backpressure.ThrottleOptions{K: 1, Rand: func() float64 {
			draws++
			if draws <= 2 {
				return 0 // under any reject probability: refused
			}
			return 0.999999
		}})
		if err != nil {
			t.Fatal(err)
		}
		th.CountAt(time.Now(), 1000, 0, 0) // 1000 requests, none accepted: p ≈ 0.999
		src := sluicetest.NewSource()
		src.Publish("a", nil, nil, time.Time{})
		hook := &recordHook{}
		c, err := consumer.New(consumer.Options{Hook: hook}, consumer.Route{
			Name: "throttled", Source: src, Workers: 1,
			Handler:  func(context.Context, *consumer.Message) error { return nil },
			Window:   consumer.WindowPolicy{Messages: 1},
			Overload: consumer.OverloadPolicy{Throttle: th, ThrottleWait: 10 * time.Millisecond},
		})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- c.Run(ctx) }()
		for c.Stats()[0].Settled[consumer.OutcomeSucceeded] < 1 {
			time.Sleep(time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		hook.mu.Lock()
		defer hook.mu.Unlock()
		if len(hook.waits) != 1 || hook.waits[0].Throttle != 20*time.Millisecond {
			t.Fatalf("waits %v, want one fetch held back 2 x 10 ms", hook.waits)
		}
	})
}

// JoinHooks passes every call to each hook, chaining Held's contexts; nil
// hooks and routes a hook leaves alone are skipped.
func TestJoinHooks(t *testing.T) {
	a, b := &recordHook{}, &recordHook{}
	var none *recordHook
	src := sluicetest.NewSource()
	src.Publish("ok", nil, nil, time.Time{})
	src.Publish("poison", nil, nil, time.Time{})
	c, err := consumer.New(consumer.Options{Hook: consumer.JoinHooks(a, nil, none, skipRoutes{}, b)}, consumer.Route{
		Name: "orders", Source: src,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			if string(m.Key) == "poison" {
				return consumer.Permanent(errors.New("cannot decode"))
			}
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sluicetest.RunUntil(context.Background(), c, 10*time.Second, func(s []consumer.RouteStats) bool {
		return sluicetest.Final(s[0]) == 2 && s[0].Held == 0
	}); err != nil {
		t.Fatal(err)
	}
	for _, h := range []*recordHook{a, b} {
		if got := h.events("ok#1"); got != "held, start, end, settled succeeded ack" {
			t.Errorf("ok: %s", got)
		}
		if got := h.events("poison#1"); got != "held, start, end err, letter permanent, settled terminated term" {
			t.Errorf("poison: %s", got)
		}
		if h.bad != nil {
			t.Errorf("hook saw %v", h.bad)
		}
	}
	if consumer.JoinHooks(nil, skipRoutes{}).HookRoute(consumer.RouteInfo{}) != nil {
		t.Error("a join of hooks that skip the route hooks it")
	}
}

// skipRoutes leaves every route alone.
type skipRoutes struct{}

func (skipRoutes) HookRoute(consumer.RouteInfo) consumer.MessageHook { return nil }
