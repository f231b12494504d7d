package natsadapter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
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
	// AckAsync acks with a plain Ack instead of a server-confirmed one:
	// faster, but an ack lost on the way is not noticed (the message is
	// redelivered after AckWait, a duplicate).
	AckAsync bool
	// KeyHeader names the header whose value becomes Message.Key. ""
	// means Nats-Msg-Id.
	KeyHeader string
	// Window, when > 0, is the route's MaxInFlight: NewSource then refuses
	// a consumer whose MaxAckPending is below it (the server would stall
	// the route under its window). NewSourceFor sets it.
	Window int
	// AckTimeout bounds a confirmed ack when the caller's ctx has no
	// deadline: a reply lost with a connection must not hold a worker (and
	// its window slot) forever. The delivery is then redelivered after
	// AckWait. 0 means 5 s.
	AckTimeout time.Duration
}

// ErrPull wraps a pull request the server refused for a reason other than
// "no messages" or "timeout" (for example 409 Consumer Deleted). The route
// counts it as a fetch error and retries with backoff.
var ErrPull = errors.New("natsadapter: pull request refused")

// Source is a consumer.Source over a JetStream pull consumer. Fetch is meant
// for one route's fetch loop; acks may come from any goroutine.
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
// and settles deliveries with the nats.Msg ack methods.
type Source struct {
	cons   jetstream.Consumer
	nc     *nats.Conn
	opts   SourceOptions
	stream string
	name   string
	next   string // the pull request subject

	mu     sync.Mutex
	sub    *nats.Subscription
	inbox  string
	closed bool

	// Used by the fetch loop only.
	seq uint64
	req openRequest
}

var (
	_ consumer.Source          = (*Source)(nil)
	_ consumer.AckWaiter       = (*Source)(nil)
	_ consumer.DeliveryLimiter = (*Source)(nil)
)

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
	if opts.KeyHeader == "" {
		opts.KeyHeader = jetstream.MsgIDHeader
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
	if mp := info.Config.MaxAckPending; opts.Window > 0 && mp > 0 && mp < opts.Window {
		return nil, fmt.Errorf("%w: consumer %q has MaxAckPending %d, below the route window %d", consumer.ErrInvalidOption, info.Name, mp, opts.Window)
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
	return &Source{
		cons:   cons,
		nc:     js.Conn(),
		opts:   opts,
		stream: info.Stream,
		name:   info.Name,
		next:   prefix + "CONSUMER.MSG.NEXT." + info.Stream + "." + info.Name,
	}, nil
}

// NewSourceFor creates or updates the durable or ephemeral consumer cfg on
// stream, with AckPolicy explicit and MaxAckPending at least window (0
// means window; a smaller value is an error wrapping
// consumer.ErrInvalidOption, since the broker would then stall the route
// below its window), and wraps it. When several processes share one
// durable, set MaxAckPending to the sum of their windows.
func NewSourceFor(ctx context.Context, js jetstream.JetStream, stream string, cfg jetstream.ConsumerConfig, window int, opts SourceOptions) (*Source, error) {
	if window <= 0 {
		return nil, fmt.Errorf("%w: window must be > 0, got %d", consumer.ErrInvalidOption, window)
	}
	if cfg.AckPolicy != jetstream.AckExplicitPolicy && cfg.AckPolicy != 0 {
		return nil, fmt.Errorf("%w: AckPolicy must be explicit", consumer.ErrInvalidOption)
	}
	cfg.AckPolicy = jetstream.AckExplicitPolicy
	switch {
	case cfg.MaxAckPending == 0:
		cfg.MaxAckPending = window
	case cfg.MaxAckPending > 0 && cfg.MaxAckPending < window:
		return nil, fmt.Errorf("%w: MaxAckPending %d is below the route window %d", consumer.ErrInvalidOption, cfg.MaxAckPending, window)
	}
	cons, err := js.CreateOrUpdateConsumer(ctx, stream, cfg)
	if err != nil {
		return nil, err
	}
	opts.Window = window
	return NewSource(js, cons, opts)
}

// Consumer returns the wrapped JetStream consumer.
func (s *Source) Consumer() jetstream.Consumer { return s.cons }

// AckWait returns the consumer's AckWait, so the consumer keeps long
// handlers alive with InProgress.
func (s *Source) AckWait() time.Duration {
	if info := s.cons.CachedInfo(); info != nil {
		if info.Config.AckWait > 0 {
			return info.Config.AckWait
		}
	}
	return 30 * time.Second // the server default
}

// MaxDeliver returns the consumer's MaxDeliver (<= 0: unlimited), so the
// route refuses more attempts than the server will deliver and dead-letters
// the last delivery instead of nak'ing it away (consumer.DeliveryLimiter).
func (s *Source) MaxDeliver() int {
	if info := s.cons.CachedInfo(); info != nil {
		return info.Config.MaxDeliver
	}
	return 0
}

// Close drops the Source's reply subscription. Fetch then returns
// consumer.ErrClosed. Deliveries already handed out can still be settled.
func (s *Source) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	if s.sub != nil {
		err := s.sub.Unsubscribe()
		s.sub = nil
		if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrBadSubscription) {
			return nil
		}
		return err
	}
	return nil
}

