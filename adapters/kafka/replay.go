package kafkaadapter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
)

// DefaultReplayGroup is the consumer group whose committed offsets mark how
// far a replay of a dead-letter topic got.
const DefaultReplayGroup = "sluice-replay"

// ErrTopicMissing is returned by NewLetterSource when the topic does not
// exist.
var ErrTopicMissing = errors.New("kafkaadapter: topic not found")

// LetterSourceConfig configures a LetterSource.
type LetterSourceConfig struct {
	Brokers []string
	// Topic is the dead-letter topic (or any backlog topic with Backlog).
	Topic string
	// Group is the replay's consumer group: a pass starts at its committed
	// offsets and commits what it settled. "" means DefaultReplayGroup.
	Group string
	// Backlog reads plain records instead of dead letters: each becomes a
	// Letter with its key, value, headers and origin, LastFailure set to
	// its timestamp.
	Backlog bool
	// ReadTimeout bounds the wait for one record of a partition that should
	// have more; a partition that stays silent that long (its tail is
	// transaction markers, say) is taken as read. 0 means 2 s.
	ReadTimeout time.Duration
	// Transport carries the requests; nil means one of the source's own,
	// closed by Close.
	Transport *kafka.Transport
}

// LetterSource is a dlq.Source over a Kafka topic, read partition by
// partition (no group membership, so no rebalance wait) from the replay
// group's committed offsets up to the end offsets seen when it was
// created: letters written during the pass wait for the next one.
//
// Kafka cannot delete one record, so "removed" means committed: each
// partition's commit is the offset below which every letter handed out was
// settled — republished, parked, or passed over (Pending.Leave: filtered
// out, held, malformed; this group will not see those again, the topic
// still holds them for another group). A letter whose republish failed
// holds its partition's commit back, so it and everything after it are
// read again by the next pass. Commits go out before each fetch and in
// Close; a crash in between republishes at most the letters settled since
// the last commit (Kafka has no per-message deduplication).
type LetterSource struct {
	cfg       LetterSourceConfig
	client    *kafka.Client
	transport *kafka.Transport
	owned     bool

	mu    sync.Mutex
	parts []*replayPart
	cur   int
}

type replayPart struct {
	id        int
	r         *kafka.Reader
	next, end int64 // next offset to read; end offset of the pass
	committed int64 // last committed
	handed    []int64
	settled   map[int64]bool
	exhausted bool
}

var (
	_ dlq.Source = (*LetterSource)(nil)
	_ dlq.Sizer  = (*LetterSource)(nil)
)

// NewLetterSource opens a pass over the topic. Close commits and closes it.
func NewLetterSource(ctx context.Context, cfg LetterSourceConfig) (*LetterSource, error) {
	if len(cfg.Brokers) == 0 || cfg.Topic == "" {
		return nil, fmt.Errorf("%w: letter source needs Brokers and a Topic", consumer.ErrInvalidOption)
	}
	if cfg.Group == "" {
		cfg.Group = DefaultReplayGroup
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = 2 * time.Second
	}
	s := &LetterSource{cfg: cfg, transport: cfg.Transport}
	if s.transport == nil {
		s.transport, s.owned = &kafka.Transport{}, true
	}
	s.client = &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: s.transport, Timeout: 10 * time.Second}
	if err := s.open(ctx); err != nil {
		s.closeTransport()
		return nil, err
	}
	return s, nil
}

