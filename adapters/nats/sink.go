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
// Write returns after the server's PubAck.
//
// Every write of one message's letter carries the same Nats-Msg-Id (see
// DedupID), so a write the stream stored but whose PubAck was lost, retried
// in process or after a redelivery, is dropped by the server as a
// duplicate within the stream's duplicate window (2 minutes by default;
// keep it above AckWait × MaxDeliver if redeliveries retry writes).
//
// A letter is made to fit the server's limits (dlq.Letter.Encode): original
// headers too large for JetStream's 64 KiB header limit move into the
// stored value, and what still exceeds the stream's maximum message size
// is cut with a Sluice-Dlq-Truncated marker.
type DeadLetterSink struct {
	js     jetstream.JetStream
	stream string
	prefix string
	limits dlq.Limits
}

// StoreMetadataKey marks a stream as a sluice dead-letter store in its
// metadata; purge tools refuse streams without it (or without letters).
const StoreMetadataKey = "sluice.store"

// Values of StoreMetadataKey.
const (
	StoreDeadLetters = "dead-letters"
)

// maxHeaderBytes is JetStream's limit on a stored message's headers.
const maxHeaderBytes = 65535

// sinkReserve is a margin below the server's limits; Write also subtracts
// the headers it adds after Encode (Nats-Msg-Id, the producer's moved id).
const sinkReserve = 64

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
	st, err := js.Stream(ctx, opts.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = js.CreateStream(ctx, jetstream.StreamConfig{
			Name:        opts.Stream,
			Description: "sluice dead letters",
			Subjects:    []string{opts.SubjectPrefix + ".>"},
			Storage:     jetstream.FileStorage,
			Retention:   jetstream.LimitsPolicy,
			Metadata:    map[string]string{StoreMetadataKey: StoreDeadLetters},
		})
	}
	if err != nil {
		return nil, fmt.Errorf("natsadapter: dead-letter stream %q: %w", opts.Stream, err)
	}
	maxBytes := int(js.Conn().MaxPayload())
	if m := int(st.CachedInfo().Config.MaxMsgSize); m > 0 && (maxBytes <= 0 || m < maxBytes) {
		maxBytes = m
	}
	lim := dlq.Limits{MaxHeaderBytes: maxHeaderBytes - sinkReserve}
	if maxBytes > 0 {
		lim.MaxBytes = max(maxBytes-sinkReserve, 1)
	}
	return &DeadLetterSink{js: js, stream: opts.Stream, prefix: opts.SubjectPrefix, limits: lim}, nil
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
	// The producer's Nats-Msg-Id moves aside: the letter's own is the
	// dedup id of this write.
	lc := *l
	var producerID string
	if ids := l.Headers[jetstream.MsgIDHeader]; len(ids) > 0 {
		producerID = ids[0]
		lc.Headers = make(map[string][]string, len(l.Headers))
		for k, v := range l.Headers {
			if k != jetstream.MsgIDHeader {
				lc.Headers[k] = v
			}
		}
	}
	id := DedupID(l)
	lim := s.limits
	added := 0
	if id != "" {
		added += len(jetstream.MsgIDHeader) + len(id) + 4
	}
	if producerID != "" {
		added += len(HeaderOriginalMsgID) + len(producerID) + 4
	}
	lim.MaxHeaderBytes -= added
	lim.HeaderSize = storableHeaderSize(lim.MaxHeaderBytes)
	if lim.MaxBytes > 0 {
		lim.MaxBytes = max(lim.MaxBytes-added, 1)
	}
	_, value, headers := lc.Encode(lim)
	h := nats.Header(headers)
	if producerID != "" {
		h.Set(HeaderOriginalMsgID, producerID)
	}
	msg := &nats.Msg{Subject: s.Subject(l.Route), Data: value, Header: h}
	var opts []jetstream.PublishOpt
	if id != "" {
		opts = append(opts, jetstream.WithMsgID(id))
	}
	if _, err := s.js.PublishMsg(ctx, msg, opts...); err != nil {
		return fmt.Errorf("natsadapter: dead letter: %w", err)
	}
	return nil
}

// storableHeaderSize is the size of h as NATS encodes it (see
// dlq.NATSHeaderSize), or more than maxHeader when NATS cannot store an
// original header of h as it is: then dlq.Letter.Encode packs the original
// headers into the stored value, and dlq.Decode (show, replay) restores
// them byte for byte. Such headers come from Kafka records dead-lettered
// into a NATS store: a name that is empty or holds a space, a colon, a
// control byte or another character nats.go refuses (the publish fails, so
// the letter could never be written), or a value NATS would change (a
// CR or LF, which nats.go replaces, leading or trailing blanks, which it
// trims, or another control byte).
func storableHeaderSize(maxHeader int) func(h map[string][]string) int {
	return func(h map[string][]string) int {
		n := dlq.NATSHeaderSize(h)
		for k, vs := range h {
			if strings.HasPrefix(k, dlq.HeaderPrefix) {
				continue // the envelope: names of sluice's, values bounded by dlq
			}
			if !validHeaderName(k) {
				return n + maxHeader + 1
			}
			for _, v := range vs {
				if !storableHeaderValue(v) {
					return n + maxHeader + 1
				}
			}
		}
		return n
	}
}

// validHeaderName reports whether nats.go publishes a header named k:
// printable ASCII without space and without "()/,:;<=>?@[\]{} (ADR-4, as
// nats.go checks it).
func validHeaderName(k string) bool {
	if k == "" {
		return false
	}
	for i := 0; i < len(k); i++ {
		c := k[i]
		if c < 33 || c > 126 || strings.IndexByte(`"()/,:;<=>?@[\]{}`, c) >= 0 {
			return false
		}
	}
	return true
}

// storableHeaderValue reports whether NATS stores and returns v unchanged:
// no control byte (nats.go replaces CR and LF), no leading or trailing
// blank (trimmed on write and on read).
func storableHeaderValue(v string) bool {
	if v == "" {
		return true
	}
	if v[0] == ' ' || v[len(v)-1] == ' ' {
		return false
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < 0x20 || c == 0x7f {
			return false
		}
	}
	return true
}

// DedupID is the Nats-Msg-Id of l's write: the same for every retry of one
// message's letter, different for every other message. It names the
// origin (JetStream stream and sequence, or Kafka topic, partition and
// offset), the consumer group or durable and the route; "" when the
// letter names no origin position (then a retried write may store the
// letter twice: nothing is lost).
func DedupID(l *dlq.Letter) string {
	o := l.Origin
	switch {
	case o.Stream != "" && o.Sequence > 0:
		return fmt.Sprintf("sluice-dlq:%s:%d:%s:%s", o.Stream, o.Sequence, o.Group, l.Route)
	case o.Topic != "" && o.Partition >= 0:
		return fmt.Sprintf("sluice-dlq:%s/%d@%d:%s:%s", o.Topic, o.Partition, o.Offset, o.Group, l.Route)
	}
	return ""
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
