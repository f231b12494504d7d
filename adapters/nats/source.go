package natsadapter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
)

// SourceOptions configure a Source. The zero value is usable.
type SourceOptions struct {
	// PollWait is the longest one Fetch waits for a first message. 0 means
	// 1 s. Once a message is there, Fetch returns what the server has at
	// that moment without waiting for the batch to fill.
	PollWait time.Duration
	// Confirm says how the Source learns that the server has a
	// settlement (see ConfirmMode); the zero value is ConfirmBatch.
	Confirm ConfirmMode
	// KeyHeader names the header whose value becomes Message.Key, the key
	// that orders messages on a keyed route. "" (the default) means the
	// subject is the key; a message without the named header also gets
	// its subject. (Before 1.0 the default was the Nats-Msg-Id header,
	// which is unique per message and so orders nothing.)
	KeyHeader string
	// AckTimeout is how long a settlement waits for the server's answer
	// before it is re-sent (Ack and Term, at most twice) or given up as
	// unconfirmed (the broker then redelivers the message after AckWait
	// unless the settlement landed after all). After a reconnect,
	// outstanding settlements are re-sent at once. 0 means 5 s.
	AckTimeout time.Duration
	// Recover is where the Source dead-letters the messages JetStream stops
	// delivering because their last delivery was never settled (the
	// consumer has a MaxDeliver, and the process stopped or was killed
	// while it held one, or its dead-letter write failed until the
	// shutdown). The Source keeps the consumer's MAX_DELIVERIES advisories
	// in a stream (RecoveryStream) and, from its first Fetch until Close,
	// reads each message from the stream by sequence and writes its letter
	// (class ClassMaxDeliveries) once the sink takes it. See "Last
	// deliveries" in the package doc. nil (the default) means the sink of
	// the route that attaches the Source (consumer.Route's DeadLetter
	// sink, whose dedup id then matches the route's own letter for the
	// message); a route without a sink, a consumer without MaxDeliver, an
	// ephemeral consumer (it goes with its process; the next one delivers
	// the stream again) and NoRecover recover nothing.
	Recover dlq.Sink
	// NoRecover turns the recovery above off, even with Recover set: no
	// advisory stream is made (for example where the Source's credentials
	// may not create streams; without it, that failure is logged once per
	// attempt and the route runs on).
	NoRecover bool
}

// ConfirmMode says how a Source learns that the server has a settlement
// (Ack, Nak, Term). Until it does, the message keeps its window slot.
// Every mode is pipelined: workers and the fetch loop hand settlements to
// the Source's writer and go on.
type ConfirmMode int8

const (
	// ConfirmBatch (the default) sends the settlements the writer has at
	// one moment as plain acks, except the last Ack or Term, which carries
	// a reply subject on the Source's own inbox. A JetStream consumer
	// processes its acks in order, so the server's answer to that one
	// confirms every settlement sent before it on the connection; a
	// reconnect in between voids that (they are re-sent), and until a
	// settlement sent on the current connection has been answered (the
	// consumer may not be loaded yet after a server restart), each one asks
	// for its own answer. Naks always do. Settlements whose answer does not
	// come are re-sent like with ConfirmReply. One reply per batch instead
	// of one per message: the server and the client do about a third less
	// work per message. In a cluster, an ack lost in a consumer leader
	// change can be confirmed by the new leader's answer to a later one:
	// the message is then redelivered after AckWait (a duplicate, never a
	// loss); ConfirmReply reports that case as an unconfirmed settlement.
	ConfirmBatch ConfirmMode = iota
	// ConfirmReply sends each settlement with a reply subject: the server
	// answers each one once its consumer has processed it (replicated, in
	// a cluster), and an error (the consumer is gone) comes back as such.
	// The strictest confirmation, and the costliest: one answer per
	// message.
	ConfirmReply
	// ConfirmNone sends plain acks and counts them done once queued: a
	// settlement lost on the way is not noticed (the message is
	// redelivered after AckWait, a duplicate).
	ConfirmNone
)

func (m ConfirmMode) String() string {
	switch m {
	case ConfirmBatch:
		return "batch"
	case ConfirmReply:
		return "reply"
	case ConfirmNone:
		return "none"
	}
	return "ConfirmMode(" + strconv.Itoa(int(m)) + ")"
}

