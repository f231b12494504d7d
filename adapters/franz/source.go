package franzadapter

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/kafkacore"
)

// Source is a consumer.Source over a franz-go (kgo) consumer group. The
// client is built from your kgo options when the route attaches the Source
// (consumer.New): your brokers, TLS, SASL, group, topics and tuning stay
// as you set them; the Source adds DisableAutoCommit and its rebalance
// callbacks (OnPartitionsAssigned, OnPartitionsRevoked, OnPartitionsLost,
// OnOffsetsFetched), which replace any of yours.
//
// Records are polled (PollRecords) only while the prefetch has room, at
// most its free message slots at a time, into the Kafka core's buffer
// (internal/kafkacore, the kafka-go adapter's too); every assigned
// partition has a Watermark, and only its commit point is committed, with
// the map of the offsets settled above it in the commit's metadata. Fetch
// is for one route's fetch loop; Ack, Nak and Term may come from any
// goroutine. Close it after the consumer's Run has returned.
type Source struct {
	cfg   Config
	opts  []kgo.Opt
	clock consumer.Clock

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup // the poll and commit loops

	attachMu sync.Mutex
	attached atomic.Bool
	closed   atomic.Bool
	limits   consumer.RouteLimits
	buf      *kafkacore.Buffer[*record]
	cl       *kgo.Client // set in Attach, before any goroutine reads it
	// ctl pauses and resumes partitions and commits: the client, or the
	// simulation's model of it (sim_internal_test.go).
	ctl    control
	group  string
	topics []string

	mu    sync.Mutex // parts
	parts map[topicPartition]*partition
	// commitMu orders commits: the commit loop's and a revoke's final one.
	// A partition is marked revoked under it, and a commit skips revoked
	// partitions, so nothing is committed for a partition after its final
	// commit.
	commitMu sync.Mutex
	pauseMu  sync.Mutex // pauses and resumes of retry partitions
	kick     chan struct{}
	settled  atomic.Int64 // since the last commit, for CommitEvery

	ready    chan struct{} // closed at the first assignment
	once     sync.Once
	groupErr atomic.Pointer[error]
	stats    counters
	out      []*record // Fetch scratch
}

var _ consumer.Source = (*Source)(nil)

// control is what the Source asks of its client besides polling.
type control interface {
	PauseFetchPartitions(map[string][]int32) map[string][]int32
	ResumeFetchPartitions(map[string][]int32)
	// commit commits offsets with their metadata (nil: plain), returning
	// the request's or the first partition's error.
	commit(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset, metas map[topicPartition]string) error
}

// kgoControl is control on a kgo client.
type kgoControl struct{ *kgo.Client }

func (c kgoControl) commit(ctx context.Context, offsets map[string]map[int32]kgo.EpochOffset, metas map[topicPartition]string) error {
	ctx = kgo.PreCommitFnContext(ctx, func(req *kmsg.OffsetCommitRequest) error {
		for i := range req.Topics {
			t := &req.Topics[i]
			for j := range t.Partitions {
				if m := metas[topicPartition{t.Topic, t.Partitions[j].Partition}]; m != "" {
					t.Partitions[j].Metadata = &m
				}
			}
		}
		return nil
	})
	var err error
	c.CommitOffsetsSync(ctx, offsets, func(_ *kgo.Client, _ *kmsg.OffsetCommitRequest, resp *kmsg.OffsetCommitResponse, cerr error) {
		if cerr != nil {
			err = cerr
			return
		}
		for _, t := range resp.Topics {
			for _, p := range t.Partitions {
				if e := kerrFor(p.ErrorCode); e != nil && err == nil {
					err = fmt.Errorf("%s/%d: %w", t.Topic, p.Partition, e)
				}
			}
		}
	})
	return err
}

// controlOf is the control of a callback's client: the simulation's
// model when it calls the callbacks itself (cl nil).
func (s *Source) controlOf(cl *kgo.Client) control {
	if cl == nil {
		return s.ctl
	}
	return kgoControl{cl}
}

type topicPartition struct {
	topic string
	id    int32
}

