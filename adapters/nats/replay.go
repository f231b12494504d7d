package natsadapter

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-go/sluice/dlq"
)

// ErrStreamMissing is returned by NewLetterSource and GetLetter when the
// stream does not exist.
var ErrStreamMissing = errors.New("natsadapter: stream not found")

// ErrReplayDeduplicated is returned by ReplayTarget.Publish when the target
// stream dropped the republish as a duplicate of the producer's own
// Nats-Msg-Id: the original was published less than the stream's duplicate
// window ago. The letter stays in the DLQ; replay it after the window.
var ErrReplayDeduplicated = errors.New("natsadapter: replay deduplicated by the target stream")

// Defaults of the parking destination (letters over the loop guard).
const (
	DefaultParkStream  = "SLUICE_PARKED"
	DefaultParkSubject = "sluice.parked"
)

// LetterSourceOptions configure a LetterSource.
type LetterSourceOptions struct {
	// Stream to read. "" means DefaultDLQStream.
	Stream string
	// Subject filters the stream ("sluice.dlq.orders", wildcards allowed).
	// "" means every subject.
	Subject string
	// Backlog reads plain messages instead of dead letters, for a paced
	// backlog drain: each message becomes a Letter with its key (the
	// Nats-Msg-Id), value, headers and origin (subject, stream, sequence),
	// and LastFailure set to its publish time.
	Backlog bool
	// PollWait is how long Fetch waits between polls when the stream has
	// letters it has not delivered yet. 0 means 50 ms.
	PollWait time.Duration
	// InactiveThreshold is how long the server keeps the pass's consumer
	// without a fetch (a crashed replay leaves it behind that long). Keep
	// it above the time between two batches. 0 means 10 minutes.
	InactiveThreshold time.Duration
}

// LetterSource is a dlq.Source over a JetStream stream, normally the
// dead-letter stream a DeadLetterSink writes.
//
// It reads with an ephemeral pull consumer (AckNone, from the first
// message) and removes a letter by deleting it from the stream: the
// dead-letter stream has limits retention, so an ack would not remove
// anything. A pass covers the letters stored when the source was created;
// letters written later (say, a replayed message dying again) wait for the
// next pass, so a replay cannot chase its own tail. Resume is a new source:
// what was deleted is gone, what was not is read again.
//
// One LetterSource per replay; two replays of the same stream and subject
// at once would both republish every letter.
type LetterSource struct {
	js      jetstream.JetStream
	stream  jetstream.Stream
	cons    jetstream.Consumer
	name    string
	opts    LetterSourceOptions
	lastSeq uint64

	mu        sync.Mutex
	remaining int
	done      bool
}

var (
	_ dlq.Source = (*LetterSource)(nil)
	_ dlq.Sizer  = (*LetterSource)(nil)
)

// NewLetterSource opens a pass over the stream. Close deletes its consumer.
func NewLetterSource(ctx context.Context, js jetstream.JetStream, opts LetterSourceOptions) (*LetterSource, error) {
	if opts.Stream == "" {
		opts.Stream = DefaultDLQStream
	}
	if opts.PollWait <= 0 {
		opts.PollWait = 50 * time.Millisecond
	}
	if opts.InactiveThreshold <= 0 {
		opts.InactiveThreshold = 10 * time.Minute
	}
	st, err := openStream(ctx, js, opts.Stream)
	if err != nil {
		return nil, err
	}
	info, err := st.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("natsadapter: stream %q: %w", opts.Stream, err)
	}
	cfg := jetstream.ConsumerConfig{
		AckPolicy:         jetstream.AckNonePolicy,
		DeliverPolicy:     jetstream.DeliverAllPolicy,
		InactiveThreshold: opts.InactiveThreshold,
		MemoryStorage:     true,
		Description:       "sluice replay",
	}
	if opts.Subject != "" {
		cfg.FilterSubject = opts.Subject
	}
	cons, err := st.CreateConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("natsadapter: replay consumer on %q: %w", opts.Stream, err)
	}
	ci := cons.CachedInfo()
	s := &LetterSource{js: js, stream: st, cons: cons, name: ci.Name, opts: opts,
		lastSeq: info.State.LastSeq, remaining: int(ci.NumPending)}
	return s, nil
}

