package consumer

import (
	"context"
	"github.com/sluice-go/sluice/dlq"
	"time"
)

// Source hands over messages for one route.
//
// Attach is called by New before anything else: the Source learns the
// route's limits (its window is stated once, on the Route) and describes
// its broker. A Source serves one route: Attach for another route's name
// returns an error wrapping ErrInvalidOption (a second New for the same
// route, after the first failed, may attach it again). Wrappers
// (drain.Source) forward it.
//
// Fetch blocks until it can return at least one message, ctx is done, or
// its own poll interval ends (then it may return no messages and a nil
// error). It returns at most maxMessages messages whose sizes add up to at
// most maxBytes, with one exception: when the next message alone is larger
// than maxBytes the source may return it alone, and the consumer admits it
// by its oversize policy. A Source that will never return messages again
// returns an error wrapping ErrClosed: its route stops, the others go on.
//
// Messages a Source has returned are the consumer's: it settles every one
// of them through its Acker, even when Fetch also returns an error.
type Source interface {
	Attach(RouteLimits) (SourceInfo, error)
	Fetch(ctx context.Context, maxMessages int, maxBytes int64) ([]*Message, error)
}

// RouteLimits is what a route tells its Source in Attach.
type RouteLimits struct {
	// Route is the route's name.
	Route string
	// Messages and Bytes are the route window's limits: the most the route
	// holds (queued, running and awaiting settlement) at once. The Source
	// sizes its prefetch and broker-side limits from them.
	Messages int
	Bytes    int64
	// MaxAttempts is the route's Retry.MaxAttempts (defaults applied): the
	// most deliveries it gives one message before dead-lettering it.
	MaxAttempts int
	// MaxDelay is the longest SettleNak delay the route asks for (retry
	// backoff cap, shed delay): a Source may clamp not-before times it
	// reads from the broker to it.
	MaxDelay time.Duration
	// Ordering is the route's Ordering. An ordered route never nak's a
	// message it will run again (it retries in place) and hands back a
	// key's messages in order; a Source must not let a redelivery overtake
	// later messages of its key or partition (a Kafka retry topic would).
	Ordering Ordering
	// DeadLetter is the route's dead-letter sink (DeadLetterPolicy.Sink;
	// nil: none). A Source that can find, after the fact, last deliveries
	// the route could not settle (the NATS adapter reads JetStream's
	// max-deliveries advisories) writes their letters here unless told
	// otherwise.
	DeadLetter dlq.Sink
}

// SourceInfo describes a Source's broker to its route.
type SourceInfo struct {
	// AckWait, when > 0, is how long the broker waits for a settlement
	// before it redelivers (JetStream AckWait). The route then keeps what
	// it holds alive with InProgress at a third of it (Route.KeepAlive).
	AckWait time.Duration
	// MaxDeliver, when > 0, is how many deliveries the broker makes of one
	// message before it gives up on it (JetStream MaxDeliver). A SettleNak
	// of the last delivery would lose the message, so New refuses a route
	// whose Retry.MaxAttempts is above it, and the route never naks a last
	// delivery: it dead-letters it instead (see the settlement contract in
	// the package documentation).
	MaxDeliver int
	// Ready, when set, reports whether the Source is attached to its
	// broker and can deliver: nil when it is, or an error that says why
	// not (the connection is down, the Kafka group has not formed, the
	// consumer was deleted). Consumer.Health calls it on every probe and
	// metric scrape, so it must answer at once from what the Source
	// already knows, never ask the broker. nil means the route counts as
	// ready while it runs.
	Ready func() error
}

// Handler processes one message. Its ctx carries the message deadline, if
// any, and the message's criticality (backpressure.CriticalityFrom), and is
// cancelled on shutdown once the grace period is over. Return nil for
// success, Permanent(err) for an error retrying cannot fix,
// backpressure.Overloaded(err) to hand the message back without retrying
// it at this layer, or any other error to retry.
type Handler func(ctx context.Context, m *Message) error

// Middleware wraps a Handler.
type Middleware func(Handler) Handler

// Chain wraps h in mw, the first middleware outermost: Chain(h, a, b) runs
// a, then b, then h.
func Chain(h Handler, mw ...Middleware) Handler {
	for i := len(mw) - 1; i >= 0; i-- {
		h = mw[i](h)
	}
	return h
}
