package natsadapter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
)

// SourceOptions configure a Source. The zero value is usable.
type SourceOptions struct {
	// PollWait is the longest one Fetch waits for messages. 0 means 1 s.
	PollWait time.Duration
	// AckAsync acks with a plain Ack instead of DoubleAck: faster, but an
	// ack lost on the way is not noticed (the message is redelivered).
	AckAsync bool
	// KeyHeader names the header whose value becomes Message.Key. ""
	// means Nats-Msg-Id.
	KeyHeader string
}

// Source is a consumer.Source over a JetStream pull consumer. It is safe for
// one route's fetch loop; Acks may come from any goroutine.
type Source struct {
	jetstream.Consumer
	opts   SourceOptions
	stream string
	name   string
}

var (
	_ consumer.Source    = (*Source)(nil)
	_ consumer.AckWaiter = (*Source)(nil)
)

// NewSource wraps cons, which should use AckPolicy explicit.
func NewSource(cons jetstream.Consumer, opts SourceOptions) (*Source, error) {
	if cons == nil {
		return nil, fmt.Errorf("%w: nil jetstream consumer", consumer.ErrInvalidOption)
	}
	if opts.PollWait < 0 {
		return nil, fmt.Errorf("%w: PollWait %v is negative", consumer.ErrInvalidOption, opts.PollWait)
	}
	if opts.PollWait == 0 {
		opts.PollWait = time.Second
	}
	if opts.KeyHeader == "" {
		opts.KeyHeader = jetstream.MsgIDHeader
	}
	info := cons.CachedInfo()
	if info == nil {
		return nil, fmt.Errorf("%w: consumer has no cached info", consumer.ErrInvalidOption)
	}
	if info.Config.AckPolicy != jetstream.AckExplicitPolicy {
		return nil, fmt.Errorf("%w: consumer %q must use AckPolicy explicit", consumer.ErrInvalidOption, info.Name)
	}
	return &Source{Consumer: cons, opts: opts, stream: info.Stream, name: info.Name}, nil
}

// NewSourceFor creates or updates the durable or ephemeral consumer cfg on
// stream, with AckPolicy explicit and MaxAckPending at least window (0
// means window; a smaller value is an error wrapping
// consumer.ErrInvalidOption, since the broker would then stall the route
// below its window), and wraps it.
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
	return NewSource(cons, opts)
}

// AckWait returns the consumer's AckWait, so the consumer keeps long
// handlers alive with InProgress.
func (s *Source) AckWait() time.Duration {
	if info := s.CachedInfo(); info != nil {
		if info.Config.AckWait > 0 {
			return info.Config.AckWait
		}
	}
	return 30 * time.Second // the server default
}

// Fetch asks the server for up to maxMessages messages totalling at most
// maxBytes and waits at most PollWait. When the next message alone is larger
// than maxBytes, it fetches that one message without a byte limit and
// returns it alone.
func (s *Source) Fetch(ctx context.Context, maxMessages int, maxBytes int64) ([]*consumer.Message, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if maxMessages <= 0 {
		return nil, nil
	}
	start := time.Now()
	var opts []jetstream.FetchOpt
	if maxBytes > 0 {
		opts = append(opts, jetstream.FetchMaxBytes(int(min(maxBytes, int64(1<<31-1)))))
	}
	msgs, err := s.fetch(ctx, maxMessages, opts)
	if err != nil || len(msgs) > 0 || ctx.Err() != nil {
		return msgs, s.ctxErr(ctx, err)
	}
	// An empty answer well before PollWait means the server turned the
	// request down: the next message does not fit in maxBytes (409 Message
	// Size Exceeds MaxBytes, which the client swallows). Fetch it alone.
	if maxBytes > 0 && time.Since(start) < s.opts.PollWait/2 {
		msgs, err = s.fetch(ctx, 1, nil)
		return msgs, s.ctxErr(ctx, err)
	}
	return nil, s.ctxErr(ctx, nil)
}

func (s *Source) ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil {
		return cerr
	}
	return err
}

// fetch sends one pull request bounded by PollWait. FetchMaxWait and
// FetchContext are exclusive in nats.go, so the wait is a context deadline.
func (s *Source) fetch(ctx context.Context, n int, opts []jetstream.FetchOpt) ([]*consumer.Message, error) {
	fctx, cancel := context.WithTimeout(ctx, s.opts.PollWait)
	defer cancel()
	batch, err := s.Consumer.Fetch(n, append(opts, jetstream.FetchContext(fctx))...)
	if err != nil {
		if errors.Is(err, jetstream.ErrNoMessages) || errors.Is(err, context.DeadlineExceeded) {
			return nil, nil
		}
		return nil, err
	}
	var out []*consumer.Message
	for m := range batch.Messages() {
		out = append(out, s.convert(m))
	}
	if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) &&
		!errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, context.Canceled) {
		// Messages already delivered are returned too: the consumer
		// settles them.
		return out, err
	}
	return out, nil
}

func (s *Source) convert(m jetstream.Msg) *consumer.Message {
	data := m.Data()
	hdr := m.Headers()
	cm := &consumer.Message{
		Topic:   m.Subject(),
		Value:   data,
		Headers: consumer.Headers(hdr),
		Acker:   &acker{m: m, async: s.opts.AckAsync},
		Origin:  dlq.Origin{Topic: m.Subject(), Stream: s.stream, Group: s.name, Partition: -1},
	}
	if cm.Headers == nil {
		cm.Headers = consumer.Headers{}
	}
	if v := cm.Headers.Get(s.opts.KeyHeader); v != "" {
		cm.Key = []byte(v)
	}
	size := int64(len(data))
	for k, vs := range hdr {
		for _, v := range vs {
			size += int64(len(k) + len(v))
		}
	}
	cm.Size = max(size, 1)
	if md, err := m.Metadata(); err == nil {
		cm.PublishedAt = md.Timestamp
		cm.Attempt = int(md.NumDelivered)
		cm.Origin.Sequence = md.Sequence.Stream
		if md.Stream != "" {
			cm.Origin.Stream = md.Stream
		}
		if md.Consumer != "" {
			cm.Origin.Group = md.Consumer
		}
	}
	return cm
}

type acker struct {
	m     jetstream.Msg
	async bool
}

func (a *acker) Ack(ctx context.Context) error {
	if a.async {
		return a.m.Ack()
	}
	return a.m.DoubleAck(ctx)
}

func (a *acker) Nak(_ context.Context, delay time.Duration) error {
	if delay <= 0 {
		return a.m.Nak()
	}
	return a.m.NakWithDelay(delay)
}

func (a *acker) Term(_ context.Context, reason string) error {
	if reason == "" {
		return a.m.Term()
	}
	return a.m.TermWithReason(reason)
}

func (a *acker) InProgress(context.Context) error { return a.m.InProgress() }