func (s *LetterSource) open(ctx context.Context) error {
	topic := s.cfg.Topic
	meta, err := s.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
	if err != nil {
		return fmt.Errorf("kafkaadapter: metadata of %q: %w", topic, err)
	}
	var ids []int
	for _, t := range meta.Topics {
		if t.Name != topic {
			continue
		}
		if errors.Is(t.Error, kafka.UnknownTopicOrPartition) {
			return fmt.Errorf("%w: %q", ErrTopicMissing, topic)
		}
		if t.Error != nil {
			return fmt.Errorf("kafkaadapter: topic %q: %w", topic, t.Error)
		}
		for _, p := range t.Partitions {
			ids = append(ids, p.ID)
		}
	}
	if len(ids) == 0 {
		return fmt.Errorf("%w: %q", ErrTopicMissing, topic)
	}
	slices.Sort(ids)
	var reqs []kafka.OffsetRequest
	for _, id := range ids {
		reqs = append(reqs, kafka.FirstOffsetOf(id), kafka.LastOffsetOf(id))
	}
	lo, err := s.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return fmt.Errorf("kafkaadapter: offsets of %q: %w", topic, err)
	}
	first, last := map[int]int64{}, map[int]int64{}
	for _, po := range lo.Topics[topic] {
		if po.Error != nil {
			return fmt.Errorf("kafkaadapter: offsets of %s/%d: %w", topic, po.Partition, po.Error)
		}
		first[po.Partition], last[po.Partition] = po.FirstOffset, po.LastOffset
	}
	of, err := s.client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: s.cfg.Group, Topics: map[string][]int{topic: ids}})
	if err != nil {
		return fmt.Errorf("kafkaadapter: committed offsets of group %q: %w", s.cfg.Group, err)
	}
	committed := map[int]int64{}
	switch {
	case errors.Is(of.Error, kafka.GroupIdNotFound): // a group that never committed (kfake says so)
	case of.Error != nil:
		return fmt.Errorf("kafkaadapter: committed offsets of group %q: %w", s.cfg.Group, of.Error)
	default:
		for _, p := range of.Topics[topic] {
			if p.Error == nil {
				committed[p.Partition] = p.CommittedOffset
			}
		}
	}
	for _, id := range ids {
		start := first[id]
		if c, ok := committed[id]; ok && c > start {
			start = c
		}
		p := &replayPart{id: id, next: start, end: last[id], committed: start, settled: map[int64]bool{}}
		s.parts = append(s.parts, p)
		if start >= p.end {
			p.exhausted = true
		} else if err := s.startReader(p); err != nil {
			s.closeReaders()
			return err
		}
	}
	return nil
}

// Remaining returns how many records of the pass are not fetched yet (an
// upper bound: compaction and transaction markers leave gaps).
func (s *LetterSource) Remaining() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := int64(0)
	for _, p := range s.parts {
		if !p.exhausted {
			n += p.end - p.next
		}
	}
	return int(n)
}

// Fetch commits what was settled, then returns up to n letters from the
// partitions in turn, or dlq.ErrDrained when the pass is over.
func (s *LetterSource) Fetch(ctx context.Context, n int) ([]*dlq.Pending, error) {
	if err := s.Commit(ctx); err != nil {
		return nil, err
	}
	n = max(n, 1)
	var out []*dlq.Pending
	for tries := 0; len(out) < n && tries < len(s.parts); {
		s.mu.Lock()
		p := s.parts[s.cur]
		exhausted := p.exhausted
		s.mu.Unlock()
		if exhausted {
			s.cur = (s.cur + 1) % len(s.parts)
			tries++
			continue
		}
		got, err := s.readPart(ctx, p, n-len(out))
		if err != nil {
			return nil, err
		}
		out = append(out, got...)
		if len(out) < n {
			s.cur = (s.cur + 1) % len(s.parts)
			tries++
		}
	}
	if len(out) == 0 {
		return nil, dlq.ErrDrained
	}
	return out, nil
}

func (s *LetterSource) readPart(ctx context.Context, p *replayPart, n int) ([]*dlq.Pending, error) {
	if p.r == nil {
		if err := s.startReader(p); err != nil {
			return nil, err
		}
	}
	var out []*dlq.Pending
	for len(out) < n {
		s.mu.Lock()
		done := p.next >= p.end
		s.mu.Unlock()
		if done {
			break
		}
		rctx, cancel := context.WithTimeout(ctx, s.cfg.ReadTimeout)
		m, err := p.r.FetchMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if errors.Is(err, context.DeadlineExceeded) {
				break // nothing more readable below the end offset
			}
			return nil, fmt.Errorf("kafkaadapter: read %s/%d: %w", s.cfg.Topic, p.id, err)
		}
		s.mu.Lock()
		if m.Offset >= p.end {
			p.next = p.end
			s.mu.Unlock()
			break
		}
		p.next = m.Offset + 1
		p.handed = append(p.handed, m.Offset)
		s.mu.Unlock()
		out = append(out, s.pending(p, m))
	}
	s.mu.Lock()
	if p.next >= p.end || len(out) < n {
		p.exhausted = true
	}
	s.mu.Unlock()
	// An exhausted partition's reader is closed in Close, not here: closing
	// waits out its long-poll fetch, a stall in the middle of the pace.
	return out, nil
}

