package kafkaadapter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/kafkacore"
)

// ReaderOptions configure NewReaderSource. The fields mean what they mean
// in Config, with the same defaults; the window comes from the route.
type ReaderOptions struct {
	PrefetchMessages   int
	PrefetchBytes      int64
	PollWait           time.Duration
	CommitInterval     time.Duration
	CommitEvery        int
	LocalRetryMaxDelay time.Duration
	Clock              consumer.Clock
	OnCommit           func(generation int32, offsets map[string]map[int]int64)
}

// ReaderSource is a consumer.Source over an application's own group
// *kafka.Reader: the same prefetch bound, hand-out and watermarks as
// Source, fed by Reader.FetchMessage and committed with
// Reader.CommitMessages. See NewReaderSource for what the plain Reader
// cannot do.
type ReaderSource struct {
	feed
	r     *kafka.Reader
	mu    sync.Mutex
	parts map[topicPartition]*partition
	kick  chan struct{}
	wg    sync.WaitGroup
}

var _ consumer.Source = (*ReaderSource)(nil)

type topicPartition struct {
	topic string
	id    int
}

// NewReaderSource wraps an application's existing group Reader (its
// GroupID must be set) as a Source: messages come from r.FetchMessage,
// and each partition's watermark is committed with r.CommitMessages every
// CommitInterval. Give r CommitInterval 0 (synchronous commits): the Source
// batches commits itself and must learn whether they were accepted.
//
// The plain Reader hides rebalances, so this Source cannot see a
// partition being revoked: it keeps committing watermarks for partitions it
// no longer owns (the broker accepts them from a current member), which can
// move the group's offset back below what the new owner committed. That
// never loses a message (a watermark covers only settled work) but causes
// duplicates. When the Reader delivers an offset below one already
// delivered (the partition came back from its committed offset), the
// Source starts that partition afresh and drops settlements of the old
// deliveries. Memory: besides PrefetchBytes, the Reader holds up to its
// QueueCapacity messages and one MaxBytes fetch per partition. Prefer
// NewSource (for example with ConfigFromReader) where rebalance safety
// matters.
//
// Close stops fetching and commits once more; it does not close r.
func NewReaderSource(r *kafka.Reader, opts ReaderOptions) (*ReaderSource, error) {
	if r == nil {
		return nil, fmt.Errorf("%w: nil kafka.Reader", consumer.ErrInvalidOption)
	}
	rc := r.Config()
	if rc.GroupID == "" {
		return nil, fmt.Errorf("%w: the Reader has no GroupID; sluice commits through a consumer group", consumer.ErrInvalidOption)
	}
	topics := rc.GroupTopics
	if len(topics) == 0 {
		topics = []string{rc.Topic}
	}
	cfg := Config{
		Cluster: &Cluster{Brokers: rc.Brokers}, GroupID: rc.GroupID, Topics: topics,
		PrefetchMessages: opts.PrefetchMessages, PrefetchBytes: opts.PrefetchBytes, PollWait: opts.PollWait,
		CommitInterval: opts.CommitInterval, CommitEvery: opts.CommitEvery,
		LocalRetryMaxDelay: opts.LocalRetryMaxDelay, Clock: opts.Clock, OnCommit: opts.OnCommit,
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &ReaderSource{r: r, parts: map[topicPartition]*partition{}, kick: make(chan struct{}, 1)}
	s.feed.init(cfg)
	return s, nil
}

// Attach implements consumer.Source: the ReaderSource sizes its prefetch
// from the route's window and starts reading from the Reader. It serves
// one route.
func (s *ReaderSource) Attach(l consumer.RouteLimits) (consumer.SourceInfo, error) {
	return s.feed.attach(l, func() {
		s.wg.Add(2)
		go func() { defer s.wg.Done(); s.pump() }()
		go func() { defer s.wg.Done(); s.commits() }()
		go func() { s.wg.Wait(); close(s.done) }()
	})
}

// Close stops fetching and commits once more; it does not close the
// Reader. Messages not settled by then are delivered again. It is safe to
// call more than once.
func (s *ReaderSource) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.cancel()
	if s.started.Load() {
		<-s.done
	}
	return nil
}

// Stats returns a snapshot of the counters (Generation is -1: the Reader
// hides generations).
func (s *ReaderSource) Stats() Stats { return s.feed.snapshot() }

// readerPartition returns the tracking state for a message at offset,
// starting afresh when the Reader went back below what it delivered.
func (s *ReaderSource) partition(topic string, id int, offset int64) *partition {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := topicPartition{topic, id}
	if p := s.parts[k]; p != nil {
		if p.wm.Deliver(offset) {
			return p
		}
		// A rewind: the Reader re-joined and starts from the committed
		// offset. Deliveries of the old run are settled nowhere.
		p.gen.Ending.Store(true)
		p.gen.revoked.Store(true)
		s.stats.dropped.Add(int64(s.buf.Purge(&p.gen.Gen)))
	}
	s.stats.generations.Add(1)
	g := &generation{src: &s.feed, id: -1, kick: s.kick}
	p := &partition{gen: g, Part: kafkacore.Part[*record]{Gen: &g.Gen}, topic: topic, id: id, wm: NewWatermark()}
	g.parts = []*partition{p}
	p.wm.Deliver(offset)
	s.parts[k] = p
	return p
}

func (s *ReaderSource) pump() {
	ctx := s.ctx
	backoff := 20 * time.Millisecond
	for {
		grant, _, err := s.buf.Reserve(ctx, 1, nil)
		if err != nil {
			return
		}
		m, err := s.r.FetchMessage(ctx)
		if err != nil {
			s.buf.Unreserve(grant)
			if ctx.Err() != nil || errors.Is(err, io.EOF) {
				return
			}
			s.stats.fetchErrors.Add(1)
			select {
			case <-ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(backoff*2, time.Second)
			continue
		}
		backoff = 20 * time.Millisecond
		s.stats.fetched.Add(1)
		p := s.partition(m.Topic, m.Partition, m.Offset)
		r := newRecord(p, m.Offset, m.Key, m.Value, m.Headers, m.Time)
		// The Reader does not deliver a message twice: keep it even if it
		// takes the buffer past its budget (by one message at most).
		s.buf.Force(grant, r)
		s.buf.Publish(&p.Part, []*record{r})
	}
}

func (s *ReaderSource) commits() {
	t := time.NewTicker(s.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s.commit(ctx)
			cancel()
			return
		case <-t.C:
		case <-s.kick:
		}
		s.commit(s.ctx)
	}
}

func (s *ReaderSource) commit(ctx context.Context) {
	s.mu.Lock()
	var msgs []kafka.Message
	var parts []*partition
	var offs []int64
	offsets := map[string]map[int]int64{}
	for _, p := range s.parts {
		if off, ok := p.wm.Commit(); ok {
			// CommitMessages commits the message's offset + 1.
			msgs = append(msgs, kafka.Message{Topic: p.topic, Partition: p.id, Offset: off - 1})
			parts, offs = append(parts, p), append(offs, off)
			if offsets[p.topic] == nil {
				offsets[p.topic] = map[int]int64{}
			}
			offsets[p.topic][p.id] = off
			p.gen.settled.Store(0)
		}
	}
	s.mu.Unlock()
	if len(msgs) == 0 {
		return
	}
	if err := s.r.CommitMessages(ctx, msgs...); err != nil {
		s.stats.commitErrors.Add(1)
		return
	}
	for i, p := range parts {
		p.wm.Committed(offs[i])
	}
	s.stats.commits.Add(1)
	if s.cfg.OnCommit != nil {
		s.cfg.OnCommit(-1, offsets)
	}
}