// ErrPull wraps a pull request the server refused for a reason other than
// "no messages" or "timeout" (for example 409 Consumer Deleted). The route
// counts it as a fetch error and retries with backoff.
var ErrPull = errors.New("natsadapter: pull request refused")

// ErrConsumerDeleted is returned by Fetch when the JetStream consumer is
// gone from the server. A Source made by NewSourceFor recreates it and
// returns this error once (wrapped, with what it did) so the route counts
// it; a Source wrapping a consumer the user created (NewSource) cannot
// know how to recreate it and returns the error wrapped with
// consumer.ErrClosed, which stops the route.
var ErrConsumerDeleted = errors.New("natsadapter: consumer deleted on the server")

// Source is a consumer.Source over a JetStream pull consumer. Fetch is meant
// for one route's fetch loop; settlements may come from any goroutine.
//
// Each Fetch is one pull request for exactly what the caller asked for, by
// count and bytes, sent with no_wait and an expiry: the server answers as
// soon as it has at least one message and ends the request once it has no
// more to give, so a half-full batch never waits for the expiry. Nothing is
// buffered between Fetch calls: whatever the server delivers belongs to the
// request the route's window made room for.
//
// jetstream's Fetch cannot express that request (its no-wait form has no
// byte limit and no expiry, its waiting form holds a partial batch until the
// expiry), so the Source sends the pull request itself on the connection
// and settles deliveries with the JetStream ack protocol directly.
type Source struct {
	js     jetstream.JetStream
	nc     *nats.Conn
	opts   SourceOptions
	stream string
	name   string
	next   string // the pull request subject
	set    *settler
	// rec recovers what JetStream stops delivering (opts.Recover); nil
	// without it.
	rec *recoverer
	// owned is the config NewSourceFor created the consumer with; nil for
	// a consumer the user owns (NewSource).
	owned *jetstream.ConsumerConfig

	mu     sync.Mutex
	cons   jetstream.Consumer
	sub    *nats.Subscription
	ch     chan *nats.Msg
	inbox  string
	closed bool
	route  string // the route attached (Attach)
	window int    // its message window, sizes ch (Attach)

	// Used by the fetch loop only.
	seq       uint64
	req       openRequest
	infoAt    time.Time // when ackFloor was last read
	ackFloor  uint64    // the consumer's ack floor (stream sequence) when last read
	delivered int       // deliveries since infoAt
	// lastKey is the Key of the last delivery and keyOf the string it was
	// made from: consecutive deliveries with the same key share its bytes
	// instead of allocating a copy each (convert).
	lastKey []byte
	keyOf   string

	// delayed counts the delayed naks the server holds for this Source.
	delayed delayedSlots
	// autoAckPending: the Source sized the consumer's MaxAckPending (the
	// window plus reserve) and raises it as delayed naks need (fetch loop).
	autoAckPending bool
	reserve        int
	sizeRetry      time.Time
	sizeNow        bool // Attach stated the window: size MaxAckPending at the next pull

	// gen counts recreations of the consumer: a settlement of a delivery
	// from an earlier generation cannot land (the server ignores, without
	// an answer, an ack for a sequence its new consumer has not delivered).
	gen atomic.Uint32

	c sourceCounters
	// pullErr is the last Fetch's error, nil after a Fetch without one
	// (readyNow).
	pullErr atomic.Pointer[error]
}

type sourceCounters struct {
	recreated        atomic.Uint64
	ackPendingRaises atomic.Uint64
	statusHeaders    atomic.Uint64
	settleErrors     atomic.Uint64
	returnedUnread   atomic.Uint64
	// redeliveriesSettled: see SourceStats.RedeliveriesSettled.
	redeliveriesSettled atomic.Uint64
}