func openStream(ctx context.Context, js jetstream.JetStream, name string) (jetstream.Stream, error) {
	st, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("%w: %q", ErrStreamMissing, name)
	}
	if err != nil {
		return nil, fmt.Errorf("natsadapter: stream %q: %w", name, err)
	}
	return st, nil
}

// Stream returns the stream's name.
func (s *LetterSource) Stream() string { return s.opts.Stream }

// Remaining returns how many letters of the pass are not fetched yet.
func (s *LetterSource) Remaining() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return max(s.remaining, 0)
}

// Fetch returns up to n letters, or dlq.ErrDrained when the pass is over.
func (s *LetterSource) Fetch(ctx context.Context, n int) ([]*dlq.Pending, error) {
	if n <= 0 {
		n = 1
	}
	for {
		s.mu.Lock()
		done := s.done
		s.mu.Unlock()
		if done {
			return nil, dlq.ErrDrained
		}
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		batch, err := s.cons.FetchNoWait(n)
		if err != nil {
			return nil, fmt.Errorf("natsadapter: fetch letters: %w", err)
		}
		var out []*dlq.Pending
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				continue
			}
			if md.Sequence.Stream > s.lastSeq {
				s.mu.Lock()
				s.done = true // written after the pass began
				s.mu.Unlock()
				continue
			}
			out = append(out, s.pending(m.Subject(), md.Sequence.Stream, m.Data(), m.Headers(), md.Timestamp))
		}
		if err := batch.Error(); err != nil && !errors.Is(err, jetstream.ErrNoMessages) && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("natsadapter: fetch letters: %w", err)
		}
		s.mu.Lock()
		s.remaining -= len(out)
		s.mu.Unlock()
		if len(out) > 0 {
			return out, nil
		}
		info, err := s.cons.Info(ctx)
		if err != nil {
			return nil, fmt.Errorf("natsadapter: replay consumer: %w", err)
		}
		if info.NumPending == 0 {
			s.mu.Lock()
			s.done = true
			s.mu.Unlock()
			continue
		}
		t := time.NewTimer(s.opts.PollWait)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return nil, ctx.Err()
		}
	}
}

func (s *LetterSource) pending(subject string, seq uint64, data []byte, h nats.Header, ts time.Time) *dlq.Pending {
	p := &dlq.Pending{Pos: s.opts.Stream + "#" + strconv.FormatUint(seq, 10)}
	p.Letter, p.Err = decodeLetter(subject, seq, data, h, ts, s.opts.Stream, s.opts.Backlog)
	st := s.stream
	p.Remove = func(ctx context.Context) error {
		err := st.DeleteMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			return nil // already gone (purged, or removed by an earlier try)
		}
		return err
	}
	return p
}

func decodeLetter(subject string, seq uint64, data []byte, h nats.Header, ts time.Time, stream string, backlog bool) (*dlq.Letter, error) {
	if backlog {
		l := &dlq.Letter{Value: data, Headers: map[string][]string(h), LastFailure: ts, FirstFailure: ts,
			Origin: dlq.Origin{Topic: subject, Stream: stream, Sequence: seq, Partition: -1}}
		if id := h.Get(jetstream.MsgIDHeader); id != "" {
			l.Key = []byte(id)
		}
		if l.Headers == nil {
			l.Headers = map[string][]string{}
		}
		l.Replays = dlq.ParseReplayCount(h.Get(dlq.HeaderReplayCount))
		return l, nil
	}
	var key []byte
	orig := h.Get(HeaderOriginalMsgID)
	if orig != "" {
		key = []byte(orig)
	}
	l, err := dlq.Decode(key, data, map[string][]string(h))
	if err != nil {
		return nil, fmt.Errorf("%s#%d: %w", stream, seq, err)
	}
	// The stored Nats-Msg-Id is the sink's dedup id of the DLQ write; the
	// producer's own, if any, was moved aside and goes back.
	delete(l.Headers, jetstream.MsgIDHeader)
	if orig != "" {
		l.Headers[jetstream.MsgIDHeader] = []string{orig}
	}
	return l, nil
}

// Close deletes the pass's consumer (the server would after
// InactiveThreshold).
func (s *LetterSource) Close(ctx context.Context) error {
	if err := s.stream.DeleteConsumer(ctx, s.name); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("natsadapter: delete replay consumer: %w", err)
	}
	return nil
}

