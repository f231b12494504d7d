package kafkaadapter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/kafkacore"
)

// DefaultReplayGroup is the consumer group whose committed offsets mark how
// far a replay of a dead-letter topic got.
const DefaultReplayGroup = "sluice-replay"

// ErrTopicMissing is returned by NewLetterSource when the topic does not
// exist.
var ErrTopicMissing = errors.New("kafkaadapter: topic not found")

// LetterSourceConfig configures a LetterSource.
type LetterSourceConfig struct {
	// Cluster holds the topic (required).
	Cluster *Cluster
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
// holds its partition's commit back, so it is read again by the next pass;
// the letters after it already settled are listed in the commit's metadata
// and the next pass skips them instead of republishing them. Commits go out before each fetch and in
// Close; a crash in between republishes at most the letters settled since
// the last commit (Kafka has no per-message deduplication).
type LetterSource struct {
	cfg     LetterSourceConfig
	client  *kafka.Client
	cluster *Cluster

	mu    sync.Mutex
	parts []*replayPart
	cur   int
}

type replayPart struct {
	id        int
	next, end int64  // next offset to read; end offset of the pass
	committed int64  // last committed
	meta      string // last committed metadata (settled offsets above it)
	handed    []int64
	settled   map[int64]bool
	skip      kafkacore.Settled // settled by an earlier pass above its commit (internal/kafkacore)
	exhausted bool
	got       []kafka.Message // fetched, not handed out yet
}

var (
	_ dlq.Source = (*LetterSource)(nil)
	_ dlq.Sizer  = (*LetterSource)(nil)
)

// NewLetterSource opens a pass over the topic. Close commits and closes it.
func NewLetterSource(ctx context.Context, cfg LetterSourceConfig) (*LetterSource, error) {
	if err := cfg.Cluster.validate("letter source"); err != nil {
		return nil, err
	}
	if cfg.Topic == "" {
		return nil, fmt.Errorf("%w: letter source needs a Topic", consumer.ErrInvalidOption)
	}
	if cfg.Group == "" {
		cfg.Group = DefaultReplayGroup
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = 2 * time.Second
	}
	s := &LetterSource{cfg: cfg, cluster: cfg.Cluster}
	s.client = s.cluster.client(s.cluster.acquire(cfg.Topic))
	if err := s.open(ctx); err != nil {
		s.cluster.release()
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
	var of *kafka.OffsetFetchResponse
	err = whileCoordinatorMoves(ctx, func() error {
		var ferr error
		of, ferr = s.client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: s.cfg.Group, Topics: map[string][]int{topic: ids}})
		if ferr == nil && coordinatorMoving(of.Error) {
			return of.Error
		}
		return ferr
	})
	if err != nil {
		return fmt.Errorf("kafkaadapter: committed offsets of group %q: %w", s.cfg.Group, err)
	}
	committed := map[int]int64{}
	metas := map[int]string{}
	switch {
	case errors.Is(of.Error, kafka.GroupIdNotFound): // a group that never committed (kfake says so)
	case of.Error != nil:
		return fmt.Errorf("kafkaadapter: committed offsets of group %q: %w", s.cfg.Group, of.Error)
	default:
		for _, p := range of.Topics[topic] {
			if p.Error == nil {
				committed[p.Partition] = p.CommittedOffset
				metas[p.Partition] = p.Metadata
			}
		}
	}
	for _, id := range ids {
		start := first[id]
		if c, ok := committed[id]; ok && c > start {
			start = c
		}
		p := &replayPart{id: id, next: start, end: last[id], committed: start, settled: map[int64]bool{}}
		if c, ok := committed[id]; ok && c == start {
			p.meta = metas[id]
			p.skip = kafkacore.DecodeSettled(start, p.meta)
		}
		s.parts = append(s.parts, p)
		p.exhausted = start >= p.end
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
	var out []*dlq.Pending
	for len(out) < n {
		s.mu.Lock()
		done := p.next >= p.end
		s.mu.Unlock()
		if done {
			break
		}
		if len(p.got) == 0 {
			got, err := fetchRecords(ctx, s.client, s.cfg.Topic, p.id, p.next, 1<<20, s.cfg.ReadTimeout)
			if err != nil {
				if ctx.Err() != nil {
					return nil, ctx.Err()
				}
				return nil, fmt.Errorf("kafkaadapter: read %s/%d: %w", s.cfg.Topic, p.id, err)
			}
			if len(got) == 0 {
				break // nothing more readable below the end offset
			}
			p.got = got
		}
		m := p.got[0]
		p.got = p.got[1:]
		s.mu.Lock()
		if m.Offset >= p.end {
			p.next, p.got = p.end, nil
			s.mu.Unlock()
			break
		}
		p.next = m.Offset + 1
		p.handed = append(p.handed, m.Offset)
		if p.skip.Has(m.Offset) {
			// Settled by an earlier pass: passed over, not handed out again.
			p.settled[m.Offset] = true
			s.mu.Unlock()
			continue
		}
		s.mu.Unlock()
		out = append(out, s.pending(p, m))
	}
	s.mu.Lock()
	if p.next >= p.end || len(out) < n {
		p.exhausted = true
	}
	s.mu.Unlock()
	return out, nil
}

// fetchRecords reads the records of topic/partition from offset on, one
// fetch of up to maxBytes (at least one record), waiting up to maxWait for
// the first. It returns no records when there were none in time.
func fetchRecords(ctx context.Context, c *kafka.Client, topic string, partition int, offset int64, maxBytes int, maxWait time.Duration) ([]kafka.Message, error) {
	fctx, cancel := context.WithTimeout(ctx, maxWait+15*time.Second)
	defer cancel()
	res, err := c.Fetch(fctx, &kafka.FetchRequest{Topic: topic, Partition: partition, Offset: offset,
		MinBytes: 1, MaxBytes: int64(maxBytes), MaxWait: maxWait})
	if err != nil {
		return nil, err
	}
	if res.Error != nil {
		return nil, res.Error
	}
	var out []kafka.Message
	for {
		kr, err := res.Records.ReadRecord()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return out, err
		}
		if kr.Offset < offset {
			continue // a batch starting before the offset asked for
		}
		key, value, err := readKeyValue(kr)
		if err != nil {
			return out, err
		}
		out = append(out, kafka.Message{Topic: topic, Partition: partition, Offset: kr.Offset,
			Key: key, Value: value, Headers: kr.Headers, Time: kr.Time})
	}
}

