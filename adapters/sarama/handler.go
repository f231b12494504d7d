package saramaadapter

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/IBM/sarama"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/kafkacore"
)

// Defaults of Config.
const (
	DefaultCommitInterval     = time.Second
	DefaultPollWait           = time.Second
	DefaultRevokeGrace        = 2 * time.Second
	DefaultLocalRetryMaxDelay = 5 * time.Second
)

// Config configures a Handler. Every field is optional; a zero value picks
// the default named.
type Config struct {
	// GroupID and Client, when both are set, let the Handler read the
	// metadata of the commits its claims start from (an OffsetFetch on the
	// group's coordinator through Client): the map of offsets a previous
	// owner settled above its commit point, which it then passes over
	// instead of handing out again. Without them a restart or rebalance
	// redelivers everything above the commit point (nothing is lost). Use
	// the client the group was made from (sarama.NewConsumerGroupFromClient).
	GroupID string
	Client  sarama.Client
	// PrefetchMessages and PrefetchBytes bound what the Handler holds that
	// the route's window does not: records read from the claims' channels
	// and not handed out yet (and in-process retries beyond their own
	// allowance). 0 means the window's numbers. On top of them sarama holds,
	// per claimed partition, Consumer.ChannelBufferSize messages in the
	// claim's channel, one message a ConsumeClaim waits to admit, and what
	// its fetch responses bring in flight (see Bound).
	PrefetchMessages int
	PrefetchBytes    int64
	// PollWait is the longest one Fetch blocks without a message. 0 means 1 s.
	PollWait time.Duration
	// CommitInterval is how often each claim marks its commit point (with
	// the settled map as metadata) on the session. sarama commits marks on
	// its own (Consumer.Offsets.AutoCommit, every second by default) and
	// once more when a session ends. 0 means 1 s; negative is invalid.
	CommitInterval time.Duration
	// Commit, when true, calls session.Commit after each mark that changed
	// something: for groups with Consumer.Offsets.AutoCommit.Enable false.
	Commit bool
	// RevokeGrace is how long, when a claim ends (a rebalance, the group
	// closing), its ConsumeClaim waits for the messages handed out from it
	// to be settled before its final mark. Settlements after that are
	// dropped: those messages are delivered again to the partition's next
	// owner. Keep it below Consumer.Group.Rebalance.Timeout. 0 means 2 s;
	// negative means no wait.
	RevokeGrace time.Duration
	// LocalRetryMaxDelay caps the delay of a Nak: the message waits in
	// process and is handed out again with Attempt + 1, without blocking
	// its partition (its offset stays uncommitted meanwhile). 0 means 5 s.
	LocalRetryMaxDelay time.Duration
	// LocalRetryMessages and LocalRetryBytes are the allowance of messages
	// waiting in process for a retry, outside the prefetch; beyond it they
	// take from the prefetch (reading slows, and stops once they hold it
	// all: a Nak never loses a message). 0 means 16 × PrefetchMessages and
	// PrefetchBytes.
	LocalRetryMessages int
	LocalRetryBytes    int64
	// Clock reads time for retry decisions. nil means the system clock.
	Clock consumer.Clock
}

func (c *Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: sarama handler: "+format, append([]any{consumer.ErrInvalidOption}, args...)...)
	}
	switch {
	case c.PrefetchMessages < 0 || c.PrefetchBytes < 0 || c.LocalRetryMessages < 0 || c.LocalRetryBytes < 0:
		return bad("prefetch sizes must not be negative")
	case c.PollWait < 0 || c.CommitInterval < 0 || c.LocalRetryMaxDelay < 0:
		return bad("durations must not be negative")
	case (c.GroupID == "") != (c.Client == nil):
		return bad("GroupID and Client go together (both set: settled maps are restored; neither: they are not)")
	}
	c.PollWait = cmp.Or(c.PollWait, DefaultPollWait)
	c.CommitInterval = cmp.Or(c.CommitInterval, DefaultCommitInterval)
	c.RevokeGrace = cmp.Or(c.RevokeGrace, DefaultRevokeGrace)
	c.LocalRetryMaxDelay = cmp.Or(c.LocalRetryMaxDelay, DefaultLocalRetryMaxDelay)
	if c.Clock == nil {
		c.Clock = sysClock{}
	}
	return nil
}

type sysClock struct{}

func (sysClock) Now() time.Time { return time.Now() }

