package kafkaadapter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol/offsetcommit"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/kafkacore"
)

// Source is a consumer.Source over a Kafka consumer group, built on
// kafka-go's ConsumerGroup and Generation API. Each generation's assigned
// partitions are fetched into a bounded buffer (see Config.PrefetchBytes);
// every partition has a Watermark, and only its commit point is committed,
// batched every CommitInterval, within the generation that delivered the
// messages.
//
// Create it with NewSource; it joins the group at once. Fetch is for one
// route's fetch loop; Ack, Nak and Term may come from any goroutine. Close it
// after the consumer's Run has returned.
type Source struct {
	feed
	cg      *kafka.ConsumerGroup
	client  *kafka.Client
	cluster *Cluster

	ready chan struct{} // closed when the first generation started
	once  sync.Once
	// gens counts the goroutines run in generations: Generation.Start on
	// a generation that closed already (Close racing a new generation)
	// runs them untracked by kafka-go, and Close must still wait for them.
	gens sync.WaitGroup
	cur  atomic.Pointer[generation]
	// plainCommits leaves the settled map out of commits: set by tests
	// only, to measure the plain watermark the map improves on.
	plainCommits bool
}

var _ consumer.Source = (*Source)(nil)

type generation struct {
	// Gen: Ending (stop handing out; set when the generation ends) and
	// Outstanding (handed out, not settled or put back).
	kafkacore.Gen
	src     *feed
	g       *kafka.Generation
	id      int32
	parts   []*partition
	revoked atomic.Bool  // drop settlements; set after the final commit
	settled atomic.Int64 // since the last commit, for CommitEvery
	kick    chan struct{}
	// ctx ends with the generation (cancelled by its commit loop).
	ctx    context.Context
	cancel context.CancelFunc
}

// fetchLanes is how many fetchers a generation runs (at most one per
// partition).
const fetchLanes = 2

// minLaneShare is the least prefetch slots per partition for two lanes.
const minLaneShare = 16

type partition struct {
	gen   *generation
	topic string
	id    int
	wm    *Watermark
	retry bool

	// The fetcher's: the next offset to fetch (negative: kafka.FirstOffset
	// or LastOffset, to resolve), and until when not to fetch (a retry's
	// not-before, an error backoff).
	offset   int64
	hold     time.Time
	backoffD time.Duration
	skip     int64 // one past the transaction markers the last fetch passed over, -1 none
	// A retry partition waits at waitOff for its not-before (waiting: it
	// did since it read that record first). sighted says when it first
	// read the records it waits behind: the clamp of a forged not-before
	// is anchored there, not at each re-read.
	waitOff int64
	waiting bool
	sighted []sighting

	// The buffer's (under its lock): records fetched, not handed out.
	kafkacore.Part[*record]
}

type counters struct {
	fetched, fetchRequests, settled, fetchErrors, commits, commitErrors, staleSettles, dropped,
	localRetries, retryWrites, retryWriteErrors, generations, fenced,
	retryClamped, retryOriginRefused, skippedSettled, mapsRestored atomic.Int64
}

// Stats is a snapshot of a Source's counters.
type Stats struct {
	Fetched       int64 // records fetched from the broker and kept
	FetchRequests int64 // fetch requests sent
	Settled       int64 // messages acked or terminated by the route (not naks)
	FetchErrors   int64
	Commits       int64 // accepted commit requests
	CommitErrors  int64
	// FencedCommits counts commits the broker refused for a stale
	// generation or unknown member (included in CommitErrors).
	FencedCommits int64
	// StaleSettles counts settlements that arrived after their generation
	// ended: not committed, so those messages are delivered again.
	StaleSettles int64
	// Dropped counts buffered records discarded because their generation
	// ended before they were handed out (fetched again by the new owner).
	Dropped          int64
	LocalRetries     int64 // Naks kept in process
	RetryWrites      int64 // Naks written to the retry topic
	RetryWriteErrors int64
	// RetryClamped counts retry-topic records whose not-before lay beyond
	// the longest delay the route asks for (a skewed clock, a forged
	// record): they were held only that long after they were written (the
	// record's timestamp, or when the Source first read it if that is
	// earlier).
	RetryClamped int64
	// RetryOriginRefused counts retry-topic records naming an origin topic
	// the Source does not read: the header was ignored.
	RetryOriginRefused int64
	// SkippedSettled counts records passed over because the commit they
	// were assigned with lists them as settled (completed work not redone
	// after a restart or rebalance); MapsRestored the partitions whose
	// commit carried such a map.
	SkippedSettled, MapsRestored int64
	Generations                  int64
	// Buffered and BufferedBytes are what the Source holds now, outside the
	// route's window; PeakBytes the most it held (reservations included).
	Buffered      int
	BufferedBytes int64
	PeakBytes     int64
	PeakBuffered  int // the most records it held
	// Generation is the current generation id, -1 between generations.
	Generation int32
}