func (s *LetterSource) pending(p *replayPart, m kafka.Message) *dlq.Pending {
	h, _ := headerMap(m.Headers, nil, isEnvelope)
	if h == nil {
		h = map[string][]string{}
	}
	parts := first(h, HeaderOriginPartitions)
	if s.cfg.Backlog {
		parts = strconv.Itoa(len(s.parts))
	}
	pd := &dlq.Pending{Pos: fmt.Sprintf("%s/%d@%d", m.Topic, m.Partition, m.Offset)}
	if s.cfg.Backlog {
		l := &dlq.Letter{Key: m.Key, Value: m.Value, Headers: h, LastFailure: m.Time, FirstFailure: m.Time,
			Origin: dlq.Origin{Topic: m.Topic, Partition: int32(m.Partition), Offset: m.Offset}}
		if v := h[dlq.HeaderReplayCount]; len(v) > 0 {
			l.Replays = dlq.ParseReplayCount(v[0])
		}
		pd.Letter = l
	} else {
		pd.Letter, pd.Err = dlq.Decode(m.Key, m.Value, h)
		if pd.Err != nil {
			pd.Letter, pd.Err = nil, fmt.Errorf("%s: %w", pd.Pos, pd.Err)
		}
	}
	if pd.Letter != nil && parts != "" {
		pd.Letter.Headers[metaOriginPartitions] = []string{parts}
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
	metaOf := map[int]string{}
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
		// Settled above the mark: recorded, so a later pass skips them.
		var done []int64
		for _, o := range p.handed {
			if p.settled[o] {
				done = append(done, o)
			}
		}
		// An earlier pass's, not read yet, stay recorded too.
		above := kafkacore.Union(kafkacore.RangesOf(done), p.skip.From(max(p.next, mark+1)))
		meta := kafkacore.EncodeSettled(mark, above)
		if mark > p.committed || (mark == p.committed && meta != p.meta) {
			commits = append(commits, kafka.OffsetCommit{Partition: p.id, Offset: mark, Metadata: meta})
			marks[p.id] = mark
			metaOf[p.id] = meta
		}
	}
	s.mu.Unlock()
	if len(commits) == 0 {
		return nil
	}
	var resp *kafka.OffsetCommitResponse
	err := whileCoordinatorMoves(ctx, func() error {
		var cerr error
		resp, cerr = s.client.OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: s.cfg.Group, GenerationID: -1,
			Topics: map[string][]kafka.OffsetCommit{s.cfg.Topic: commits}})
		if cerr == nil {
			for _, p := range resp.Topics[s.cfg.Topic] {
				if coordinatorMoving(p.Error) {
					return p.Error
				}
			}
		}
		return cerr
	})
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
			p.committed, p.meta = m, metaOf[p.id] // a failed partition is not in marks: the next Commit retries it
		}
	}
	s.mu.Unlock()
	if err != nil {
		return fmt.Errorf("kafkaadapter: commit replay group %q: %w", s.cfg.Group, err)
	}
	return nil
}