// partition is one assignment of one partition to this member: a new one
// each time it is assigned, so settlements of an earlier assignment never
// reach a later one's watermark.
type partition struct {
	kafkacore.Part[*record] // the buffer's queue
	gen                     kafkacore.Gen
	src                     *Source
	topic                   string
	id                      int32
	wm                      *kafkacore.Watermark
	retry                   bool
	revoked                 atomic.Bool // after its final commit: drop settlements
	held                    int         // retry records waiting for their not-before (pauseMu)
}

type counters struct {
	fetched, polls, settled, fetchErrors, commits, commitErrors, staleSettles, dropped,
	localRetries, retryWrites, retryWriteErrors, assignments, revokes,
	retryClamped, retryOriginRefused, skippedSettled, mapsRestored atomic.Int64
}

// Stats is a snapshot of a Source's counters.
type Stats struct {
	Fetched      int64 // records polled from the client and kept
	Polls        int64 // PollRecords calls that returned records
	Settled      int64 // messages acked or terminated by the route (not naks)
	FetchErrors  int64 // errors kgo reported in polls
	Commits      int64 // accepted commit requests
	CommitErrors int64
	// StaleSettles counts settlements that arrived after their partition
	// was revoked: not committed, so those messages are delivered again.
	StaleSettles int64
	// Dropped counts polled records discarded because their partition was
	// revoked before they were handed out (fetched again by the new owner).
	Dropped            int64
	LocalRetries       int64 // Naks kept in process
	RetryWrites        int64 // Naks written to the retry topic
	RetryWriteErrors   int64
	RetryClamped       int64 // retry records whose not-before was clamped
	RetryOriginRefused int64 // retry records naming a topic the Source does not read
	// SkippedSettled counts records passed over because the commit they
	// were assigned with lists them as settled; MapsRestored the
	// partitions whose commit carried such a map.
	SkippedSettled, MapsRestored int64
	Assignments, Revokes         int64 // partitions assigned and revoked (or lost)
	// Buffered and BufferedBytes are what the Source holds now, outside the
	// route's window; PeakBytes and PeakBuffered the most it held.
	Buffered      int
	BufferedBytes int64
	PeakBytes     int64
	PeakBuffered  int
}

// ErrNotAttached is returned by Source.Ready before a route attached the
// Source: its client is built, and joins the group, only then.
var ErrNotAttached = errors.New("franz source: not attached to a route yet (consumer.New attaches it, and it joins its group then)")