// subscription returns the reply subscription, made on first use.
func (s *Source) subscription() (*nats.Subscription, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, consumer.ErrClosed
	}
	if s.sub == nil || !s.sub.IsValid() {
		inbox := s.nc.NewInbox()
		sub, err := s.nc.SubscribeSync(inbox + ".*")
		if err != nil {
			if errors.Is(err, nats.ErrConnectionClosed) {
				return nil, fmt.Errorf("natsadapter: %w: %w", consumer.ErrClosed, err)
			}
			return nil, err
		}
		s.sub, s.inbox = sub, inbox
		s.req = openRequest{}
	}
	return s.sub, nil
}

// openRequest is the pull request still being served: what the server may
// still deliver for it. At most one is open; it was sized from free window
// capacity that stays free until its messages arrive, so the route's window
// always covers held messages plus what is still on its way.
type openRequest struct {
	reply    string
	msgs     int
	bytes    int64 // as the server counts them; 0: no byte limit
	limited  bool
	deadline time.Time // when to give up on it (connection lost)
}

// Fetch returns deliveries of one pull request for up to maxMessages
// messages totalling at most maxBytes. It sends the request, waits for the
// first delivery (at most PollWait), and returns what has arrived by then;
// the rest of the same request streams into the next Fetch calls, which
// send a new request only once it is over. When the next message alone is
// larger than maxBytes (the server answers 409 Message Size Exceeds
// MaxBytes before delivering anything), it pulls that one message without a
// byte limit and returns it alone.
func (s *Source) Fetch(ctx context.Context, maxMessages int, maxBytes int64) ([]*consumer.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if maxMessages <= 0 {
		return nil, nil
	}
	msgs, tooBig, err := s.pull(ctx, maxMessages, maxBytes)
	if tooBig && len(msgs) == 0 && err == nil {
		msgs, _, err = s.pull(ctx, 1, 0)
	}
	return msgs, err
}

func (s *Source) send(n int, maxBytes int64) error {
	s.seq++
	reply := s.inbox + "." + strconv.FormatUint(s.seq, 36)
	// Encoded by hand: it is three numbers, on every pull.
	req := make([]byte, 0, 96)
	req = append(req, `{"batch":`...)
	req = strconv.AppendInt(req, int64(n), 10)
	if maxBytes > 0 {
		req = append(req, `,"max_bytes":`...)
		req = strconv.AppendInt(req, maxBytes, 10)
	}
	req = append(req, `,"expires":`...)
	req = strconv.AppendInt(req, int64(s.opts.PollWait), 10)
	req = append(req, `,"no_wait":true}`...)
	if err := s.nc.PublishRequest(s.next, reply, req); err != nil {
		return s.connErr(err)
	}
	s.req = openRequest{reply: reply, msgs: n, bytes: maxBytes, limited: maxBytes > 0,
		deadline: time.Now().Add(s.opts.PollWait + s.opts.PollWait/2)}
	return nil
}