// ErrNotAttached is returned by Source.Ready before a route attached the
// Source: it joins its group only then (consumer.New attaches it), so
// there is nothing to wait for yet.
var ErrNotAttached = errors.New("kafka source: not attached to a route yet (consumer.New attaches it, and it joins its group then)")

// NewSource validates cfg and returns the Source. It joins the group when
// a route attaches it (consumer.New), in the background: see Ready.
func NewSource(cfg Config) (*Source, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	topics := append([]string(nil), cfg.Topics...)
	if cfg.RetryTopic != "" {
		topics = append(topics, cfg.RetryTopic)
	}
	cg, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID: cfg.GroupID, Brokers: cfg.Cluster.Brokers, Dialer: cfg.Cluster.dialer(), Topics: topics,
		SessionTimeout: cfg.SessionTimeout, HeartbeatInterval: cfg.HeartbeatInterval,
		RebalanceTimeout: cfg.RebalanceTimeout, JoinGroupBackoff: 500 * time.Millisecond,
		StartOffset: cfg.StartOffset, Logger: cfg.Logger, ErrorLogger: cfg.ErrorLogger,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: kafka source: %v", consumer.ErrInvalidOption, err)
	}
	s := &Source{cg: cg, cluster: cfg.Cluster, ready: make(chan struct{})}
	s.feed.init(cfg)
	rt := s.cluster.acquire(topics...)
	s.client = s.cluster.client(rt)
	if cfg.RetryTopic != "" {
		s.retryW = newWriter(s.cluster, rt, cfg.RetryTopic)
	}
	return s, nil
}

// Attach implements consumer.Source: the Source sizes its prefetch from the
// route's window and joins the group (Ready reports when it has its first
// assignment). A Source serves one route. Its SourceInfo.Ready reports
// whether it is a member of a formed group with a current generation
// (Consumer.Health: not ready while joining or rebalancing).
func (s *Source) Attach(l consumer.RouteLimits) (consumer.SourceInfo, error) {
	info, err := s.feed.attach(l, func() { go s.run() })
	if err == nil {
		info.Ready = s.readyNow
	}
	return info, err
}

// readyNow is SourceInfo.Ready: nil while the Source is a member of a
// formed group with a current generation; otherwise why not (still
// joining, rebalancing, a join error the application has to fix, closed).
func (s *Source) readyNow() error {
	if s.closed.Load() {
		return fmt.Errorf("kafka source: %w", consumer.ErrClosed)
	}
	if e := s.groupErr.Load(); e != nil {
		return *e
	}
	select {
	case <-s.ready:
	default:
		return fmt.Errorf("kafka source: joining group %s: no assignment yet", s.cfg.GroupID)
	}
	if g := s.cur.Load(); g == nil || g.Ending.Load() {
		return fmt.Errorf("kafka source: group %s is rebalancing: no current generation", s.cfg.GroupID)
	}
	return nil
}

type sysClock struct{}

func (sysClock) Now() time.Time { return time.Now() }

// Close leaves the group after a final commit of what is settled, and
// releases connections. Messages not settled by then are delivered again
// to whoever owns their partitions next. It is safe to call more than once.
func (s *Source) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.cancel()
	err := s.cg.Close()
	if s.started.Load() {
		<-s.done
	}
	s.gens.Wait()
	if s.retryW != nil {
		err = errors.Join(err, s.retryW.Close())
	}
	s.cluster.release()
	return err
}

// Stats returns a snapshot of the counters.
func (s *Source) Stats() Stats {
	st := s.feed.snapshot()
	if g := s.cur.Load(); g != nil && !g.Ending.Load() {
		st.Generation = g.id
	}
	return st
}