// coordinatorMoving reports the errors a group's coordinator answers while
// it is elected or loading (a fresh cluster creating __consumer_offsets, a
// broker restart): worth a retry, not a failed replay.
func coordinatorMoving(err error) bool {
	return errors.Is(err, kafka.NotCoordinatorForGroup) || errors.Is(err, kafka.GroupCoordinatorNotAvailable) ||
		errors.Is(err, kafka.GroupLoadInProgress)
}

// whileCoordinatorMoves calls f until it succeeds or fails otherwise,
// retrying for up to 10 s while the group's coordinator moves.
func whileCoordinatorMoves(ctx context.Context, f func() error) error {
	deadline := time.Now().Add(10 * time.Second)
	for wait := 50 * time.Millisecond; ; wait = min(2*wait, time.Second) {
		err := f()
		if !coordinatorMoving(err) || time.Now().After(deadline) {
			return err
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

// Close commits what was settled and releases the connections.
func (s *LetterSource) Close(ctx context.Context) error {
	err := s.Commit(ctx)
	s.cluster.release()
	return err
}

// GetLetter reads the letter at partition/offset ("0/17") of topic.
func GetLetter(ctx context.Context, c *Cluster, topic, id string) (*dlq.Letter, error) {
	if err := c.validate("get letter"); err != nil {
		return nil, err
	}
	ps, os, ok := strings.Cut(id, "/")
	part, err1 := strconv.Atoi(ps)
	off, err2 := strconv.ParseInt(os, 10, 64)
	if !ok || err1 != nil || err2 != nil || part < 0 || off < 0 {
		return nil, fmt.Errorf("%w: letter id %q: want partition/offset, e.g. 0/17", consumer.ErrInvalidOption, id)
	}
	client := c.client(c.acquire(topic))
	defer c.release()
	got, err := fetchRecords(ctx, client, topic, part, off, 1<<20, 2*time.Second)
	if err != nil {
		return nil, fmt.Errorf("kafkaadapter: read %s/%d@%d: %w", topic, part, off, err)
	}
	if len(got) == 0 || got[0].Offset != off {
		next := "nothing"
		if len(got) > 0 {
			next = strconv.FormatInt(got[0].Offset, 10)
		}
		return nil, fmt.Errorf("kafkaadapter: no record at %s/%d@%d (next is %s)", topic, part, off, next)
	}
	h, _ := headerMap(got[0].Headers, nil, isEnvelope)
	return dlq.Decode(got[0].Key, got[0].Value, h)
}

// ReplayTarget is a dlq.Target writing to Kafka. A message goes back to its
// letter's original partition when it is replayed to its origin topic and
// that topic still has the partition count it had when the letter was
// written (HeaderOriginPartitions); otherwise, or with Rehash, it is
// partitioned by key with murmur2, like a Java producer. Headers keep their
// original order and duplicates. Publish returns after all in-sync
// replicas have the message.
type ReplayTarget struct {
	w       *kafka.Writer
	cluster *Cluster
	rehash  bool
}

var _ dlq.BatchTarget = (*ReplayTarget)(nil)

// ReplayTargetOptions configure NewReplayTarget.
type ReplayTargetOptions struct {
	// Rehash partitions every message by its key (murmur2) instead of
	// sending it back to its original partition.
	Rehash bool
}

// NewReplayTarget returns a target on c's shared transport.
func NewReplayTarget(c *Cluster, opts ReplayTargetOptions) (*ReplayTarget, error) {
	if err := c.validate("replay target"); err != nil {
		return nil, err
	}
	w := newWriter(c, c.acquire(), "")
	w.Balancer = originBalancer{}
	w.AllowAutoTopicCreation = false
	return &ReplayTarget{w: w, cluster: c, rehash: opts.Rehash}, nil
}

// partitionHint asks originBalancer for partition p of a topic that has
// count partitions.
type partitionHint struct{ p, count int }

// originBalancer sends a message carrying a partitionHint to that
// partition while the topic has the hinted partition count, and
// partitions everything else with murmur2.
type originBalancer struct{ murmur kafka.Murmur2Balancer }

func (b originBalancer) Balance(msg kafka.Message, partitions ...int) int {
	if h, ok := msg.WriterData.(partitionHint); ok && h.count == len(partitions) && slices.Contains(partitions, h.p) {
		return h.p
	}
	return b.murmur.Balance(msg, partitions...)
}

func (t *ReplayTarget) message(m *dlq.Outgoing) kafka.Message {
	msg := kafka.Message{Topic: m.Topic, Key: m.Key, Value: m.Value, Headers: wireHeaders(m.Headers, kafkaMetaPrefix, nil)}
	if l := m.Letter; !t.rehash && l != nil && l.Origin.Topic == m.Topic && l.Origin.Partition >= 0 {
		if n, err := strconv.Atoi(first(l.Headers, metaOriginPartitions)); err == nil && n > 0 {
			msg.WriterData = partitionHint{p: int(l.Origin.Partition), count: n}
		}
	}
	return msg
}

// Publish writes m and waits for the acknowledgement.
func (t *ReplayTarget) Publish(ctx context.Context, m *dlq.Outgoing) error {
	if errs := t.PublishBatch(ctx, []*dlq.Outgoing{m}); errs != nil {
		return errs[0]
	}
	return nil
}

// PublishBatch writes ms in one call and returns nil when all replicas
// have them all, else one error per message.
func (t *ReplayTarget) PublishBatch(ctx context.Context, ms []*dlq.Outgoing) []error {
	msgs := make([]kafka.Message, len(ms))
	topics := make([]string, 0, 1)
	for i, m := range ms {
		msgs[i] = t.message(m)
		if !slices.Contains(topics, m.Topic) {
			topics = append(topics, m.Topic)
		}
	}
	t.cluster.use(topics...)
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
			switch {
			case errors.Is(e, kafka.UnknownTopicOrPartition):
				e = fmt.Errorf("%w: kafkaadapter: replay to %q: no such topic: %w", dlq.ErrUndeliverable, m.Topic, e)
			case errors.Is(e, kafka.MessageSizeTooLarge), errors.Is(e, kafka.RecordListTooLarge), errors.Is(e, kafka.InvalidTopic):
				e = fmt.Errorf("%w: kafkaadapter: replay to %q: %w", dlq.ErrUndeliverable, m.Topic, e)
			default:
				e = fmt.Errorf("kafkaadapter: replay to %q: %w", m.Topic, e)
			}
		}
		errs[i] = e
	}
	return errs
}

// Close closes the writer; the last user of the Cluster closes its
// connections.
func (t *ReplayTarget) Close() error {
	err := t.w.Close()
	t.cluster.release()
	return err
}

// isEnvelope reports whether k is a dead letter's envelope header.
func isEnvelope(k string) bool { return strings.HasPrefix(k, dlq.HeaderPrefix) }

// first returns the first value of k in h, or "".
func first(h map[string][]string, k string) string {
	if v := h[k]; len(v) > 0 {
		return v[0]
	}
	return ""
}
