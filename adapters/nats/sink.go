package natsadapter

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-go/sluice/dlq"
)

// Defaults of SinkOptions.
const (
	DefaultDLQStream  = "SLUICE_DLQ"
	DefaultDLQSubject = "sluice.dlq"
)

// SinkOptions configure a DeadLetterSink.
type SinkOptions struct {
	// Stream is the dead-letter stream. "" means DefaultDLQStream.
	Stream string
	// SubjectPrefix: letters go to <prefix>.<route>. "" means DefaultDLQSubject.
	SubjectPrefix string
}

// DeadLetterSink is a dlq.Sink that publishes letters to a JetStream stream.
// Write returns after the server's PubAck; a retried write of the same
// letter is deduplicated through Nats-Msg-Id.
type DeadLetterSink struct {
	js     jetstream.JetStream
	stream string
	prefix string
}

var _ dlq.Sink = (*DeadLetterSink)(nil)

// NewDeadLetterSink creates the stream if missing (file storage, limits
// retention, subjects <prefix>.>) and returns the sink.
func NewDeadLetterSink(ctx context.Context, js jetstream.JetStream, opts SinkOptions) (*DeadLetterSink, error) {
	if opts.Stream == "" {
		opts.Stream = DefaultDLQStream
	}
	if opts.SubjectPrefix == "" {
		opts.SubjectPrefix = DefaultDLQSubject
	}
	opts.SubjectPrefix = strings.TrimSuffix(opts.SubjectPrefix, ".")
	_, err := js.Stream(ctx, opts.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		_, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:      opts.Stream,
			Subjects:  []string{opts.SubjectPrefix + ".>"},
			Storage:   jetstream.FileStorage,
			Retention: jetstream.LimitsPolicy,
		})
	}
	if err != nil {
		return nil, fmt.Errorf("natsadapter: dead-letter stream %q: %w", opts.Stream, err)
	}
	return &DeadLetterSink{js: js, stream: opts.Stream, prefix: opts.SubjectPrefix}, nil
}

// Stream returns the dead-letter stream's name.
func (s *DeadLetterSink) Stream() string { return s.stream }

// Subject returns the subject letters of route are published to.
func (s *DeadLetterSink) Subject(route string) string {
	if route == "" {
		route = "_"
	}
	return s.prefix + "." + sanitize(route)
}

// HeaderOriginalMsgID keeps the producer's Nats-Msg-Id on a dead letter:
// the letter's own Nats-Msg-Id is the dedup id of the DLQ write.
const HeaderOriginalMsgID = dlq.HeaderPrefix + "Original-Msg-Id"

// Write publishes l and waits for the PubAck.
func (s *DeadLetterSink) Write(ctx context.Context, l *dlq.Letter) error {
	h := nats.Header(l.EnvelopeHeaders())
	if id := h.Get(jetstream.MsgIDHeader); id != "" {
		h.Set(HeaderOriginalMsgID, id)
		h.Del(jetstream.MsgIDHeader)
	}
	msg := &nats.Msg{Subject: s.Subject(l.Route), Data: l.Value, Header: h}
	id := fmt.Sprintf("%s:%d:%d", l.Origin.Stream, l.Origin.Sequence, l.Attempts)
	if _, err := s.js.PublishMsg(ctx, msg, jetstream.WithMsgID(id)); err != nil {
		return fmt.Errorf("natsadapter: dead letter: %w", err)
	}
	return nil
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case '.', '*', '>', ' ', '\t', '\r', '\n':
			return '_'
		}
		return r
	}, s)
}