func (s *feed) snapshot() Stats {
	st := Stats{
		Fetched: s.stats.fetched.Load(), FetchRequests: s.stats.fetchRequests.Load(), Settled: s.stats.settled.Load(),
		FetchErrors: s.stats.fetchErrors.Load(),
		Commits:     s.stats.commits.Load(), CommitErrors: s.stats.commitErrors.Load(), FencedCommits: s.stats.fenced.Load(),
		StaleSettles: s.stats.staleSettles.Load(), Dropped: s.stats.dropped.Load(),
		LocalRetries: s.stats.localRetries.Load(), RetryWrites: s.stats.retryWrites.Load(),
		RetryWriteErrors: s.stats.retryWriteErrors.Load(), Generations: s.stats.generations.Load(),
		RetryClamped: s.stats.retryClamped.Load(), RetryOriginRefused: s.stats.retryOriginRefused.Load(),
		SkippedSettled: s.stats.skippedSettled.Load(), MapsRestored: s.stats.mapsRestored.Load(),
		Generation: -1,
	}
	if s.attached.Load() {
		st.Buffered, st.BufferedBytes, st.PeakBytes, st.PeakBuffered = s.buf.Usage()
	}
	return st
}

// Ready waits until the Source has joined its group and has its first
// generation's assignment (possibly no partitions, when the group has more
// members than partitions), and returns nil; or returns the error that
// keeps it from joining (a session timeout the broker refuses, missing
// authorization), ctx's error, or ErrClosed. Called before a route
// attached the Source (before consumer.New), when it has not started to
// join, it returns ErrNotAttached at once instead of waiting. A consumer
// does not need to wait for it; tests and benchmarks that start timing,
// and services that report readiness, do.
func (s *Source) Ready(ctx context.Context) error {
	if s.closed.Load() {
		return fmt.Errorf("kafka source: %w", consumer.ErrClosed)
	}
	if !s.started.Load() {
		return ErrNotAttached
	}
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-s.ready:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		case <-s.done:
			return fmt.Errorf("kafka source: %w", consumer.ErrClosed)
		case <-t.C:
			if e := s.groupErr.Load(); e != nil {
				return *e
			}
		}
	}
}

// Assigned returns the partitions of the current generation, topic →
// partition ids (nil between generations).
func (s *Source) Assigned() map[string][]int {
	g := s.cur.Load()
	if g == nil || g.Ending.Load() {
		return nil
	}
	out := map[string][]int{}
	for _, p := range g.parts {
		out[p.topic] = append(out[p.topic], p.id)
	}
	return out
}

// Bound returns the most bytes the Source has outside the route window:
// the records it holds, never more than PrefetchBytes (and, by count,
// below PrefetchMessages plus one response of at most PrefetchMessages
// per fetch lane: see Config.PrefetchMessages), plus what is in transit: a generation runs
// two fetchers (one for an odd number of partitions), each with one fetch response
// per partition leader broker in flight, at most FetchMaxBytes or, when a
// producer wrote a record batch larger than that, the largest batch
// (brokers return a whole first batch even when it is larger than asked).
// Of a response only what fits in the prefetch is kept; the rest is
// dropped and fetched again once room frees. maxBatch is the largest
// batch the producers write (0: none above FetchMaxBytes), brokers how
// many brokers lead the partitions it reads.
//
// Messages a Nak puts back for an in-process retry come on top, within
// their own allowance (Config.LocalRetryBytes and LocalRetryMessages);
// beyond it they take from the prefetch and may take the held records
// past it, by at most what the route window held (they came out of it);
// fetches then wait until the buffer drains.
func (s *Source) Bound(maxBatch int64, brokers int) int64 {
	return s.cfg.PrefetchBytes + fetchLanes*int64(max(brokers, 1))*max(int64(s.cfg.FetchMaxBytes), maxBatch)
}

func (s *Source) run() {
	defer close(s.done)
	for {
		g, err := s.cg.Next(s.ctx)
		if err != nil {
			if s.ctx.Err() != nil || errors.Is(err, kafka.ErrGroupClosed) {
				return
			}
			s.errorf("kafka source: group %s: %v", s.cfg.GroupID, err)
			if !transientGroupError(err) {
				err = fmt.Errorf("kafka source: joining group %s: %w", s.cfg.GroupID, err)
				s.groupErr.Store(&err)
			}
			continue
		}
		s.groupErr.Store(nil)
		s.start(g)
	}
}

// transientGroupError reports whether a group error is part of normal
// operation (a rebalance, a coordinator moving, a dropped connection)
// rather than a problem the application has to fix.
func transientGroupError(err error) bool {
	var ke kafka.Error
	if errors.As(err, &ke) {
		switch ke {
		case kafka.InvalidSessionTimeout, kafka.GroupAuthorizationFailed, kafka.TopicAuthorizationFailed,
			kafka.InconsistentGroupProtocol, kafka.InvalidGroupId, kafka.GroupMaxSizeReached,
			kafka.SASLAuthenticationFailed, kafka.ClusterAuthorizationFailed:
			return false
		}
	}
	return true
}