// startReader starts p's reader at p.next; it prefetches in the
// background, so a partition is ready when the pass turns to it.
func (s *LetterSource) startReader(p *replayPart) error {
	p.r = kafka.NewReader(kafka.ReaderConfig{Brokers: s.cfg.Brokers, Topic: s.cfg.Topic, Partition: p.id,
		MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 250 * time.Millisecond,
		Dialer: &kafka.Dialer{Timeout: 10 * time.Second}})
	if err := p.r.SetOffset(p.next); err != nil {
		_ = p.r.Close()
		p.r = nil
		return fmt.Errorf("kafkaadapter: %s/%d: %w", s.cfg.Topic, p.id, err)
	}
	return nil
}

func (s *LetterSource) pending(p *replayPart, m kafka.Message) *dlq.Pending {
	h := map[string][]string{}
	for _, kh := range m.Headers {
		h[kh.Key] = append(h[kh.Key], string(kh.Value))
	}
	pd := &dlq.Pending{Pos: fmt.Sprintf("%s/%d@%d", m.Topic, m.Partition, m.Offset)}
	if s.cfg.Backlog {
		l := &dlq.Letter{Key: m.Key, Value: m.Value, Headers: h, LastFailure: m.Time, FirstFailure: m.Time,
			Origin: dlq.Origin{Topic: m.Topic, Partition: int32(m.Partition), Offset: m.Offset}}
		if v := h[dlq.HeaderReplayCount]; len(v) > 0 {
			l.Replays, _ = strconv.Atoi(v[0])
		}
		pd.Letter = l
	} else {
		pd.Letter, pd.Err = dlq.Decode(m.Key, m.Value, h)
		if pd.Err != nil {
			pd.Letter, pd.Err = nil, fmt.Errorf("%s: %w", pd.Pos, pd.Err)
		}
	}
	off := m.Offset
	settle := func() {
		s.mu.Lock()
		p.settled[off] = true
		s.mu.Unlock()
	}
	pd.Remove = func(context.Context) error { settle(); return nil }
	pd.Leave = settle
	return pd
}

// Commit commits, per partition, the offset below which every letter handed
// out is settled, as a simple (memberless) commit of the replay group.
func (s *LetterSource) Commit(ctx context.Context) error {
	s.mu.Lock()
	var commits []kafka.OffsetCommit
	marks := map[int]int64{}
	for _, p := range s.parts {
		i := 0
		for i < len(p.handed) && p.settled[p.handed[i]] {
			delete(p.settled, p.handed[i])
			i++
		}
		p.handed = p.handed[i:]
		mark := p.next // everything handed out is settled: up to the next read, gaps included
		if len(p.handed) > 0 {
			mark = p.handed[0] // the first letter not settled yet
		}
		if mark > p.committed {
			commits = append(commits, kafka.OffsetCommit{Partition: p.id, Offset: mark})
			marks[p.id] = mark
		}
	}
	s.mu.Unlock()
	if len(commits) == 0 {
		return nil
	}
	resp, err := s.client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: s.cfg.Group, GenerationID: -1,
		Topics: map[string][]kafka.OffsetCommit{s.cfg.Topic: commits}})
	if err != nil {
		marks = nil
	} else {
		for _, p := range resp.Topics[s.cfg.Topic] {
			if p.Error != nil {
				err = p.Error
				delete(marks, p.Partition)
			}
		}
	}
	s.mu.Lock()
	for _, p := range s.parts {
		if m, ok := marks[p.id]; ok {
			p.committed = m // a failed partition is not in marks: the next Commit retries it
		}
	}
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("kafkaadapter: commit replay group %q: %w", s.cfg.Group, err)
	}
	return nil
}

// Close commits what was settled and closes the readers.
func (s *LetterSource) Close(ctx context.Context) error {
	err := s.Commit(ctx)
	s.closeReaders()
	s.closeTransport()
	return err
}

func (s *LetterSource) closeReaders() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.parts {
		if p.r != nil {
			_ = p.r.Close()
			p.r = nil
		}
	}
}