// NewSource validates cfg and returns a Source that will read with a kgo
// client built from opts, the options you would pass to kgo.NewClient for
// a group consumer (they must name a kgo.ConsumerGroup and
// kgo.ConsumeTopics). The client is built, and joins the group, when a
// route attaches the Source (consumer.New): see Ready and Client.
func NewSource(cfg Config, opts ...kgo.Opt) (*Source, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	s := &Source{cfg: cfg, opts: slices.Clone(opts), clock: cfg.Clock, kick: make(chan struct{}, 1),
		parts: map[topicPartition]*partition{}, ready: make(chan struct{})}
	if s.clock == nil {
		s.clock = sysClock{}
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	return s, nil
}

type sysClock struct{}

func (sysClock) Now() time.Time { return time.Now() }

// kgoDefaultFetchMaxBytes is kgo's default FetchMaxBytes: a client that
// has it was not sized by the user, and the Source sizes it from the
// prefetch.
const kgoDefaultFetchMaxBytes = 50 << 20

// Attach implements consumer.Source: the Source sizes its prefetch from the
// route's window, builds its client and joins the group. Unless you set
// kgo.FetchMaxBytes yourself, it sizes the client's fetches from the
// prefetch too (a quarter of PrefetchBytes, at most 1 MiB, and no more per
// partition), so what kgo buffers stays near the window. A Source serves
// one route.
func (s *Source) Attach(l consumer.RouteLimits) (consumer.SourceInfo, error) {
	if s.closed.Load() {
		return consumer.SourceInfo{}, fmt.Errorf("franz source: %w", consumer.ErrClosed)
	}
	s.attachMu.Lock()
	defer s.attachMu.Unlock()
	if s.attached.Load() {
		if s.limits != l {
			return consumer.SourceInfo{}, fmt.Errorf("%w: franz source already serves route %q", consumer.ErrInvalidOption, s.limits.Route)
		}
		return consumer.SourceInfo{Ready: s.readyNow}, nil
	}
	cfg := s.cfg
	cfg.sizeFrom(l)
	s.buf = kafkacore.NewBuffer[*record](cfg.PrefetchMessages, cfg.PrefetchBytes, cfg.LocalRetryMessages, cfg.LocalRetryBytes)
	opts := append(slices.Clone(s.opts),
		kgo.DisableAutoCommit(),
		kgo.OnPartitionsAssigned(s.assigned),
		kgo.OnPartitionsRevoked(s.revoked),
		kgo.OnPartitionsLost(s.lost),
		kgo.OnOffsetsFetched(s.offsetsFetched),
	)
	// The callbacks may run as soon as the client exists: they read s.cfg,
	// s.buf and s.limits, set before it.
	s.cfg, s.limits = cfg, l
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return consumer.SourceInfo{}, fmt.Errorf("%w: franz source: %v", consumer.ErrInvalidOption, err)
	}
	group, _ := cl.OptValue(kgo.ConsumerGroup).(string)
	var topics []string
	if vs := cl.OptValues(kgo.ConsumeTopics); len(vs) > 0 {
		topics, _ = vs[0].([]string)
	}
	regex, _ := cl.OptValue(kgo.ConsumeRegex).(bool)
	bad := ""
	switch {
	case group == "":
		bad = "the options name no kgo.ConsumerGroup"
	case len(topics) == 0:
		bad = "the options name no kgo.ConsumeTopics"
	case regex && cfg.RetryTopic != "":
		bad = "a RetryTopic needs plain topics, not kgo.ConsumeRegex"
	case slices.Contains(topics, cfg.RetryTopic):
		bad = fmt.Sprintf("the RetryTopic %q is one of the topics", cfg.RetryTopic)
	}
	if bad != "" {
		cl.Close()
		return consumer.SourceInfo{}, fmt.Errorf("%w: franz source: %s", consumer.ErrInvalidOption, bad)
	}
	if v, _ := cl.OptValue(kgo.FetchMaxBytes).(int32); v == kgoDefaultFetchMaxBytes {
		fetch := int32(max(1, min(cfg.PrefetchBytes/4, 1<<20)))
		cl.UpdateFetchMaxBytes(fetch, fetch)
	}
	if cfg.RetryTopic != "" {
		cl.AddConsumeTopics(cfg.RetryTopic)
	}
	s.cl, s.ctl, s.group, s.topics = cl, kgoControl{cl}, group, topics
	s.attached.Store(true)
	s.wg.Add(2)
	go s.pollLoop()
	go s.commitLoop()
	return consumer.SourceInfo{Ready: s.readyNow}, nil
}

// Client returns the kgo client the Source reads with (nil before a route
// attached the Source): produce through it (its partitioner is yours; kgo's
// default hashes keys with murmur2, as Java producers do), or build a
// DeadLetterSink on it. Do not poll it, commit through it or close it.
func (s *Source) Client() *kgo.Client {
	if !s.attached.Load() {
		return nil
	}
	return s.cl
}

// readyNow is SourceInfo.Ready: nil once the Source has had an assignment
// (possibly no partitions) and is not closed; otherwise why not.
func (s *Source) readyNow() error {
	if s.closed.Load() {
		return fmt.Errorf("franz source: %w", consumer.ErrClosed)
	}
	if e := s.groupErr.Load(); e != nil {
		return *e
	}
	select {
	case <-s.ready:
		return nil
	default:
		return fmt.Errorf("franz source: joining group %s: no assignment yet", s.group)
	}
}

// Ready waits until the Source has joined its group and has its first
// assignment, and returns nil; or ctx's error, ErrClosed, or (before a
// route attached it) ErrNotAttached at once.
func (s *Source) Ready(ctx context.Context) error {
	if s.closed.Load() {
		return fmt.Errorf("franz source: %w", consumer.ErrClosed)
	}
	if !s.attached.Load() {
		return ErrNotAttached
	}
	select {
	case <-s.ready:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.ctx.Done():
		return fmt.Errorf("franz source: %w", consumer.ErrClosed)
	}
}