func (s *feed) errorf(format string, args ...any) {
	if s.cfg.ErrorLogger != nil {
		s.cfg.ErrorLogger.Printf(format, args...)
	}
}

func (s *Source) start(g *kafka.Generation) {
	s.stats.generations.Add(1)
	gen := &generation{src: &s.feed, g: g, id: g.ID, kick: make(chan struct{}, 1)}
	gen.ctx, gen.cancel = context.WithCancel(s.ctx)
	for topic, as := range g.Assignments {
		for _, a := range as {
			gen.parts = append(gen.parts, &partition{gen: gen, Part: kafkacore.Part[*record]{Gen: &gen.Gen}, topic: topic, id: a.ID, wm: NewWatermark(),
				retry: topic == s.cfg.RetryTopic, offset: a.Offset})
		}
	}
	slices.SortFunc(gen.parts, func(a, b *partition) int { return cmp.Or(strings.Compare(a.topic, b.topic), a.id-b.id) })
	s.restoreSettled(gen)
	if old := s.cur.Swap(gen); old != nil {
		old.Ending.Store(true)
	}
	s.once.Do(func() { close(s.ready) })
	// They run on gen.ctx, a plain cancel context the commit loop cancels
	// when the generation ends: a context derived from kafka-go's
	// generation context costs a goroutine per request.
	for _, parts := range s.lanes(gen.parts) {
		s.goGen(g, func(context.Context) { s.fetchLoop(gen.ctx, gen, parts) })
	}
	s.goGen(g, func(ctx context.Context) {
		s.commitLoop(ctx, gen)
	})
}

// lanes splits a generation's partitions between its fetchers. Two fetchers, each with half the
// partitions, so one's round trip overlaps the other's hand-out (one
// fetcher alone is bound by round trips on a real broker), when the
// partitions split evenly; else one.
func (s *feed) lanes(parts []*partition) [][]*partition {
	lanes := 1
	// A second lane pays off only with a prefetch of some slots per
	// partition: with a small one (a window of 8 over 4 partitions) it
	// buys little and adds a response to what the Source may hold.
	if n := len(parts); n >= fetchLanes && n%fetchLanes == 0 && s.buf.MaxCount() >= minLaneShare*n {
		// Lanes of unequal size would serve the smaller one's partitions
		// more often (each partition is the first of its lane's requests,
		// the one a broker lets exceed its share, in turn).
		lanes = fetchLanes
	}
	// No share of the slots per partition: a lane keeps each response
	// whole up to PrefetchMessages (the count only gates sending a fetch,
	// see kafkacore.Buffer.Admit), so one lane cannot crowd the other out
	// by the count, and lanes reserve in turn.
	out := make([][]*partition, lanes)
	for lane := range lanes {
		for i := lane; i < len(parts); i += lanes {
			out[lane] = append(out[lane], parts[i])
		}
	}
	return out
}

func (s *Source) goGen(g *kafka.Generation, fn func(ctx context.Context)) {
	s.gens.Add(1)
	g.Start(func(ctx context.Context) {
		defer s.gens.Done()
		fn(ctx)
	})
}

// commitLoop commits the generation's watermarks every CommitInterval (or
// after CommitEvery settlements) and, when the generation ends, stops
// handing its messages out, waits RevokeGrace for those in flight, commits
// once more and drops later settlements.
func (s *Source) commitLoop(ctx context.Context, g *generation) {
	t := time.NewTicker(s.cfg.CommitInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			g.cancel()
			g.Ending.Store(true)
			s.stats.dropped.Add(int64(s.buf.Purge(&g.Gen)))
			if s.cfg.RevokeGrace > 0 {
				deadline := time.Now().Add(s.cfg.RevokeGrace)
				for g.Outstanding.Load() > 0 && time.Now().Before(deadline) {
					time.Sleep(5 * time.Millisecond)
				}
			}
			s.commit(g)
			g.revoked.Store(true)
			s.cur.CompareAndSwap(g, nil)
			return
		case <-t.C:
		case <-g.kick:
		}
		s.commit(g)
	}
}

// commitTimeout bounds one commit request, the final one of a generation
// included (its generation's context has ended by then).
const commitTimeout = 10 * time.Second