// SourceStats are a Source's own counters.
type SourceStats struct {
	// Recreated counts consumers this Source recreated after they were
	// deleted on the server (NewSourceFor only).
	Recreated uint64
	// StatusHeaderDeliveries counts deliveries with an empty payload and a
	// header named Status: they look like the server's pull status
	// messages, and are handed to the route like any other delivery
	// (a real delivery carries a JetStream ack subject; a status does not).
	StatusHeaderDeliveries uint64
	// AcksResent counts settlements re-sent because the server's answer
	// did not come (a reconnect, AckTimeout).
	AcksResent uint64
	// AcksUnconfirmed counts settlements completed with
	// ErrAckUnconfirmed.
	AcksUnconfirmed uint64
	// AcksCovered counts settlements sent without a reply subject and
	// confirmed by the server's answer to a later one (ConfirmBatch).
	AcksCovered uint64
	// SettleErrors counts unconfirmed (ConfirmNone) settlements the
	// connection refused to send.
	SettleErrors uint64
	// DelayedNaks is how many deliveries this Source nak'd with a delay
	// that has not passed: the server keeps each ack-pending meanwhile,
	// so they take MaxAckPending slots outside the route's window.
	DelayedNaks int
	// MaxAckPending is the consumer's MaxAckPending as last seen.
	MaxAckPending int
	// AckPendingRaises counts the times the Source raised its consumer's
	// MaxAckPending to make room for delayed naks.
	AckPendingRaises uint64
	// ReturnedUnread counts deliveries Close nak'd because no Fetch
	// returned them (the route had stopped reading).
	ReturnedUnread uint64
	// RedeliveriesSettled counts redeliveries the Source settled without
	// handing them to the route: the server sent the message again while
	// the Ack or Term of its earlier delivery (whose handler had finished)
	// still awaited the server's answer, typically a server that read the
	// ack and went down before applying it. Each gets that same
	// settlement, unconfirmed; the route's Fetched does not count them.
	RedeliveriesSettled uint64
	// Recovered counts messages dead-lettered from a MAX_DELIVERIES
	// advisory (SourceOptions.Recover); RecoverySkipped the advisories of
	// messages whose Ack or Term of the last delivery this Source saw
	// confirmed (it came after the server gave up); RecoveryGone those of
	// messages no longer in the stream; RecoveryFailures the attempts that
	// failed (the sink refused, the stream did not answer) and are retried.
	Recovered, RecoverySkipped, RecoveryGone, RecoveryFailures uint64
}

// Stats returns the Source's counters.
func (s *Source) Stats() SourceStats {
	st := SourceStats{
		Recreated:              s.c.recreated.Load(),
		StatusHeaderDeliveries: s.c.statusHeaders.Load(),
		AcksResent:             s.set.resent.Load(),
		AcksUnconfirmed:        s.set.unconfirmed.Load(),
		AcksCovered:            s.set.covered.Load(),
		SettleErrors:           s.c.settleErrors.Load(),
		DelayedNaks:            s.delayed.count(time.Now().UnixNano()),
		MaxAckPending:          s.maxAckPending(),
		AckPendingRaises:       s.c.ackPendingRaises.Load(),
		ReturnedUnread:         s.c.returnedUnread.Load(),
		RedeliveriesSettled:    s.c.redeliveriesSettled.Load(),
	}
	if r := s.rec; r != nil {
		st.Recovered, st.RecoverySkipped, st.RecoveryGone, st.RecoveryFailures = r.recovered.Load(), r.skipped.Load(), r.gone.Load(), r.failed.Load()
	}
	return st
}

func (s *Source) maxAckPending() int {
	if info := s.info(); info != nil {
		return info.Config.MaxAckPending
	}
	return 0
}

var _ consumer.Source = (*Source)(nil)

