package natsadapter

import (
	"context"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/adapterkit"
)

// delivery is one JetStream delivery: the Message handed to the route, the
// nats.Msg it came in, and its settlement, in one allocation.
type delivery struct {
	msg consumer.Message
	m   *nats.Msg
	src *Source
	gen uint32 // src.gen when delivered
	p   pendingSettle
	// pending says the route awaits the outcome through consumer.Confirm.
	pending bool
}

// settleRedelivery settles m itself, without handing it to the route, when
// it is a redelivery of a stream message whose Ack or Term from an earlier
// delivery is still waiting for the server's answer: the handler already
// ran to its end for that message, so m gets the same settlement. This is
// what happens when a server reads an ack and goes down before applying
// it: after the restart it redelivers the message while the client still
// re-sends the first ack. m's settlement is not confirmed (if it is lost,
// the server redelivers m later and the route handles it then).
func (s *Source) settleRedelivery(m *nats.Msg, md ackMeta) bool {
	if md.delivered < 2 || s.opts.Confirm == ConfirmNone {
		return false
	}
	body, ok := s.set.outstanding(md.streamSeq)
	if !ok || s.nc.Publish(m.Reply, body) != nil {
		return false
	}
	s.c.redeliveriesSettled.Add(1)
	return true
}

// take converts m for the route, or settles it when it is a redelivery
// settleRedelivery takes care of (nil).
func (s *Source) take(m *nats.Msg) *consumer.Message {
	md, ok := parseAck(m.Reply)
	if ok && s.settleRedelivery(m, md) {
		return nil
	}
	return s.convert(m, md, ok)
}

// convert builds the route's Message for m, in one allocation (the
// delivery). Its Key shares its bytes with the previous delivery's when
// the key is the same (the subject, or KeyHeader's value): read-only, like
// Value. Called by the fetch loop only.
func (s *Source) convert(m *nats.Msg, md ackMeta, hasMeta bool) *consumer.Message {
	d := &delivery{m: m, src: s, gen: s.gen.Load()}
	cm := &d.msg
	consumer.InitMessage(cm, d)
	cm.Topic = m.Subject
	cm.Value = m.Data
	cm.Headers = consumer.Headers(m.Header)
	cm.Origin = dlq.Origin{Topic: m.Subject, Stream: s.stream, Group: s.name, Partition: -1}
	key := m.Subject
	if s.opts.KeyHeader != "" {
		if v := m.Header.Get(s.opts.KeyHeader); v != "" {
			key = v
		}
	}
	if key != s.keyOf || s.lastKey == nil {
		s.lastKey, s.keyOf = []byte(key), key
	}
	cm.Key = s.lastKey
	size := int64(len(m.Data))
	for k, vs := range m.Header {
		for _, v := range vs {
			size += int64(len(k) + len(v))
		}
	}
	if len(m.Data) == 0 && m.Header.Get("Status") != "" {
		s.c.statusHeaders.Add(1)
	}
	cm.Size = max(size, 1)
	if hasMeta {
		cm.PublishedAt = md.timestamp
		cm.Attempt = int(md.delivered)
		cm.Origin.Sequence = md.streamSeq
		cm.Origin.Stream = md.stream
		cm.Origin.Group = md.consumer
	}
	return cm
}

func (d *delivery) generation() uint32 { return d.gen }

// settle hands one settlement of d to the Source's settler. d.settled
// receives the outcome exactly once.
func (d *delivery) settle(ctx context.Context, k settleKind, delay time.Duration, reason string) {
	if d.m.Reply == "" {
		d.settled(nats.ErrMsgNoReply)
		return
	}
	if d.gen != d.src.gen.Load() {
		d.settled(errOldConsumer)
		return
	}
	if k == kindNak && delay > 0 {
		d.src.delayed.add(time.Now().Add(delay).UnixNano())
	}
	d.p = pendingSettle{subj: d.m.Reply, body: settleBody(k, delay, reason), kind: k,
		confirm: d.src.opts.Confirm != ConfirmNone, seq: d.msg.Origin.Sequence, d: d}
	d.src.set.settle(ctx, &d.p)
}

// errOldConsumer completes a settlement of a delivery from a consumer that
// was deleted and recreated since: the new consumer delivers the message
// again.
var errOldConsumer = fmt.Errorf("natsadapter: settle: %w (the message is delivered again by the recreated consumer)", ErrConsumerDeleted)

// settled receives the outcome of d's settlement.
func (d *delivery) settled(err error) {
	if err != nil && !d.p.confirm {
		d.src.c.settleErrors.Add(1)
	}
	if r := d.src.rec; r != nil && err == nil && d.p.confirm && d.p.kind != kindNak {
		if md := d.src.MaxDeliver(); md > 0 && d.msg.Attempt >= md {
			r.remember(d.msg.Origin.Sequence)
		}
	}
	if d.pending {
		consumer.Confirm(&d.msg, err)
	}
}

// Settle implements consumer.Acker. The settlement is queued for the
// Source's writer and Settle returns at once: with ConfirmNone it counts
// as done (nil); otherwise Settle returns consumer.ErrPending and the
// confirmation reaches the route through consumer.Confirm, so no worker
// and no fetch loop waits for a round trip while the message keeps its
// window slot. A Term carries its reason into the server's advisory.
func (d *delivery) Settle(ctx context.Context, s consumer.Settlement) error {
	k := kindAck
	switch s.Op {
	case consumer.SettleNak:
		k = kindNak
	case consumer.SettleTerm:
		k = kindTerm
	}
	if d.src.opts.Confirm == ConfirmNone {
		d.settle(ctx, k, s.Delay, s.Reason)
		return nil
	}
	d.pending = true
	d.settle(ctx, k, s.Delay, s.Reason)
	return consumer.ErrPending
}

// InProgress extends the delivery's ack deadline (+WPI, not confirmed).
func (d *delivery) InProgress(context.Context) error {
	if d.m.Reply == "" {
		return nats.ErrMsgNoReply
	}
	return d.src.nc.Publish(d.m.Reply, bodyWPI)
}

// MetadataOf returns the JetStream metadata of a message this package's
// Source delivered (as nats.go parses it), for handlers that need more than
// Message.Attempt, PublishedAt and Origin.
func MetadataOf(m *consumer.Message) (*nats.MsgMetadata, error) {
	d, ok := adapterkit.AckerOf(m).(*delivery)
	if !ok {
		return nil, fmt.Errorf("%w: not a natsadapter delivery", consumer.ErrInvalidOption)
	}
	return d.m.Metadata()
}
