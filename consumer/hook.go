package consumer

import (
	"context"
	"time"

	"github.com/sluice-go/sluice/dlq"
)

// Hook follows every message through a route: when the route takes it in,
// the handler run, the decisions the route makes without the handler (shed,
// expired, dead-lettered, retried, returned) and the settlement it ends
// with. Package otelsluice implements it for OpenTelemetry tracing; a
// logger or a metrics package can implement it the same way.
//
// New calls HookRoute once per route (Options.Hook), like
// Observer.ObserveRoute. With Options.Hook nil, or a nil MessageHook for a
// route, the route makes no call, reads no extra clock and allocates
// nothing for it (BenchmarkCorePath). JoinHooks puts several on one
// consumer.
type Hook interface {
	// HookRoute returns the hook for one route's messages, or nil to leave
	// the route alone. info has the route's defaults applied.
	HookRoute(info RouteInfo) MessageHook
}

// MessageHook receives one route's messages. Its methods are called
// concurrently for different messages (from the route's fetch loop, its
// workers and the goroutines that confirm settlements) and must not block:
// they run on the message path.
//
// For each message the calls are ordered: Held first, then its Events,
// ending with exactly one EventSettled. (One exception: the handler of a
// message abandoned at shutdown while it still ran may report EventEnd
// after it; a hook ignores events after EventSettled.)
type MessageHook interface {
	// Held is called when the route takes m in: fetched and counted, before
	// its window charge, deadline check and queueing. ctx is the route's
	// handler context with m's criticality. The context Held returns is m's
	// for the rest of its life: the handler's ctx derives from it (with m's
	// deadline added) and every Event for m receives it. Return ctx itself
	// to add nothing.
	Held(ctx context.Context, m *Message, w Waits) context.Context
	// Event reports what the route did with m; ctx is what Held returned.
	// A hook must not keep m or e.Letter after Event returns.
	Event(ctx context.Context, m *Message, e Event)
}

// Waits is what the route waited through since its previous fetch, before
// the fetch that brought a message in.
type Waits struct {
	// Window is the time the route waited for window capacity (its share
	// of RouteStats.Window.Blocked): the backpressure signal.
	Window time.Duration
	// Throttle is the time the route's Throttle held the pull back
	// (Overload.Throttle; a ThrottleWait per refusal).
	Throttle time.Duration
}

// EventKind says what an Event reports.
type EventKind int8

const (
	// EventStart: a worker is about to run the handler; m passed its last
	// checks. Elapsed is the time since the route took m in (queue and
	// slot wait).
	EventStart EventKind = iota + 1
	// EventEnd: the handler returned Err (nil on success) after Elapsed.
	EventEnd
	// EventShed: an overload policy shed m before it ran, for reason Shed
	// (m.Criticality() is its class).
	EventShed
	// EventLetter: m failed for good and goes to the dead-letter sink:
	// Class and Err say why. Letter is the letter about to be written (the
	// hook may set Letter.Trace; it must not change anything else), or nil
	// when the route has no sink and m is terminated instead.
	EventLetter
	// EventSettled: m's life in the route is over, its capacity is about to
	// come back. Outcome is what the route decided, Settlement what the
	// broker was told (Op 0: nothing, m was abandoned to its redelivery),
	// Err the settlement's error (nil when the broker has it). Exactly once
	// per message, and last.
	EventSettled
)

var eventKindNames = [...]string{"", "start", "end", "shed", "letter", "settled"}

// String returns "start", "end", "shed", "letter" or "settled".
func (k EventKind) String() string {
	if k < EventStart || k > EventSettled {
		return "unknown"
	}
	return eventKindNames[k]
}

// Event is one thing a route did with a message; the fields that apply to
// its Kind are set.
type Event struct {
	Kind       EventKind
	Outcome    Outcome       // EventSettled
	Settlement Settlement    // EventSettled
	Err        error         // EventEnd: the handler's; EventLetter: the cause; EventSettled: the settlement's
	Elapsed    time.Duration // EventStart: since held; EventEnd: the handler's run time
	Shed       ShedReason    // EventShed
	Class      string        // EventLetter: the dead-letter class (dlq.Class*, Class*)
	Letter     *dlq.Letter   // EventLetter: nil without a sink
}

// JoinHooks returns a Hook that passes every call to each of hooks in turn
// (nil ones are skipped): tracing and logging on one consumer. Held chains
// the contexts: each hook's Held gets the context the previous one
// returned, and the last one is the message's.
func JoinHooks(hooks ...Hook) Hook {
	var hs joined
	for _, h := range hooks {
		if !isNil(h) {
			hs = append(hs, h)
		}
	}
	return hs
}

type joined []Hook

func (hs joined) HookRoute(info RouteInfo) MessageHook {
	var ms joinedRoute
	for _, h := range hs {
		if m := h.HookRoute(info); !isNil(m) {
			ms = append(ms, m)
		}
	}
	switch len(ms) {
	case 0:
		return nil
	case 1:
		return ms[0]
	}
	return ms
}

type joinedRoute []MessageHook

func (ms joinedRoute) Held(ctx context.Context, m *Message, w Waits) context.Context {
	for _, h := range ms {
		if c := h.Held(ctx, m, w); c != nil {
			ctx = c
		}
	}
	return ctx
}

func (ms joinedRoute) Event(ctx context.Context, m *Message, e Event) {
	for _, h := range ms {
		h.Event(ctx, m, e)
	}
}

// hooked is a route's hook and what its fetch loop tracks for it.
type hooked struct {
	hook MessageHook
	// Fetch loop only: Window.Blocked at the last fetch, Throttle time
	// since it, and the Waits of the batch being admitted.
	blockedSeen time.Duration
	throttled   time.Duration
	waits       Waits
}

// noteFetch computes the Waits of the batch about to be admitted.
func (r *route) noteFetch() {
	b := r.window.Blocked()
	r.waits = Waits{Window: b - r.blockedSeen, Throttle: r.throttled}
	r.blockedSeen, r.throttled = b, 0
}

// holdHook gives m to the hook as it is held; m.crit is set.
func (r *route) holdHook(m *Message) {
	base := r.classCtx[m.crit&3]
	ctx := r.hook.Held(base, m, r.waits)
	if ctx == nil {
		ctx = base
	}
	m.hctx = ctx
}

// event reports e for m to the route's hook, if any.
func (r *route) event(m *Message, e Event) {
	if r.hook != nil {
		r.hook.Event(m.hctx, m, e)
	}
}

// BatchStart implements BatchHook: each member that implements it gets
// the context the previous one returned.
func (ms joinedRoute) BatchStart(ctx context.Context, b *Batch, msgCtxs []context.Context) context.Context {
	for _, m := range ms {
		if bh, ok := m.(BatchHook); ok {
			ctx = bh.BatchStart(ctx, b, msgCtxs)
		}
	}
	return ctx
}

// BatchEnd implements BatchHook.
func (ms joinedRoute) BatchEnd(ctx context.Context, info BatchInfo) {
	for _, m := range ms {
		if bh, ok := m.(BatchHook); ok {
			bh.BatchEnd(ctx, info)
		}
	}
}
