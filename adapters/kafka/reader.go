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
)

// ReaderOptions configure NewReaderSource. Window is required; the other
// fields mean what they mean in Config, with the same defaults.
type ReaderOptions struct {
	Window             Window
	PrefetchMessages   int
	PrefetchBytes      int64
	PollWait           time.Duration
	CommitInterval     time.Duration
	CommitEvery        int
	LocalRetryMaxDelay time.Duration
	Clock              consumer.Clock
	OnCommit           func(generation int32, offsets map[string]map[int]int64)
}

type readerState struct {
	r     *kafka.Reader
	mu    sync.Mutex
	parts map[topicPartition]*partition
	kick  chan struct{}
	wg    sync.WaitGroup
}

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
func NewReaderSource(r *kafka.Reader, opts ReaderOptions) (*Source, error) {
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
		Cluster: &Cluster{Brokers: rc.Brokers}, GroupID: rc.GroupID, Topics: topics, Window: opts.Window,
		PrefetchMessages: opts.PrefetchMessages, PrefetchBytes: opts.PrefetchBytes, PollWait: opts.PollWait,
		CommitInterval: opts.CommitInterval, CommitEvery: opts.CommitEvery,
		LocalRetryMaxDelay: opts.LocalRetryMaxDelay, Clock: opts.Clock, OnCommit: opts.OnCommit,
	}
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Source{cfg: cfg, clock: cfg.Clock, done: make(chan struct{}), ready: make(chan struct{})}
	close(s.ready)
	if s.clock == nil {
		s.clock = sysClock{}
	}
	s.buf = newBuffer(cfg.PrefetchMessages, cfg.PrefetchBytes)
	s.rd = &readerState{r: r, parts: map[topicPartition]*partition{}, kick: make(chan struct{}, 1)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.rd.wg.Add(2)
	go func() { defer s.rd.wg.Done(); s.pump() }()
	go func() { defer s.rd.wg.Done(); s.readerCommits() }()
	go func() { s.rd.wg.Wait(); close(s.done) }()
	return s, nil
}

// readerPartition returns the tracking state for a message at offset,
// starting afresh when the Reader went back below what it delivered.
func (s *Source) readerPartition(topic string, id int, offset int64) *partition {
	rd := s.rd
	rd.mu.Lock()
	defer rd.mu.Unlock()
	k := topicPartition{topic, id}
	if p := rd.parts[k]; p != nil {
		if p.wm.Deliver(offset) {
			return p
		}
		// A rewind: the Reader re-joined and starts from the committed
		// offset. Deliveries of the old run are settled nowhere.
		p.gen.ending.Store(true)
		p.gen.revoked.Store(true)
		s.stats.dropped.Add(int64(s.buf.purge(p.gen)))
	}
	s.stats.generations.Add(1)
	g := &generation{src: s, id: -1, kick: rd.kick}
	p := &partition{gen: g, topic: topic, id: id, wm: NewWatermark()}
	g.parts = []*partition{p}
	p.wm.Deliver(offset)
	rd.parts[k] = p
	return p
}

func (s *Source) pump() {
	ctx := s.ctx
	backoff := 20 * time.Millisecond
	for {
		grant, err := s.buf.reserve(ctx, 1)
		if err != nil {
			return
		}
		m, err := s.rd.r.FetchMessage(ctx)
		if err != nil {
			s.buf.unreserve(grant)
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
		p := s.readerPartition(m.Topic, m.Partition, m.Offset)
		r := newRecord(p, m.Offset, m.Key, m.Value, m.Headers, m.Time)
		// The Reader does not deliver a message twice: keep it even if it
		// takes the buffer past its budget (by one message at most).
		s.buf.force(grant, r)
		s.buf.publish(p, []*record{r})
	}
}

func (s *Source) readerCommits() {
	t := time.NewTicker(s.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			s.readerCommit(ctx)
			cancel()
			return
		case <-t.C:
		case <-s.rd.kick:
		}
		s.readerCommit(s.ctx)
	}
}

func (s *Source) readerCommit(ctx context.Context) {
	s.rd.mu.Lock()
	var msgs []kafka.Message
	var parts []*partition
	var offs []int64
	offsets := map[string]map[int]int64{}
	for _, p := range s.rd.parts {
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
	s.rd.mu.Unlock()
	if len(msgs) == 0 {
		return
	}
	if err := s.rd.r.CommitMessages(ctx, msgs...); err != nil {
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