// Assigned returns the partitions assigned now, topic → partition ids.
func (s *Source) Assigned() map[string][]int32 {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string][]int32{}
	for tp := range s.parts {
		out[tp.topic] = append(out[tp.topic], tp.id)
	}
	for _, ids := range out {
		slices.Sort(ids)
	}
	return out
}

// Bound returns the most bytes the Source and its client hold outside the
// route window: the records polled and not handed out (PrefetchBytes, and
// a poll's worth above it: a poll takes at most the free message slots
// once a quarter of the slots and of PrefetchBytes are free), plus what
// kgo buffers: one fetch response per broker, at most the client's
// FetchMaxBytes or, when a producer wrote a record batch larger than that,
// the largest batch. A poll moves records from kgo's buffer into the
// Source's, so the two together stay within PrefetchBytes plus one fetch
// response per broker. maxBatch is the largest batch the producers write
// (0: none above FetchMaxBytes), brokers how many brokers lead the
// partitions it reads. Messages a Nak keeps in process come on top, within
// their own allowance (LocalRetryMessages, LocalRetryBytes).
func (s *Source) Bound(maxBatch int64, brokers int) int64 {
	fetch := int64(kgoDefaultFetchMaxBytes)
	if cl := s.Client(); cl != nil {
		if v, ok := cl.OptValue(kgo.FetchMaxBytes).(int32); ok {
			fetch = int64(v)
		}
		if v := int64(min(s.cfg.PrefetchBytes/4, 1<<20)); fetch == kgoDefaultFetchMaxBytes {
			fetch = max(v, 1)
		}
	}
	return s.cfg.PrefetchBytes + int64(max(brokers, 1))*max(fetch, maxBatch)
}

// Stats returns a snapshot of the counters.
func (s *Source) Stats() Stats {
	st := Stats{
		Fetched: s.stats.fetched.Load(), Polls: s.stats.polls.Load(), Settled: s.stats.settled.Load(),
		FetchErrors: s.stats.fetchErrors.Load(), Commits: s.stats.commits.Load(), CommitErrors: s.stats.commitErrors.Load(),
		StaleSettles: s.stats.staleSettles.Load(), Dropped: s.stats.dropped.Load(),
		LocalRetries: s.stats.localRetries.Load(), RetryWrites: s.stats.retryWrites.Load(),
		RetryWriteErrors: s.stats.retryWriteErrors.Load(), RetryClamped: s.stats.retryClamped.Load(),
		RetryOriginRefused: s.stats.retryOriginRefused.Load(), SkippedSettled: s.stats.skippedSettled.Load(),
		MapsRestored: s.stats.mapsRestored.Load(), Assignments: s.stats.assignments.Load(), Revokes: s.stats.revokes.Load(),
	}
	if s.attached.Load() {
		st.Buffered, st.BufferedBytes, st.PeakBytes, st.PeakBuffered = s.buf.Usage()
	}
	return st
}

// Close stops polling and closes the client: kgo revokes the Source's
// partitions (the Source waits RevokeGrace for what it handed out, commits
// once more) and leaves the group. Messages not settled by then are
// delivered again to whoever owns their partitions next. It is safe to
// call more than once.
func (s *Source) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.cancel()
	s.attachMu.Lock()
	defer s.attachMu.Unlock()
	if !s.attached.Load() {
		return nil
	}
	s.wg.Wait()
	// kgo's Close revokes the partitions (OnPartitionsRevoked) after it
	// stopped the group's session, where a commit may fail: commit first,
	// once what was handed out is settled (within RevokeGrace).
	s.mu.Lock()
	ps := make([]*partition, 0, len(s.parts))
	for _, p := range s.parts {
		ps = append(ps, p)
	}
	s.mu.Unlock()
	if s.cfg.RevokeGrace > 0 {
		deadline := time.Now().Add(s.cfg.RevokeGrace)
		for outstanding(ps) > 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	s.commitMu.Lock()
	s.commitLocked(context.Background(), s.ctl, ps)
	s.commitMu.Unlock()
	s.cl.Close()
	return nil
}