// Handler is both a sarama.ConsumerGroupHandler and a consumer.Source: an
// existing sarama consumer group loop
//
//	for ctx.Err() == nil {
//		if err := group.Consume(ctx, topics, h); err != nil { ... }
//	}
//
// keeps its shape, with the Handler in place of the application's own,
// while a sluice route (consumer.New(h, route)) runs the messages with its
// window, retries, dead letters and ordering.
//
// Each ConsumeClaim reads its claim's messages into a prefetch bounded by
// count and bytes (shared by the claims, served to the route round robin),
// and only when there is room: sarama's fetches stop once its channels
// are full. Every partition has a watermark; each claim marks its commit
// point (the lowest offset handed out and not settled) on the session
// every CommitInterval, with the map of offsets settled above it in the
// offset metadata, so a restart or a rebalance does not redo completed
// work (see Config.Client). When a claim ends (rebalance, Close), its
// records not handed out are dropped, the messages the route holds from it
// are not started any more (consumer.Revocable), ConsumeClaim waits
// RevokeGrace for those running and marks a final time before sarama's
// last commit of the session.
//
// Run the route (consumer.Run) and the group loop side by side; when
// stopping, let Run return first (it settles what it holds), then stop
// the group loop and close the group, which commits the final marks.
type Handler struct {
	cfg   Config
	buf   *kafkacore.Buffer[*record]
	stats counters

	attachMu sync.Mutex
	limits   consumer.RouteLimits
	attached atomic.Bool
	ready    chan struct{} // closed when attached

	closed  atomic.Bool
	done    chan struct{} // closed by Close
	once    sync.Once
	claims  atomic.Int64
	outMu   sync.Mutex
	scratch []*record
}

var (
	_ consumer.Source             = (*Handler)(nil)
	_ sarama.ConsumerGroupHandler = (*Handler)(nil)
)

type counters struct {
	fetched, settled, staleSettles, dropped, localRetries, skippedSettled, mapsRestored, marks, sessions atomic.Int64
}

// Stats is a snapshot of a Handler's counters.
type Stats struct {
	Fetched int64 // records read from claims and kept
	Settled int64 // messages acked or terminated by the route (not naks)
	// StaleSettles counts settlements that came after their claim ended:
	// not marked, so those messages are delivered again.
	StaleSettles int64
	// Dropped counts records discarded because their claim ended before
	// they were handed out (the next owner reads them again).
	Dropped      int64
	LocalRetries int64 // Naks kept in process
	// SkippedSettled counts records passed over because the commit their
	// claim started from lists them as settled; MapsRestored the claims
	// whose commit carried such a map.
	SkippedSettled, MapsRestored int64
	Marks                        int64 // MarkOffset or ResetOffset calls that changed the mark
	Sessions                     int64 // Setup calls
	// Buffered and BufferedBytes are what the Handler holds now, outside
	// the route's window; PeakBytes and PeakBuffered the most it held.
	Buffered      int
	BufferedBytes int64
	PeakBytes     int64
	PeakBuffered  int
	Claims        int // claims running now
}

// NewHandler validates cfg and returns the Handler. Pass it to
// consumer.New (it serves one route) and to the group's Consume.
func NewHandler(cfg Config) (*Handler, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Handler{cfg: cfg, ready: make(chan struct{}), done: make(chan struct{})}, nil
}

// Attach implements consumer.Source: the Handler sizes its prefetch from
// the route's window. Claims wait for it before reading.
func (h *Handler) Attach(l consumer.RouteLimits) (consumer.SourceInfo, error) {
	if h.closed.Load() {
		return consumer.SourceInfo{}, fmt.Errorf("sarama handler: %w", consumer.ErrClosed)
	}
	h.attachMu.Lock()
	defer h.attachMu.Unlock()
	if h.attached.Load() {
		if h.limits != l {
			return consumer.SourceInfo{}, fmt.Errorf("%w: sarama handler already serves route %q", consumer.ErrInvalidOption, h.limits.Route)
		}
		return consumer.SourceInfo{}, nil
	}
	h.limits = l
	c := &h.cfg
	c.PrefetchMessages = max(cmp.Or(c.PrefetchMessages, l.Messages), 1)
	c.PrefetchBytes = max(cmp.Or(c.PrefetchBytes, l.Bytes), 1)
	c.LocalRetryMessages = cmp.Or(c.LocalRetryMessages, 16*c.PrefetchMessages)
	c.LocalRetryBytes = cmp.Or(c.LocalRetryBytes, c.PrefetchBytes)
	h.buf = kafkacore.NewBuffer[*record](c.PrefetchMessages, c.PrefetchBytes, c.LocalRetryMessages, c.LocalRetryBytes)
	h.attached.Store(true)
	close(h.ready)
	return consumer.SourceInfo{}, nil
}

