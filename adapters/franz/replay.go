package franzadapter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync/atomic"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/kafkacore"
)

// ReplayTarget is a dlq.Target writing to Kafka through a kgo producer. A
// message goes back to its letter's original partition when it is
// replayed to its origin topic and that topic still has the partition
// count it had when the letter was written (HeaderOriginPartitions, kept
// in the letter's headers by the letter source); otherwise, or with
// Rehash, it is partitioned by key with murmur2, like a Java producer
// (records without a key round robin). Headers keep their original order
// and duplicates. Publish returns after the client's acks (kgo's default:
// all in-sync replicas) have the message.
type ReplayTarget struct {
	cl     *kgo.Client
	rehash bool
	rr     atomic.Uint32
}

var _ dlq.BatchTarget = (*ReplayTarget)(nil)

// ReplayTargetOptions configure NewReplayTarget.
type ReplayTargetOptions struct {
	// Rehash partitions every message by its key (murmur2) instead of
	// sending it back to its original partition.
	Rehash bool
}

// NewReplayTarget returns a target writing through a producer client
// built from opts (brokers, TLS, SASL, producer tuning; no consumer
// options), to which it adds kgo.ManualPartitioner: it chooses each
// message's partition itself. Close closes that client.
func NewReplayTarget(o ReplayTargetOptions, opts ...kgo.Opt) (*ReplayTarget, error) {
	cl, err := kgo.NewClient(append(slices.Clone(opts), kgo.RecordPartitioner(kgo.ManualPartitioner()))...)
	if err != nil {
		return nil, fmt.Errorf("%w: franz replay target: %v", dlq.ErrInvalidOption, err)
	}
	if g, _ := cl.OptValue(kgo.ConsumerGroup).(string); g != "" {
		cl.Close()
		return nil, fmt.Errorf("%w: franz replay target: the options name a consumer group (%s): give it producer options only", dlq.ErrInvalidOption, g)
	}
	return &ReplayTarget{cl: cl, rehash: o.Rehash}, nil
}

// Publish writes m and waits for the acknowledgement.
func (t *ReplayTarget) Publish(ctx context.Context, m *dlq.Outgoing) error {
	if errs := t.PublishBatch(ctx, []*dlq.Outgoing{m}); errs != nil {
		return errs[0]
	}
	return nil
}

// PublishBatch writes ms in one call and returns nil when the client's
// acks have them all, else one error per message. A topic that does not
// exist or a message it refuses as too large is dlq.ErrUndeliverable.
func (t *ReplayTarget) PublishBatch(ctx context.Context, ms []*dlq.Outgoing) []error {
	errs := make([]error, len(ms))
	recs := make([]*kgo.Record, 0, len(ms))
	idx := make([]int, 0, len(ms))
	counts := map[string]int{}
	failed := false
	for i, m := range ms {
		n, ok := counts[m.Topic]
		if !ok {
			n = partitions(ctx, t.cl, m.Topic)
			counts[m.Topic] = n
		}
		if n == 0 {
			errs[i], failed = fmt.Errorf("%w: franzadapter: replay to %q: no such topic (or no metadata)", dlq.ErrUndeliverable, m.Topic), true
			continue
		}
		recs = append(recs, &kgo.Record{Topic: m.Topic, Key: m.Key, Value: m.Value, Partition: t.partition(m, n),
			Headers: kafkacore.WireHeaders(m.Headers, kafkacore.MetaPrefix, []kgo.RecordHeader(nil))})
		idx = append(idx, i)
	}
	if len(recs) > 0 {
		for j, res := range t.cl.ProduceSync(ctx, recs...) {
			if e := res.Err; e != nil {
				switch {
				case errors.Is(e, kerr.UnknownTopicOrPartition), errors.Is(e, kerr.MessageTooLarge),
					errors.Is(e, kerr.RecordListTooLarge), errors.Is(e, kerr.InvalidTopicException):
					e = fmt.Errorf("%w: franzadapter: replay to %q: %w", dlq.ErrUndeliverable, recs[j].Topic, e)
				default:
					e = fmt.Errorf("franzadapter: replay to %q: %w", recs[j].Topic, e)
				}
				errs[idx[j]], failed = e, true
			}
		}
	}
	if !failed {
		return nil
	}
	return errs
}

// partition is m's partition of a topic with n partitions.
func (t *ReplayTarget) partition(m *dlq.Outgoing, n int) int32 {
	if l := m.Letter; !t.rehash && l != nil && l.Origin.Topic == m.Topic && l.Origin.Partition >= 0 && int(l.Origin.Partition) < n {
		if v := l.Headers[kafkacore.MetaOriginPartitions]; len(v) > 0 {
			if c, err := strconv.Atoi(v[0]); err == nil && c == n {
				return l.Origin.Partition
			}
		}
	}
	if m.Key != nil {
		return int32(kafkacore.KeyPartition(m.Key, n))
	}
	return int32(t.rr.Add(1) % uint32(n))
}

// Close closes the target's client.
func (t *ReplayTarget) Close() error {
	t.cl.Close()
	return nil
}