// NewSource wraps cons, a pull consumer with AckPolicy explicit reached
// through js (its connection carries the pull requests). Use it to run a
// consumer you already created under sluice; NewSourceFor creates one.
func NewSource(js jetstream.JetStream, cons jetstream.Consumer, opts SourceOptions) (*Source, error) {
	if js == nil || cons == nil {
		return nil, fmt.Errorf("%w: nil jetstream or consumer", consumer.ErrInvalidOption)
	}
	if opts.PollWait < 0 {
		return nil, fmt.Errorf("%w: PollWait %v is negative", consumer.ErrInvalidOption, opts.PollWait)
	}
	if opts.PollWait == 0 {
		opts.PollWait = time.Second
	}
	if opts.PollWait < 10*time.Millisecond {
		return nil, fmt.Errorf("%w: PollWait %v is below 10ms", consumer.ErrInvalidOption, opts.PollWait)
	}
	if opts.Confirm < ConfirmBatch || opts.Confirm > ConfirmNone {
		return nil, fmt.Errorf("%w: Confirm %v", consumer.ErrInvalidOption, opts.Confirm)
	}
	if opts.AckTimeout < 0 {
		return nil, fmt.Errorf("%w: AckTimeout %v is negative", consumer.ErrInvalidOption, opts.AckTimeout)
	}
	if opts.AckTimeout == 0 {
		opts.AckTimeout = 5 * time.Second
	}
	info := cons.CachedInfo()
	if info == nil {
		return nil, fmt.Errorf("%w: consumer has no cached info", consumer.ErrInvalidOption)
	}
	if info.Config.AckPolicy != jetstream.AckExplicitPolicy {
		return nil, fmt.Errorf("%w: consumer %q must use AckPolicy explicit", consumer.ErrInvalidOption, info.Name)
	}
	if info.Config.DeliverSubject != "" {
		return nil, fmt.Errorf("%w: consumer %q is a push consumer", consumer.ErrInvalidOption, info.Name)
	}
	jo := js.Options()
	prefix := jetstream.DefaultAPIPrefix
	switch {
	case jo.Domain != "":
		prefix = "$JS." + jo.Domain + ".API."
	case jo.APIPrefix != "":
		prefix = jo.APIPrefix
		if prefix[len(prefix)-1] != '.' {
			prefix += "."
		}
	}
	nc := js.Conn()
	s := &Source{
		js:       js,
		cons:     cons,
		nc:       nc,
		opts:     opts,
		stream:   info.Stream,
		name:     info.Name,
		next:     prefix + "CONSUMER.MSG.NEXT." + info.Stream + "." + info.Name,
		set:      newSettler(natsConn{nc}, wallClock, opts.AckTimeout, opts.Confirm == ConfirmBatch),
		infoAt:   time.Now(),
		ackFloor: info.AckFloor.Stream,
	}
	if opts.Recover != nil && !opts.NoRecover {
		s.rec = &recoverer{src: s, sink: opts.Recover, acked: map[uint64]struct{}{}}
	}
	return s, nil
}

// NewSourceFor creates or updates the durable or ephemeral consumer cfg on
// stream, with AckPolicy explicit, and wraps it. If the consumer is
// deleted on the server while the Source runs, the Source recreates it
// (see ErrConsumerDeleted).
//
// MaxAckPending 0 (the default) lets the Source size it, once the route
// that attaches it states its window: the window plus a reserve for
// delayed naks (retry backoff, shed messages, failed
// dead-letter writes), which JetStream keeps ack-pending until they are
// redelivered. The reserve starts at max(window, 256) and the Source
// raises MaxAckPending (never lowers it) when delayed naks take half of
// it, up to 65,536 above the window. A value you set is kept; below the
// window it is an error wrapping consumer.ErrInvalidOption (the broker
// would stall the route below its window). When several processes share
// one durable and you set it, leave room for their windows and their
// delayed naks.
func NewSourceFor(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig, opts SourceOptions) (*Source, error) {
	if cfg.AckPolicy != jetstream.AckExplicitPolicy && cfg.AckPolicy != 0 {
		return nil, fmt.Errorf("%w: AckPolicy must be explicit", consumer.ErrInvalidOption)
	}
	cfg.AckPolicy = jetstream.AckExplicitPolicy
	auto := cfg.MaxAckPending == 0
	if auto {
		// Until the route attaches the Source and states its window, the
		// consumer gets the reserve alone; the first Fetch raises it to
		// the window plus the reserve.
		cfg.MaxAckPending = minDelayReserve
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, err
	}
	s, err := NewSource(js, cons, opts)
	if err != nil {
		return nil, err
	}
	if cfg.Durable == "" && cfg.Name == "" {
		cfg.Name = s.name // an ephemeral: recreate it under the name the server gave it
	}
	s.owned = &cfg
	s.autoAckPending = auto
	return s, nil
}

// Consumer returns the wrapped JetStream consumer (after a recreation, the
// new one).
func (s *Source) Consumer() jetstream.Consumer {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cons
}

func (s *Source) info() *jetstream.ConsumerInfo { return s.Consumer().CachedInfo() }