// Close makes Fetch return consumer.ErrClosed and running ConsumeClaims
// end (as when their claims end). Call it after the route's Run returned;
// it does not close the group. It is safe to call more than once.
func (h *Handler) Close() error {
	h.once.Do(func() {
		h.closed.Store(true)
		close(h.done)
	})
	return nil
}

// Stats returns a snapshot of the counters.
func (h *Handler) Stats() Stats {
	s := &h.stats
	st := Stats{
		Fetched: s.fetched.Load(), Settled: s.settled.Load(), StaleSettles: s.staleSettles.Load(),
		Dropped: s.dropped.Load(), LocalRetries: s.localRetries.Load(), SkippedSettled: s.skippedSettled.Load(),
		MapsRestored: s.mapsRestored.Load(), Marks: s.marks.Load(), Sessions: s.sessions.Load(),
		Claims: int(h.claims.Load()),
	}
	if h.attached.Load() {
		st.Buffered, st.BufferedBytes, st.PeakBytes, st.PeakBuffered = h.buf.Usage()
	}
	return st
}

// Bound returns the most messages held outside the route's window for
// claims claimed partitions read with sarama configuration sc: the
// prefetch (PrefetchMessages), and per partition sarama's claim channel
// (Consumer.ChannelBufferSize), the one message its ConsumeClaim waits to
// admit, and the messages of one fetch response sarama's partition
// consumer is feeding (at most Consumer.Fetch.Default bytes' worth; it is
// not counted here, as it depends on record sizes). A small
// ChannelBufferSize keeps sarama's share small.
func (h *Handler) Bound(sc *sarama.Config, claims int) int {
	return h.cfg.PrefetchMessages + claims*(sc.ChannelBufferSize+1)
}

// generation is one claim: a partition owned from ConsumeClaim's start to
// its end.
type generation struct {
	kafkacore.Gen
	h       *Handler
	revoked atomic.Bool // settlements dropped; set after the final mark
}

type partition struct {
	gen   *generation
	topic string
	id    int32
	wm    *kafkacore.Watermark
	kafkacore.Part[*record]
}

// record is one message read from a claim and, while handed out, its
// Acker.
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
}

// BufferSize, BufferDue and BufferPart make record a kafkacore.Item.
func (r *record) BufferSize() int64                    { return r.size }
func (r *record) BufferDue() time.Time                 { return r.due }
func (r *record) BufferPart() *kafkacore.Part[*record] { return &r.part.Part }

// header is sarama's record header in the core's shape.
type header struct {
	Key   string
	Value []byte
}

func newRecord(p *partition, m *sarama.ConsumerMessage, group string) *record {
	hs := make([]header, 0, len(m.Headers))
	for _, x := range m.Headers {
		if x != nil {
			hs = append(hs, header{Key: string(x.Key), Value: x.Value})
		}
	}
	hm, size := kafkacore.HeaderMap(hs, nil, nil)
	return &record{
		part: p, offset: m.Offset, key: m.Key, value: m.Value, headers: hm, time: m.Timestamp, attempt: 1,
		size:   max(size+int64(len(m.Key)+len(m.Value)), 1),
		origin: dlq.Origin{Topic: p.topic, Partition: p.id, Offset: m.Offset, Group: group},
	}
}

// Setup implements sarama.ConsumerGroupHandler. It counts the session.
func (h *Handler) Setup(sarama.ConsumerGroupSession) error {
	h.stats.sessions.Add(1)
	return nil
}

// Cleanup implements sarama.ConsumerGroupHandler. Every claim of the
// session has marked its final commit point by then (ConsumeClaim does
// before it returns); sarama commits the marks after Cleanup.
func (h *Handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }

// ConsumeClaim implements sarama.ConsumerGroupHandler: it reads the
// claim's messages into the prefetch while there is room, marks the
// partition's commit point every CommitInterval, and when the claim ends
// (its channel closes, the session's context is done, Close) stops
// handing its messages out, waits RevokeGrace for those the route holds
// and marks once more.
func (h *Handler) ConsumeClaim(sess sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	ctx := sess.Context()
	select {
	case <-h.ready:
	case <-ctx.Done():
		return nil
	case <-h.done:
		return nil
	}
	h.claims.Add(1)
	defer h.claims.Add(-1)
	g := &generation{h: h}
	p := &partition{gen: g, topic: claim.Topic(), id: claim.Partition(), wm: kafkacore.NewWatermark(), Part: kafkacore.Part[*record]{Gen: &g.Gen}}
	h.begin(p, claim.InitialOffset())
	h.buf.SetShares(max(int(h.claims.Load()), 1))
	tick := time.NewTicker(h.cfg.CommitInterval)
	defer tick.Stop()
	defer h.end(sess, p)
	msgs := claim.Messages()
	for {
		select {
		case m, ok := <-msgs:
			if !ok {
				return nil
			}
			if !h.admit(sess, p, m, tick.C) {
				return nil
			}
		case <-tick.C:
			h.mark(sess, p)
		case <-ctx.Done():
			return nil
		case <-h.done:
			return nil
		}
	}
}

// begin sets p up at the offset its claim starts from (the group's commit,
// or sarama's Consumer.Offsets.Initial when there is none) and restores
// the settled map of that commit's metadata.
func (h *Handler) begin(p *partition, initial int64) {
	if initial < 0 {
		return
	}
	// Restore first: it takes a map only before anything is positioned.
	if h.cfg.Client != nil {
		if off, meta, err := h.fetchCommit(p.topic, p.id); err == nil && off == initial && meta != "" {
			if p.wm.Restore(initial, meta) > 0 {
				h.stats.mapsRestored.Add(1)
				p.wm.Begin(initial)
				return
			}
		} // else start plain: nothing is lost, settled work is redone
	}
	p.wm.Begin(initial)
	p.wm.Committed(initial)
}

// fetchCommit reads the group's committed offset and metadata of one
// partition from its coordinator.
func (h *Handler) fetchCommit(topic string, part int32) (int64, string, error) {
	c := h.cfg.Client
	b, err := c.Coordinator(h.cfg.GroupID)
	if err != nil {
		return 0, "", err
	}
	req := sarama.NewOffsetFetchRequest(c.Config().Version, h.cfg.GroupID, map[string][]int32{topic: {part}})
	resp, err := b.FetchOffset(req)
	if err != nil {
		return 0, "", err
	}
	blk := resp.GetBlock(topic, part)
	if blk == nil {
		return 0, "", errors.New("sarama handler: no offset in the coordinator's answer")
	}
	if blk.Err != sarama.ErrNoError {
		return 0, "", blk.Err
	}
	return blk.Offset, blk.Metadata, nil
}

// admit puts m into the prefetch once it fits, marking meanwhile; false
// when the claim ended while it waited.
func (h *Handler) admit(sess sarama.ConsumerGroupSession, p *partition, m *sarama.ConsumerMessage, tick <-chan time.Time) bool {
	if p.wm.Skip(m.Offset) {
		// Settled by a previous owner (its commit's map).
		p.wm.Advance(m.Offset + 1)
		h.stats.skippedSettled.Add(1)
		return true
	}
	r := newRecord(p, m, h.cfg.GroupID)
	one := [][]*record{{r}}
	for {
		// The channel is read before Admit so that room freed in between
		// is not missed.
		_, _, _, space := h.buf.TryReserve(0, nil)
		if h.buf.Admit(0, one, nil)[0] == 1 {
			break
		}
		select {
		case <-space:
		case <-tick:
			h.mark(sess, p)
		case <-sess.Context().Done():
			return false
		case <-h.done:
			return false
		}
	}
	p.wm.Deliver(r.offset)
	h.stats.fetched.Add(1)
	h.stats.dropped.Add(int64(h.buf.Publish(&p.Part, []*record{r})))
	return true
}

// mark marks p's commit point with its settled map on the session, when
// either changed since the last mark.
func (h *Handler) mark(sess sarama.ConsumerGroupSession, p *partition) {
	off, meta, ok := p.wm.CommitMetadata()
	if !ok {
		return
	}
	if off > p.wm.LastCommitted() {
		sess.MarkOffset(p.topic, p.id, off, meta)
	} else {
		// Same commit point, new map: MarkOffset only moves forward.
		sess.ResetOffset(p.topic, p.id, off, meta)
	}
	p.wm.CommittedMetadata(off, meta)
	h.stats.marks.Add(1)
	if h.cfg.Commit {
		sess.Commit()
	}
}