func (s *Source) logError(msg string, args ...any) {
	if s.cfg.Logger != nil {
		s.cfg.Logger.Error(msg, append([]any{"group", s.group}, args...)...)
	}
}

// assigned is kgo's OnPartitionsAssigned: each newly assigned partition
// gets a fresh state (watermark, generation of the buffer).
func (s *Source) assigned(_ context.Context, _ *kgo.Client, assigned map[string][]int32) {
	s.mu.Lock()
	for topic, ids := range assigned {
		for _, id := range ids {
			p := &partition{src: s, topic: topic, id: id, wm: kafkacore.NewWatermark(), retry: topic == s.cfg.RetryTopic}
			p.Gen = &p.gen
			s.parts[topicPartition{topic, id}] = p
			s.stats.assignments.Add(1)
		}
	}
	s.mu.Unlock()
	s.once.Do(func() { close(s.ready) })
}

// offsetsFetched is kgo's OnOffsetsFetched: the committed offsets the new
// partitions start from, with their metadata. A sluice map of settled
// offsets in it is restored, so the records a previous owner settled above
// its commit are passed over.
func (s *Source) offsetsFetched(_ context.Context, _ *kgo.Client, resp *kmsg.OffsetFetchResponse) error {
	restore := func(topic string, id int32, off int64, meta *string, code int16) {
		if code != 0 || off < 0 {
			return
		}
		s.mu.Lock()
		p := s.parts[topicPartition{topic, id}]
		s.mu.Unlock()
		if p == nil {
			return
		}
		if meta != nil && *meta != "" && p.wm.Restore(off, *meta) > 0 {
			s.stats.mapsRestored.Add(1)
		}
		// The group's committed offset: nothing new to commit yet.
		p.wm.Begin(off)
		p.wm.Committed(off)
	}
	for _, t := range resp.Topics {
		for _, p := range t.Partitions {
			restore(t.Topic, p.Partition, p.Offset, p.Metadata, p.ErrorCode)
		}
	}
	for _, g := range resp.Groups {
		for _, t := range g.Topics {
			for _, p := range t.Partitions {
				restore(t.Topic, p.Partition, p.Offset, p.Metadata, p.ErrorCode)
			}
		}
	}
	return nil
}

// take removes the partitions of m from the assignment and stops handing
// out their records: they are ending, and the buffer drops what it holds
// of them. Retry partitions the Source paused are resumed (kgo keeps a
// pause across assignments).
func (s *Source) take(cl *kgo.Client, m map[string][]int32) []*partition {
	var out []*partition
	s.mu.Lock()
	for topic, ids := range m {
		for _, id := range ids {
			if p := s.parts[topicPartition{topic, id}]; p != nil {
				delete(s.parts, topicPartition{topic, id})
				out = append(out, p)
			}
		}
	}
	s.mu.Unlock()
	resume := map[string][]int32{}
	for _, p := range out {
		p.gen.Ending.Store(true)
		s.stats.revokes.Add(1)
		if s.buf != nil {
			s.stats.dropped.Add(int64(s.buf.Purge(&p.gen)))
		}
		s.pauseMu.Lock()
		if p.held > 0 {
			p.held = 0
			resume[p.topic] = append(resume[p.topic], p.id)
		}
		s.pauseMu.Unlock()
	}
	if len(resume) > 0 {
		s.controlOf(cl).ResumeFetchPartitions(resume)
	}
	return out
}