func (s *Source) pull(ctx context.Context, n int, maxBytes int64) (out []*consumer.Message, tooBig bool, err error) {
	sub, err := s.subscription()
	if err != nil {
		return nil, false, err
	}
	if s.req.msgs == 0 {
		if err := s.send(n, maxBytes); err != nil {
			return nil, false, err
		}
	}
	// The open request was sized from capacity that is still free, so it
	// never brings more than asked now; cap anyway.
	n = min(n, s.req.msgs)
	// The server ends the request itself (a status, the count, or the
	// bytes); the deadline only covers a request lost with a connection.
	wctx, cancel := context.WithDeadline(ctx, s.req.deadline)
	defer cancel()
	for len(out) < n {
		var m *nats.Msg
		if len(out) > 0 {
			// Hand over what has arrived; the rest of this request comes
			// with the next call, while the workers are busy.
			if pending, _, _ := sub.Pending(); pending == 0 {
				return out, false, nil
			}
		}
		m, err = sub.NextMsgWithContext(wctx)
		if err != nil {
			if cerr := ctx.Err(); cerr != nil {
				// Shutting down: take what already arrived, so the
				// consumer hands it back now rather than after AckWait.
				for len(out) < n {
					m, err := sub.NextMsg(time.Millisecond)
					if err != nil {
						break
					}
					if len(m.Data) > 0 || m.Header.Get("Status") == "" {
						out = append(out, s.convert(m))
					}
				}
				s.req = openRequest{}
				return out, false, cerr
			}
			s.req = openRequest{}
			if errors.Is(err, context.DeadlineExceeded) {
				return out, false, nil
			}
			return out, false, s.connErr(err)
		}
		if st := m.Header.Get("Status"); st != "" && len(m.Data) == 0 {
			if m.Subject != s.req.reply {
				continue // the end of an earlier request that was given up
			}
			switch st {
			case "100": // idle heartbeat
				continue
			case "404", "408": // nothing (more) now; expired
				s.req = openRequest{}
				return out, false, nil
			case "409":
				s.req = openRequest{}
				d := m.Header.Get("Description")
				if d == "Message Size Exceeds MaxBytes" {
					return out, len(out) == 0, nil
				}
				return out, false, fmt.Errorf("%w: 409 %s", ErrPull, d)
			default:
				s.req = openRequest{}
				return out, false, fmt.Errorf("%w: %s %s", ErrPull, st, m.Header.Get("Description"))
			}
		}
		// Deliveries carry the stream subject, not the reply: a late one
		// for an earlier, given-up request (its connection dropped) is
		// taken as part of this one. It was asked for by this route's
		// window too, so it is at most one batch over, and the consumer
		// charges it like any other.
		out = append(out, s.convert(m))
		s.req.msgs--
		if s.req.limited {
			// At exactly maxBytes the server ends the request without a
			// status; count the way it does (subject, reply, header, data).
			s.req.bytes -= int64(len(m.Subject)+len(m.Reply)+len(m.Data)) + headerLen(m.Header)
			if s.req.bytes <= 0 {
				s.req = openRequest{}
			}
		}
		if s.req.msgs <= 0 {
			s.req = openRequest{}
			return out, false, nil
		}
	}
	return out, false, nil
}

// headerLen is the wire length of h as nats.go encodes it.
func headerLen(h nats.Header) int64 {
	if len(h) == 0 {
		return 0
	}
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return int64(n)
}

func (s *Source) connErr(err error) error {
	if errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, nats.ErrBadSubscription) {
		s.mu.Lock()
		closed := s.closed
		s.mu.Unlock()
		if closed || s.nc.IsClosed() {
			return fmt.Errorf("natsadapter: %w: %w", consumer.ErrClosed, err)
		}
	}
	return fmt.Errorf("natsadapter: pull: %w", err)
}

func (s *Source) convert(m *nats.Msg) *consumer.Message {
	a := &acker{m: m, src: s}
	cm := &a.msg
	cm.Topic = m.Subject
	cm.Value = m.Data
	cm.Headers = consumer.Headers(m.Header)
	cm.Acker = a
	cm.Origin = dlq.Origin{Topic: m.Subject, Stream: s.stream, Group: s.name, Partition: -1}
	if v := cm.Headers.Get(s.opts.KeyHeader); v != "" {
		cm.Key = []byte(v)
	}
	size := int64(len(m.Data))
	for k, vs := range m.Header {
		for _, v := range vs {
			size += int64(len(k) + len(v))
		}
	}
	cm.Size = max(size, 1)
	if md, ok := parseAck(m.Reply); ok {
		cm.PublishedAt = md.timestamp
		cm.Attempt = int(md.delivered)
		cm.Origin.Sequence = md.streamSeq
		cm.Origin.Stream = md.stream
		cm.Origin.Group = md.consumer
	}
	return cm
}

// acker settles one delivery; the Message shares its allocation.
type acker struct {
	msg consumer.Message
	m   *nats.Msg
	src *Source
}

func (a *acker) Ack(ctx context.Context) error {
	if a.src.opts.AckAsync {
		return a.m.Ack()
	}
	if _, ok := ctx.Deadline(); ok {
		return a.m.AckSync(nats.Context(ctx))
	}
	return a.m.AckSync(nats.AckWait(a.src.opts.AckTimeout))
}

func (a *acker) Nak(_ context.Context, delay time.Duration) error {
	if delay <= 0 {
		return a.m.Nak()
	}
	return a.m.NakWithDelay(delay)
}

// Term terminates the delivery. nats.Msg.Term carries no reason, so the
// +TERM with a reason is published directly (the reason shows up in the
// server's advisory).
func (a *acker) Term(_ context.Context, reason string) error {
	if reason == "" {
		return a.m.Term()
	}
	if a.m.Reply == "" {
		return nats.ErrMsgNoReply
	}
	return a.src.nc.Publish(a.m.Reply, []byte("+TERM "+reason))
}

func (a *acker) InProgress(context.Context) error { return a.m.InProgress() }

// MetadataOf returns the JetStream metadata of a message this package's
// Source delivered (as nats.go parses it), for handlers that need more than
// Message.Attempt, PublishedAt and Origin.
func MetadataOf(m *consumer.Message) (*nats.MsgMetadata, error) {
	a, ok := m.Acker.(*acker)
	if !ok {
		return nil, fmt.Errorf("%w: not a natsadapter delivery", consumer.ErrInvalidOption)
	}
	return a.m.Metadata()
}