// end is a claim's revoke: its queued records are dropped, those handed
// out are not started any more (Revoked) and get RevokeGrace to settle,
// then the final mark; later settlements are dropped.
func (h *Handler) end(sess sarama.ConsumerGroupSession, p *partition) {
	g := p.gen
	g.Ending.Store(true)
	h.stats.dropped.Add(int64(h.buf.Purge(&g.Gen)))
	if h.cfg.RevokeGrace > 0 {
		deadline := time.Now().Add(h.cfg.RevokeGrace)
		for g.Outstanding.Load() > 0 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
	}
	h.mark(sess, p)
	g.revoked.Store(true)
	h.buf.SetShares(max(int(h.claims.Load())-1, 1))
}

// Fetch implements consumer.Source: it hands out up to maxMessages
// buffered messages totalling at most maxBytes (or one larger message
// alone), waiting at most PollWait for the first. Due in-process retries
// come first.
func (h *Handler) Fetch(ctx context.Context, maxMessages int, maxBytes int64) ([]*consumer.Message, error) {
	if h.closed.Load() {
		return nil, fmt.Errorf("sarama handler: %w", consumer.ErrClosed)
	}
	if err := ctx.Err(); err != nil || maxMessages <= 0 || !h.attached.Load() {
		return nil, err
	}
	var poll *time.Timer
	defer func() {
		if poll != nil {
			poll.Stop()
		}
	}()
	for {
		h.outMu.Lock()
		recs, next := h.buf.Take(h.cfg.Clock.Now(), maxMessages, maxBytes, h.scratch[:0])
		if len(recs) > 0 {
			out := make([]*consumer.Message, len(recs))
			ms := make([]consumer.Message, len(recs))
			for i, r := range recs {
				m := &ms[i]
				consumer.InitMessage(m, r)
				m.Topic, m.Key, m.Value, m.Headers = r.origin.Topic, r.key, r.value, r.headers
				m.PublishedAt, m.Attempt, m.Size, m.Origin = r.time, r.attempt, r.size, r.origin
				m.FirstFailure = r.firstFailure
				out[i] = m
				recs[i] = nil
			}
			h.scratch = recs[:0]
			h.outMu.Unlock()
			return out, nil
		}
		h.scratch = recs[:0]
		h.outMu.Unlock()
		if poll == nil {
			poll = time.NewTimer(h.cfg.PollWait)
		}
		var dueC <-chan time.Time
		var due *time.Timer
		if !next.IsZero() {
			due = time.NewTimer(max(next.Sub(h.cfg.Clock.Now()), time.Millisecond))
			dueC = due.C
		}
		var err error
		stop := true
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-poll.C:
		case <-h.done:
			err = fmt.Errorf("sarama handler: %w", consumer.ErrClosed)
		case <-h.buf.Wake():
			stop = false
		case <-dueC:
			stop = false
		}
		if due != nil {
			due.Stop()
		}
		if stop {
			return nil, err
		}
	}
}

// settle marks r settled in its partition's watermark, unless its claim
// ended.
func (r *record) settle() {
	g := r.part.gen
	g.Outstanding.Add(-1)
	if g.revoked.Load() {
		g.h.stats.staleSettles.Add(1)
		return
	}
	r.part.wm.Settle(r.offset)
}

// Settle implements consumer.Acker. An Ack or a Term (dead-lettered,
// expired, terminated) marks the offset settled; a Nak keeps the message
// in process for another attempt after the delay (at most
// LocalRetryMaxDelay), without blocking its partition. A Nak of a message
// whose claim ended drops it: it is not marked, so the next owner reads it
// again.
func (r *record) Settle(_ context.Context, s consumer.Settlement) error {
	g := r.part.gen
	h := g.h
	if s.Op != consumer.SettleNak {
		h.stats.settled.Add(1)
		r.settle()
		return nil
	}
	if g.Ending.Load() {
		g.Outstanding.Add(-1)
		h.stats.staleSettles.Add(1)
		return nil
	}
	now := h.cfg.Clock.Now()
	g.Outstanding.Add(-1)
	h.stats.localRetries.Add(1)
	if r.firstFailure.IsZero() {
		r.firstFailure = now
	}
	r.attempt++
	r.due = now.Add(min(s.Delay, h.cfg.LocalRetryMaxDelay))
	h.buf.PushDelayed(r)
	return nil
}

// InProgress does nothing: Kafka has no per-message ack deadline.
func (r *record) InProgress(context.Context) error { return nil }

// Revoked implements consumer.Revocable: once r's claim ended, the route
// does not start it; the partition's next owner reads it again from the
// final mark.
func (r *record) Revoked() bool { return r.part.gen.Ending.Load() }

var (
	_ consumer.Acker     = (*record)(nil)
	_ consumer.Revocable = (*record)(nil)
)