// revoked is kgo's OnPartitionsRevoked (a rebalance, or Close leaving the
// group): the partitions stop handing out, the Source waits up to
// RevokeGrace for the messages already handed out, commits their
// watermarks once more (kgo's CommitOffsetsSync, still within the
// generation) and drops any later settlement.
func (s *Source) revoked(ctx context.Context, cl *kgo.Client, revoked map[string][]int32) {
	ps := s.take(cl, revoked)
	if len(ps) == 0 {
		return
	}
	if s.cfg.RevokeGrace > 0 {
		deadline := time.Now().Add(s.cfg.RevokeGrace)
		for outstanding(ps) > 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	s.commitLocked(ctx, s.controlOf(cl), ps)
	for _, p := range ps {
		p.revoked.Store(true)
	}
}

// lost is kgo's OnPartitionsLost (the member was fenced, a fatal group
// error): nothing can be committed for them any more.
func (s *Source) lost(_ context.Context, cl *kgo.Client, lost map[string][]int32) {
	ps := s.take(cl, lost)
	s.commitMu.Lock()
	defer s.commitMu.Unlock()
	for _, p := range ps {
		p.revoked.Store(true)
	}
}

func outstanding(ps []*partition) int64 {
	var n int64
	for _, p := range ps {
		n += p.gen.Outstanding.Load()
	}
	return n
}

// commitTimeout bounds one commit request.
const commitTimeout = 10 * time.Second

// commitLoop commits the assigned partitions' watermarks every
// CommitInterval, or after CommitEvery settlements.
func (s *Source) commitLoop() {
	defer s.wg.Done()
	t := time.NewTicker(s.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		case <-s.kick:
		}
		s.mu.Lock()
		ps := make([]*partition, 0, len(s.parts))
		for _, p := range s.parts {
			ps = append(ps, p)
		}
		s.mu.Unlock()
		s.commitMu.Lock()
		s.commitLocked(s.ctx, s.ctl, ps)
		s.commitMu.Unlock()
	}
}

// commitLocked commits, for each partition of ps not revoked, its commit
// point if it moved or the map of settled offsets above it changed, with
// that map in the commit's metadata (kgo.PreCommitFnContext). A broker that
// refuses the metadata as too large gets the plain commit points.
// s.commitMu held.
func (s *Source) commitLocked(ctx context.Context, ctl control, ps []*partition) {
	type mark struct {
		p    *partition
		off  int64
		meta string
	}
	var marks []mark
	offsets := map[string]map[int32]kgo.EpochOffset{}
	metas := map[topicPartition]string{}
	for _, p := range ps {
		if p.revoked.Load() {
			continue
		}
		if off, meta, ok := p.wm.CommitMetadata(); ok {
			marks = append(marks, mark{p, off, meta})
			if offsets[p.topic] == nil {
				offsets[p.topic] = map[int32]kgo.EpochOffset{}
			}
			offsets[p.topic][p.id] = kgo.EpochOffset{Epoch: -1, Offset: off}
			metas[topicPartition{p.topic, p.id}] = meta
		}
	}
	if len(marks) == 0 {
		return
	}
	s.settled.Store(0)
	commit := func(plain bool) error {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), commitTimeout)
		defer cancel()
		if plain {
			return ctl.commit(cctx, offsets, nil)
		}
		return ctl.commit(cctx, offsets, metas)
	}
	plain := false
	err := commit(false)
	if isMetadataTooLarge(err) {
		plain = true
		err = commit(true)
	}
	if err != nil {
		s.stats.commitErrors.Add(1)
		s.logError("franz source: commit", "err", err)
		return
	}
	done := map[string]map[int32]int64{}
	for _, m := range marks {
		if plain {
			m.meta = ""
		}
		m.p.wm.CommittedMetadata(m.off, m.meta)
		if done[m.p.topic] == nil {
			done[m.p.topic] = map[int32]int64{}
		}
		done[m.p.topic][m.p.id] = m.off
	}
	s.stats.commits.Add(1)
	if s.cfg.OnCommit != nil {
		s.cfg.OnCommit(done)
	}
}

// record is one polled message and, while handed out, its Acker.
type record struct {
	part         *partition
	offset       int64
	key, value   []byte
	headers      consumer.Headers
	time         time.Time
	attempt      int
	firstFailure time.Time
	origin       dlq.Origin
	size         int64
	due          time.Time
	held         bool // a retry record waiting for its not-before: its partition is paused
}

// BufferSize, BufferDue and BufferPart make record a kafkacore.Item.
func (r *record) BufferSize() int64                    { return r.size }
func (r *record) BufferDue() time.Time                 { return r.due }
func (r *record) BufferPart() *kafkacore.Part[*record] { return &r.part.Part }

// retryView is r as the core's retry helpers see it.
func (r *record) retryView() kafkacore.Retry {
	return kafkacore.Retry{Headers: r.headers, Time: r.time, Due: r.due, Attempt: r.attempt,
		FirstFailure: r.firstFailure, Origin: r.origin}
}