// commit commits, within g, each partition's commit point that moved, or
// whose map of settled offsets above it changed, with that map in the
// commit's metadata (Watermark.CommitMetadata). A broker that refuses the
// metadata as too large (offset.metadata.max.bytes set below the 4 KiB
// default) gets the plain commit points instead.
func (s *Source) commit(g *generation) {
	type mark struct {
		p    *partition
		off  int64
		meta string
	}
	var marks []mark
	for _, p := range g.parts {
		if off, meta, ok := p.wm.CommitMetadata(); ok {
			marks = append(marks, mark{p, off, meta})
		}
	}
	if len(marks) == 0 {
		return
	}
	g.settled.Store(0)
	req := func(plain bool) *offsetcommit.Request {
		r := &offsetcommit.Request{GroupID: g.g.GroupID, GenerationID: g.id, MemberID: g.g.MemberID}
		for _, m := range marks {
			if n := len(r.Topics); n == 0 || r.Topics[n-1].Name != m.p.topic {
				r.Topics = append(r.Topics, offsetcommit.RequestTopic{Name: m.p.topic})
			}
			t := &r.Topics[len(r.Topics)-1]
			meta := m.meta
			if plain {
				meta = ""
			}
			t.Partitions = append(t.Partitions, offsetcommit.RequestPartition{PartitionIndex: int32(m.p.id),
				CommittedOffset: m.off, CommittedLeaderEpoch: -1, CommittedMetadata: meta})
		}
		return r
	}
	plain := s.plainCommits
	err := s.commitRequest(req(plain))
	if !plain && errors.Is(err, kafka.OffsetMetadataTooLarge) {
		plain = true
		err = s.commitRequest(req(true))
	}
	if err != nil {
		s.stats.commitErrors.Add(1)
		if errors.Is(err, kafka.IllegalGeneration) || errors.Is(err, kafka.UnknownMemberId) || errors.Is(err, kafka.FencedInstanceID) {
			s.stats.fenced.Add(1)
		}
		s.errorf("kafka source: commit generation %d: %v", g.id, err)
		return
	}
	offsets := map[string]map[int]int64{}
	for _, m := range marks {
		if plain {
			m.meta = ""
		}
		m.p.wm.CommittedMetadata(m.off, m.meta)
		if offsets[m.p.topic] == nil {
			offsets[m.p.topic] = map[int]int64{}
		}
		offsets[m.p.topic][m.p.id] = m.off
	}
	s.stats.commits.Add(1)
	if s.cfg.OnCommit != nil {
		s.cfg.OnCommit(g.id, offsets)
	}
}

// commitRequest sends req to the group's coordinator and returns the
// request's error or the first partition's.
func (s *Source) commitRequest(req *offsetcommit.Request) error {
	ctx, cancel := context.WithTimeout(context.Background(), commitTimeout)
	defer cancel()
	m, err := s.client.Transport.RoundTrip(ctx, s.client.Addr, req)
	if err != nil {
		return err
	}
	for _, t := range m.(*offsetcommit.Response).Topics {
		for _, p := range t.Partitions {
			if p.ErrorCode != 0 {
				return fmt.Errorf("%s/%d: %w", t.Name, p.PartitionIndex, kafka.Error(p.ErrorCode))
			}
		}
	}
	return nil
}

// restoreSettled reads the metadata of the commits g's partitions start
// from and restores their maps of settled offsets, so the records a
// previous owner settled above its commit are passed over. Without it
// (the request failed) nothing is lost: those records are handed out
// again.
func (s *Source) restoreSettled(g *generation) {
	ids := map[string][]int{}
	byKey := map[topicPartition]*partition{}
	for _, p := range g.parts {
		if p.offset >= 0 {
			ids[p.topic] = append(ids[p.topic], p.id)
			byKey[topicPartition{p.topic, p.id}] = p
		}
	}
	if len(ids) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(s.ctx, commitTimeout)
	defer cancel()
	var res *kafka.OffsetFetchResponse
	err := whileCoordinatorMoves(ctx, func() error {
		var ferr error
		res, ferr = s.client.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: s.cfg.GroupID, Topics: ids})
		if ferr == nil && coordinatorMoving(res.Error) {
			return res.Error
		}
		return ferr
	})
	if err == nil {
		err = res.Error
	}
	if err != nil {
		s.errorf("kafka source: reading the settled maps of group %s: %v", s.cfg.GroupID, err)
		return
	}
	for topic, ps := range res.Topics {
		for _, r := range ps {
			p := byKey[topicPartition{topic, r.Partition}]
			if p == nil || r.Error != nil || r.CommittedOffset != p.offset || r.Metadata == "" {
				continue // moved since the assignment was read: start plain
			}
			if p.wm.Restore(p.offset, r.Metadata) > 0 {
				s.stats.mapsRestored.Add(1)
			}
		}
	}
}