func (s *LetterSource) closeTransport() {
	if s.owned {
		s.transport.CloseIdleConnections()
	}
}

// GetLetter reads the letter at partition/offset ("0/17") of topic.
func GetLetter(ctx context.Context, brokers []string, topic, id string) (*dlq.Letter, error) {
	ps, os, ok := strings.Cut(id, "/")
	part, err1 := strconv.Atoi(ps)
	off, err2 := strconv.ParseInt(os, 10, 64)
	if !ok || err1 != nil || err2 != nil || part < 0 || off < 0 {
		return nil, fmt.Errorf("%w: letter id %q: want partition/offset, e.g. 0/17", consumer.ErrInvalidOption, id)
	}
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, Partition: part, MinBytes: 1, MaxBytes: 1 << 20,
		MaxWait: 250 * time.Millisecond})
	defer r.Close()
	if err := r.SetOffset(off); err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	m, err := r.FetchMessage(rctx)
	if err != nil {
		return nil, fmt.Errorf("kafkaadapter: read %s/%d@%d: %w", topic, part, off, err)
	}
	if m.Offset != off {
		return nil, fmt.Errorf("kafkaadapter: no record at %s/%d@%d (next is %d)", topic, part, off, m.Offset)
	}
	h := map[string][]string{}
	for _, kh := range m.Headers {
		h[kh.Key] = append(h[kh.Key], string(kh.Value))
	}
	return dlq.Decode(m.Key, m.Value, h)
}

// ReplayTarget is a dlq.Target writing to Kafka: each message goes to its
// Outgoing.Topic, partitioned by key, and Publish returns after all in-sync
// replicas have it.
type ReplayTarget struct {
	w         *kafka.Writer
	transport *kafka.Transport
}

var _ dlq.BatchTarget = (*ReplayTarget)(nil)

// NewReplayTarget returns a target on brokers with a transport of its own.
func NewReplayTarget(brokers []string) (*ReplayTarget, error) {
	if len(brokers) == 0 {
		return nil, fmt.Errorf("%w: replay target needs brokers", consumer.ErrInvalidOption)
	}
	t := &kafka.Transport{}
	w := newWriter(brokers, "", t)
	w.AllowAutoTopicCreation = false
	return &ReplayTarget{w: w, transport: t}, nil
}

// Publish writes m and waits for the acknowledgement.
func (t *ReplayTarget) Publish(ctx context.Context, m *dlq.Outgoing) error {
	msg := kafka.Message{Topic: m.Topic, Key: m.Key, Value: m.Value, Headers: kafkaHeaders(m.Headers, "")}
	if err := t.w.WriteMessages(ctx, msg); err != nil {
		if errors.Is(err, kafka.UnknownTopicOrPartition) {
			return fmt.Errorf("kafkaadapter: replay to %q: no such topic: %w", m.Topic, err)
		}
		return fmt.Errorf("kafkaadapter: replay to %q: %w", m.Topic, err)
	}
	return nil
}

// PublishBatch writes ms in one call (partitioned by key) and returns nil
// when all replicas have them all, else one error per message.
func (t *ReplayTarget) PublishBatch(ctx context.Context, ms []*dlq.Outgoing) []error {
	msgs := make([]kafka.Message, len(ms))
	for i, m := range ms {
		msgs[i] = kafka.Message{Topic: m.Topic, Key: m.Key, Value: m.Value, Headers: kafkaHeaders(m.Headers, "")}
	}
	err := t.w.WriteMessages(ctx, msgs...)
	if err == nil {
		return nil
	}
	errs := make([]error, len(ms))
	var we kafka.WriteErrors
	for i, m := range ms {
		e := err
		if errors.As(err, &we) && len(we) == len(ms) {
			e = we[i]
		}
		if e != nil {
			if errors.Is(e, kafka.UnknownTopicOrPartition) {
				e = fmt.Errorf("kafkaadapter: replay to %q: no such topic: %w", m.Topic, e)
			} else {
				e = fmt.Errorf("kafkaadapter: replay to %q: %w", m.Topic, e)
			}
		}
		errs[i] = e
	}
	return errs
}

// Close closes the writer and its connections.
func (t *ReplayTarget) Close() error {
	err := t.w.Close()
	t.transport.CloseIdleConnections()
	return err
}
