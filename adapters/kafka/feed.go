package kafkaadapter

import (
	"context"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/kafkacore"
)

// feed is what the two Sources (Source over a consumer group, ReaderSource
// over a kafka.Reader) share: the prefetch buffer, the hand-out (Fetch),
// settlement of the records it handed out (record's Acker methods, the
// partitions' watermarks), in-process and retry-topic retries, and the
// counters.
type feed struct {
	cfg    Config
	buf    *kafkacore.Buffer[*record]
	clock  consumer.Clock
	retryW *kafka.Writer // nil without a RetryTopic

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{} // closed when the Source's own goroutines are gone
	closed atomic.Bool
	// groupErr is the last error joining the group that retrying cannot
	// fix (a session timeout the broker refuses, no authorization): Fetch
	// reports it while there is no generation. nil once a generation
	// starts.
	groupErr atomic.Pointer[error]
	stats    counters
	out      []*record // Fetch scratch

	// attach sizes buf from the route's window and calls start, once;
	// started says start ran (Close then waits for done).
	attachMu sync.Mutex
	limits   consumer.RouteLimits
	attached atomic.Bool
	started  atomic.Bool
}

func (f *feed) init(cfg Config) {
	f.cfg, f.clock, f.done = cfg, cfg.Clock, make(chan struct{})
	if f.clock == nil {
		f.clock = sysClock{}
	}
	f.ctx, f.cancel = context.WithCancel(context.Background())
}

// attach is both Sources' consumer.Source Attach: the prefetch is sized
// from the route's window, then start runs the Source's goroutines (joins
// the group, or starts reading from the wrapped Reader). A Source serves
// one route; the same route may attach it again (a New that failed and is
// retried).
func (f *feed) attach(l consumer.RouteLimits, start func()) (consumer.SourceInfo, error) {
	if f.closed.Load() {
		return consumer.SourceInfo{}, fmt.Errorf("kafka source: %w", consumer.ErrClosed)
	}
	f.attachMu.Lock()
	defer f.attachMu.Unlock()
	if f.attached.Load() {
		if f.limits != l {
			return consumer.SourceInfo{}, fmt.Errorf("%w: kafka source already serves route %q", consumer.ErrInvalidOption, f.limits.Route)
		}
		return consumer.SourceInfo{}, nil
	}
	f.limits = l
	f.cfg.sizeFrom(l)
	f.buf = kafkacore.NewBuffer[*record](f.cfg.PrefetchMessages, f.cfg.PrefetchBytes, f.cfg.LocalRetryMessages, f.cfg.LocalRetryBytes)
	f.attached.Store(true)
	f.started.Store(true)
	start()
	return consumer.SourceInfo{}, nil
}

// maxDelay is the longest retry delay the route asks for (RouteLimits): a
// retry-topic not-before further out is clamped to it.
func (f *feed) maxDelay() time.Duration { return max(f.cfg.LocalRetryMaxDelay, f.limits.MaxDelay) }

// record is one fetched message and, while handed out, its Acker.
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
	clamped      bool // a retry whose not-before was clamped (parseRetry)
}

func (s *feed) convert(p *partition, kr *kafka.Record, now time.Time) (*record, error) {
	key, value, err := readKeyValue(kr)
	if err != nil {
		return nil, err
	}
	r := newRecord(p, kr.Offset, key, value, kr.Headers, kr.Time)
	if p.retry {
		res := parseRetry(r, now, p.seen(kr.Offset), s.maxDelay(), s.cfg.Topics)
		r.clamped = res.clamped // counted once, by dueRetries
		if res.refused {
			s.stats.retryOriginRefused.Add(1)
		}
	}
	return r, nil
}

// readKeyValue copies a record's key and value out of the fetch response
// (one allocation for both) and closes them, so the response's pages go
// back to kafka-go's pool instead of being garbage.
func readKeyValue(kr *kafka.Record) (key, value []byte, err error) {
	kn, vn := -1, -1
	if kr.Key != nil {
		kn = kr.Key.Len()
		defer kr.Key.Close()
	}
	if kr.Value != nil {
		vn = kr.Value.Len()
		defer kr.Value.Close()
	}
	buf := make([]byte, max(kn, 0)+max(vn, 0))
	if kn >= 0 {
		key = buf[:kn:kn]
		if _, err := io.ReadFull(kr.Key, key); err != nil {
			return nil, nil, err
		}
	}
	if vn >= 0 {
		value = buf[max(kn, 0):]
		if _, err := io.ReadFull(kr.Value, value); err != nil {
			return nil, nil, err
		}
	}
	return key, value, nil
}

// BufferSize, BufferDue and BufferPart make record a kafkacore.Item.
func (r *record) BufferSize() int64                    { return r.size }
func (r *record) BufferDue() time.Time                 { return r.due }
func (r *record) BufferPart() *kafkacore.Part[*record] { return &r.part.Part }