// GetLetter reads the letter stored at seq in stream, with its stored time.
func GetLetter(ctx context.Context, js jetstream.JetStream, stream string, seq uint64) (*dlq.Letter, time.Time, error) {
	if stream == "" {
		stream = DefaultDLQStream
	}
	st, err := openStream(ctx, js, stream)
	if err != nil {
		return nil, time.Time{}, err
	}
	m, err := st.GetMsg(ctx, seq)
	if err != nil {
		return nil, time.Time{}, fmt.Errorf("natsadapter: %s#%d: %w", stream, seq, err)
	}
	l, err := decodeLetter(m.Subject, seq, m.Data, m.Header, m.Time, stream, false)
	return l, m.Time, err
}

// ReplayTarget is a dlq.Target publishing to JetStream: Publish returns
// after the PubAck of the stream that captures the subject.
//
// Deduplication: a letter whose original message had a Nats-Msg-Id is
// republished with that id (its key, as the producer set it). If the target
// stream reports a duplicate, the original is still inside the stream's
// duplicate window and the republish was dropped: Publish returns
// ErrReplayDeduplicated and the letter stays. A letter without one is
// published with Nats-Msg-Id "sluice-replay:<dlq position>", so a republish
// retried after a crash (published, not yet deleted) is dropped by the
// server instead of landing twice; that duplicate report is a success.
type ReplayTarget struct {
	js jetstream.JetStream
}

var _ dlq.Target = (*ReplayTarget)(nil)

// NewReplayTarget returns a target publishing through js.
func NewReplayTarget(js jetstream.JetStream) *ReplayTarget { return &ReplayTarget{js: js} }

// ReplayMsgIDPrefix starts the Nats-Msg-Id of a republished letter that had
// none of its own.
const ReplayMsgIDPrefix = "sluice-replay:"

// Publish publishes m and waits for the PubAck.
func (t *ReplayTarget) Publish(ctx context.Context, m *dlq.Outgoing) error {
	h := nats.Header(m.Headers)
	id := h.Get(jetstream.MsgIDHeader)
	// An id of an earlier replay is not the producer's: it would collide
	// with that replay inside the duplicate window.
	own := id != "" && !strings.HasPrefix(id, ReplayMsgIDPrefix)
	if !own {
		h.Set(jetstream.MsgIDHeader, ReplayMsgIDPrefix+m.Pos)
	}
	ack, err := t.js.PublishMsg(ctx, &nats.Msg{Subject: m.Topic, Data: m.Value, Header: h})
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) {
		// No responders can be a stream leader moving: undeliverable only
		// when no stream is configured for the subject.
		if _, serr := t.js.StreamNameBySubject(ctx, m.Topic); errors.Is(serr, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("%w: natsadapter: replay to %q: no stream captures that subject", dlq.ErrUndeliverable, m.Topic)
		}
		return fmt.Errorf("natsadapter: replay to %q: no stream answered: %w", m.Topic, err)
	}
	var apiErr *jetstream.APIError
	if errors.Is(err, nats.ErrMaxPayload) || (errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamMessageExceedsMaximum) {
		return fmt.Errorf("%w: natsadapter: replay to %q: the message is larger than the stream or server allows: %v", dlq.ErrUndeliverable, m.Topic, err)
	}
	if err != nil {
		return fmt.Errorf("natsadapter: replay to %q: %w", m.Topic, err)
	}
	if ack.Duplicate && own {
		return fmt.Errorf("%w: %q on %s", ErrReplayDeduplicated, h.Get(jetstream.MsgIDHeader), ack.Stream)
	}
	return nil
}

// NewParkSink returns the parking destination for letters over the loop
// guard: a DeadLetterSink on DefaultParkStream (subjects sluice.parked.>),
// created if missing. Parked letters keep their envelope, so the same tools
// list and show them (sluice dlq ls --stream SLUICE_PARKED).
func NewParkSink(ctx context.Context, js jetstream.JetStream) (*DeadLetterSink, error) {
	return NewDeadLetterSink(ctx, js, SinkOptions{Stream: DefaultParkStream, SubjectPrefix: DefaultParkSubject})
}