// Attach implements consumer.Source: the Source sizes its pull replies from
// the route's window and, when it sizes the consumer's MaxAckPending itself
// (NewSourceFor with MaxAckPending 0), the window plus a reserve for
// delayed naks (set on the server by the first Fetch). It refuses a
// consumer whose MaxAckPending you set below the window (the server would
// stall the route under it), and reports the consumer's AckWait and
// MaxDeliver, and its readiness (SourceInfo.Ready: the connection is up
// and the last pull was not refused).
func (s *Source) Attach(l consumer.RouteLimits) (consumer.SourceInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.route != "" && s.route != l.Route {
		return consumer.SourceInfo{}, fmt.Errorf("%w: natsadapter source for consumer %q already serves route %q", consumer.ErrInvalidOption, s.name, s.route)
	}
	info := s.cons.CachedInfo()
	if info != nil && !s.autoAckPending {
		if mp := info.Config.MaxAckPending; mp > 0 && mp < l.Messages {
			return consumer.SourceInfo{}, fmt.Errorf("%w: consumer %q has MaxAckPending %d, below the route window %d", consumer.ErrInvalidOption, s.name, mp, l.Messages)
		}
	}
	s.route, s.window = l.Route, l.Messages
	if s.rec == nil && !s.opts.NoRecover && l.DeadLetter != nil {
		// The default recovery writes into the route's own sink.
		s.rec = &recoverer{src: s, sink: l.DeadLetter, acked: map[uint64]struct{}{}}
	}
	if s.autoAckPending {
		s.reserve = initialDelayReserve(l.Messages)
		s.sizeNow = true
	}
	return consumer.SourceInfo{AckWait: s.ackWaitLocked(info), MaxDeliver: s.maxDeliverLocked(info), Ready: s.readyNow}, nil
}

// readyNow is SourceInfo.Ready: nil while the connection is up and the
// last pull was not refused; otherwise why not (the connection's status,
// or the pull's error: the consumer deleted, JetStream unavailable).
func (s *Source) readyNow() error {
	s.mu.Lock()
	closed := s.closed
	s.mu.Unlock()
	if closed {
		return fmt.Errorf("natsadapter: consumer %q: %w", s.name, consumer.ErrClosed)
	}
	if st := s.nc.Status(); st != nats.CONNECTED {
		return fmt.Errorf("natsadapter: consumer %q: connection %s", s.name, st)
	}
	if e := s.pullErr.Load(); e != nil {
		return *e
	}
	return nil
}

// AckWait returns the consumer's AckWait (the route keeps what it holds
// alive with InProgress at a third of it).
func (s *Source) AckWait() time.Duration { return s.ackWaitLocked(s.info()) }

func (s *Source) ackWaitLocked(info *jetstream.ConsumerInfo) time.Duration {
	if info != nil && info.Config.AckWait > 0 {
		return info.Config.AckWait
	}
	return 30 * time.Second // the server default
}

// MaxDeliver returns the consumer's MaxDeliver (<= 0: unlimited), so the
// route refuses more attempts than the server will deliver and dead-letters
// the last delivery instead of nak'ing it away.
func (s *Source) MaxDeliver() int { return s.maxDeliverLocked(s.info()) }

func (s *Source) maxDeliverLocked(info *jetstream.ConsumerInfo) int {
	if info != nil {
		return info.Config.MaxDeliver
	}
	return 0
}

// Close drops the Source's subscriptions. Fetch then returns
// consumer.ErrClosed. Deliveries of the last pull request that no Fetch
// returned (the route stopped reading) are nak'd first, in the order they
// came, so they come back at once rather than after AckWait. Settlements
// still waiting for the server's answer complete with ErrAckUnconfirmed
// (the broker redelivers those messages unless the settlement landed);
// later settlements fail. Call it after the consumer's Run returned.
func (s *Source) Close() error {
	s.returnUnread()
	s.mu.Lock()
	s.closed = true
	sub := s.sub
	s.sub = nil
	s.mu.Unlock()
	if s.rec != nil {
		s.rec.stop()
	}
	err := s.set.close()
	if sub != nil {
		if uerr := sub.Unsubscribe(); uerr != nil && !errors.Is(uerr, nats.ErrConnectionClosed) && !errors.Is(uerr, nats.ErrBadSubscription) {
			err = errors.Join(err, uerr)
		}
	}
	return err
}