// newRecord is the one conversion of a Kafka record into what the Source
// hands out, for both Sources.
func newRecord(p *partition, offset int64, key, value []byte, hs []kafka.Header, t time.Time) *record {
	var unordered func(string) bool
	if p.retry {
		unordered = isRetryHeader // parseRetry removes them
	}
	h, size := headerMap(hs, nil, unordered)
	return &record{
		part: p, offset: offset, key: key, value: value, headers: h, time: t, attempt: 1,
		size:   max(size+int64(len(key)+len(value)), 1),
		origin: dlq.Origin{Topic: p.topic, Partition: int32(p.id), Offset: offset, Group: p.gen.src.cfg.GroupID},
	}
}

// Fetch hands out up to maxMessages buffered messages totalling at most
// maxBytes (or one larger message alone), waiting at most PollWait for the
// first. Due in-process retries come first.
func (s *feed) Fetch(ctx context.Context, maxMessages int, maxBytes int64) ([]*consumer.Message, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("kafka source: %w", consumer.ErrClosed)
	}
	// A done ctx returns at once, before taking anything: on shutdown the
	// consumer naks what it fetches straight back (Nak(0) requeues in
	// process), and handing it out again would go round in circles.
	if err := ctx.Err(); err != nil || maxMessages <= 0 {
		return nil, err
	}
	var poll *time.Timer
	defer func() {
		if poll != nil {
			poll.Stop()
		}
	}()
	for {
		recs, next := s.buf.Take(s.clock.Now(), maxMessages, maxBytes, s.out[:0])
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
			s.out = recs[:0]
			return out, nil
		}
		if poll == nil {
			poll = time.NewTimer(s.cfg.PollWait)
		}
		var dueC <-chan time.Time
		var due *time.Timer
		if !next.IsZero() {
			due = time.NewTimer(max(next.Sub(s.clock.Now()), time.Millisecond))
			dueC = due.C
		}
		var err error
		stop := true
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-poll.C:
			if e := s.groupErr.Load(); e != nil {
				err = *e
			}
		case <-s.done:
			err = fmt.Errorf("kafka source: %w", consumer.ErrClosed)
		case <-s.buf.Wake():
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

// settle marks r settled in its partition's watermark, unless the
// generation that delivered it is over.
func (r *record) settle() {
	g := r.part.gen
	g.Outstanding.Add(-1)
	if g.revoked.Load() {
		g.src.stats.staleSettles.Add(1)
		return
	}
	r.part.wm.Settle(r.offset)
	if n := g.src.cfg.CommitEvery; n > 0 && g.settled.Add(1) >= int64(n) {
		select {
		case g.kick <- struct{}{}:
		default:
		}
	}
}

// Settle implements consumer.Acker. An Ack or a Term (dead-lettered,
// expired, terminated: it must not come back) marks the offset settled in
// its partition's watermark; a Nak retries it (see nak).
func (r *record) Settle(ctx context.Context, s consumer.Settlement) error {
	if s.Op == consumer.SettleNak {
		return r.nak(ctx, s.Delay)
	}
	r.part.gen.src.stats.settled.Add(1)
	r.settle()
	return nil
}

// InProgress does nothing: Kafka has no per-message ack deadline.
func (r *record) InProgress(context.Context) error { return nil }

// Revoked implements consumer.Revocable: once the generation that
// delivered r has ended (a rebalance began), the route does not start r;
// the partition's next owner delivers it again from the final commit, so
// it never runs here after a later message of its key ran there.
func (r *record) Revoked() bool { return r.part.gen.Ending.Load() }

// nak puts the message back for another attempt without blocking its
// partition: in process for delays up to LocalRetryMaxDelay, otherwise
// (and when the in-process retries' allowance is full) through the retry
// topic if there is one.
// The original is settled only after the retry topic acknowledged the copy;
// a failed write keeps it in process. A message whose generation is over
// is dropped: it is not committed, so it is delivered again.
func (r *record) nak(ctx context.Context, delay time.Duration) error {
	g := r.part.gen
	s := g.src
	if g.Ending.Load() {
		g.Outstanding.Add(-1)
		s.stats.staleSettles.Add(1)
		return nil
	}
	now := s.clock.Now()
	// An ordered route naks only what it hands back (shutdown, revoke): in
	// process it is dropped with the generation and read again from the
	// commit, in order; a retry-topic copy would come back out of order.
	if s.retryW != nil && s.limits.Ordering == consumer.Unordered && (delay > s.cfg.LocalRetryMaxDelay || s.buf.Full(r)) {
		if err := s.writeRetry(ctx, r, now, now.Add(delay)); err == nil {
			s.stats.retryWrites.Add(1)
			r.settle()
			return nil
		}
		s.stats.retryWriteErrors.Add(1)
		delay = min(delay, s.cfg.LocalRetryMaxDelay)
	}
	g.Outstanding.Add(-1)
	s.stats.localRetries.Add(1)
	if r.firstFailure.IsZero() {
		r.firstFailure = now
	}
	r.attempt++
	r.due = now.Add(delay)
	s.buf.PushDelayed(r)
	return nil
}

var (
	_ consumer.Acker     = (*record)(nil)
	_ consumer.Revocable = (*record)(nil)
)
