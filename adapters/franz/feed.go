package franzadapter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/kafkacore"
)

// pollLoop moves records from the client into the prefetch buffer: it
// waits until the buffer has room (kafkacore.Buffer.Reserve: a quarter of
// the message slots and of PrefetchBytes free), then polls at most the
// free message slots. While the buffer is full nothing is polled, kgo's
// one buffered fetch per broker stays undrained and kgo sends no further
// fetch: slowness becomes consumer lag at the broker.
func (s *Source) pollLoop() {
	defer s.wg.Done()
	want := max(s.cfg.PrefetchBytes/4, 1)
	for s.ctx.Err() == nil {
		grant, _, err := s.buf.Reserve(s.ctx, want, nil)
		if err != nil {
			return
		}
		n, _ := s.buf.Free()
		s.buf.Unreserve(grant)
		fs := s.cl.PollRecords(s.ctx, max(n, 1))
		if fs.IsClientClosed() || s.ctx.Err() != nil {
			return
		}
		fs.EachError(func(topic string, p int32, err error) {
			if errors.Is(err, context.Canceled) {
				return
			}
			s.stats.fetchErrors.Add(1)
			s.logError("franz source: poll", "topic", topic, "partition", p, "err", err)
			if _, ok := errors.AsType[*kgo.ErrGroupSession](err); ok {
				// kgo injects group errors as a fetch of no topic.
				err = fmt.Errorf("franz source: group %s: %w", s.group, err)
				s.groupErr.Store(&err)
			}
		})
		if fs.NumRecords() > 0 {
			s.groupErr.Store(nil)
			s.keep(fs)
		}
	}
}

// keep charges what one poll brought and queues it, partition by
// partition in offset order: the Source cannot give a polled record back
// to kgo, so what exceeds the room the poll was sized for is charged too
// (one poll at most). Records the partition's restored map lists as
// settled are passed over; retry records not due yet wait in the buffer's
// delayed heap and pause their partition.
func (s *Source) keep(fs kgo.Fetches) {
	s.stats.polls.Add(1)
	now := s.clock.Now()
	fs.EachPartition(func(ftp kgo.FetchTopicPartition) {
		if len(ftp.Records) == 0 {
			return
		}
		s.mu.Lock()
		p := s.parts[topicPartition{ftp.Topic, ftp.Partition}]
		s.mu.Unlock()
		if p == nil || p.gen.Ending.Load() {
			s.stats.dropped.Add(int64(len(ftp.Records)))
			return
		}
		var ready, held []*record
		for _, kr := range ftp.Records {
			if p.wm.Skip(kr.Offset) {
				s.stats.skippedSettled.Add(1)
				continue
			}
			if !p.wm.Deliver(kr.Offset) {
				continue // at or below what was delivered (a re-fetch)
			}
			r := s.newRecord(p, kr, now)
			if r.due.After(now) {
				r.held = true
				held = append(held, r)
				continue
			}
			ready = append(ready, r)
		}
		s.stats.fetched.Add(int64(len(ready) + len(held)))
		s.buf.Charge(ready)
		s.stats.dropped.Add(int64(s.buf.Publish(&p.Part, ready)))
		if len(held) > 0 {
			s.pauseMu.Lock()
			p.held += len(held)
			for _, r := range held {
				s.buf.PushDelayed(r)
			}
			if !p.gen.Ending.Load() {
				s.ctl.PauseFetchPartitions(map[string][]int32{p.topic: {p.id}})
			}
			s.pauseMu.Unlock()
		}
	})
}

// newRecord is the one conversion of a kgo record into what the Source
// hands out.
func (s *Source) newRecord(p *partition, kr *kgo.Record, now time.Time) *record {
	var unordered func(string) bool
	if p.retry {
		unordered = kafkacore.IsRetryHeader // ParseRetry removes them
	}
	h, size := kafkacore.HeaderMap(kr.Headers, nil, unordered)
	r := &record{
		part: p, offset: kr.Offset, key: kr.Key, value: kr.Value, headers: h, time: kr.Timestamp, attempt: 1,
		size:   max(size+int64(len(kr.Key)+len(kr.Value)), 1),
		origin: dlq.Origin{Topic: p.topic, Partition: p.id, Offset: kr.Offset, Group: s.group},
	}
	if p.retry {
		rt := r.retryView()
		res := kafkacore.ParseRetry(&rt, now, time.Time{}, s.maxDelay(), s.topics)
		r.headers, r.time, r.due, r.attempt, r.firstFailure, r.origin = rt.Headers, rt.Time, rt.Due, rt.Attempt, rt.FirstFailure, rt.Origin
		if res.Clamped {
			s.stats.retryClamped.Add(1)
		}
		if res.Refused {
			s.stats.retryOriginRefused.Add(1)
		}
	}
	return r
}

// maxDelay is the longest retry delay the route asks for: a retry-topic
// not-before further out is clamped to it.
func (s *Source) maxDelay() time.Duration { return max(s.cfg.LocalRetryMaxDelay, s.limits.MaxDelay) }

// Fetch hands out up to maxMessages buffered messages totalling at most
// maxBytes (or one larger message alone), waiting at most PollWait for the
// first: due retries first, then one record per partition in turn.
func (s *Source) Fetch(ctx context.Context, maxMessages int, maxBytes int64) ([]*consumer.Message, error) {
	if s.closed.Load() {
		return nil, fmt.Errorf("franz source: %w", consumer.ErrClosed)
	}
	if err := ctx.Err(); err != nil || maxMessages <= 0 {
		return nil, err
	}
	if !s.attached.Load() {
		return nil, ErrNotAttached
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
			var resume map[string][]int32
			for i, r := range recs {
				m := &ms[i]
				consumer.InitMessage(m, r)
				m.Topic, m.Key, m.Value, m.Headers = r.origin.Topic, r.key, r.value, r.headers
				m.PublishedAt, m.Attempt, m.Size, m.Origin = r.time, r.attempt, r.size, r.origin
				m.FirstFailure = r.firstFailure
				out[i] = m
				recs[i] = nil
				if r.held {
					r.held = false
					resume = s.release(r.part, resume)
				}
			}
			if len(resume) > 0 {
				s.ctl.ResumeFetchPartitions(resume)
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
		case <-s.ctx.Done():
			err = fmt.Errorf("franz source: %w", consumer.ErrClosed)
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

// release counts one of p's held retry records handed out, and adds p to
// resume when it was the last.
func (s *Source) release(p *partition, resume map[string][]int32) map[string][]int32 {
	s.pauseMu.Lock()
	defer s.pauseMu.Unlock()
	if p.held > 0 {
		p.held--
		if p.held == 0 && !p.gen.Ending.Load() {
			if resume == nil {
				resume = map[string][]int32{}
			}
			resume[p.topic] = append(resume[p.topic], p.id)
		}
	}
	return resume
}

// settle marks r settled in its partition's watermark, unless the
// partition was revoked since it was handed out.
func (r *record) settle() {
	p := r.part
	s := p.src
	p.gen.Outstanding.Add(-1)
	if p.revoked.Load() {
		s.stats.staleSettles.Add(1)
		return
	}
	p.wm.Settle(r.offset)
	if n := s.cfg.CommitEvery; n > 0 && s.settled.Add(1) >= int64(n) {
		select {
		case s.kick <- struct{}{}:
		default:
		}
	}
}

// Settle implements consumer.Acker. An Ack or a Term (dead-lettered,
// expired, terminated: it must not come back) marks the offset settled in
// its partition's watermark; a Nak retries it (see nak).
func (r *record) Settle(ctx context.Context, st consumer.Settlement) error {
	if st.Op == consumer.SettleNak {
		return r.nak(ctx, st.Delay)
	}
	r.part.src.stats.settled.Add(1)
	r.settle()
	return nil
}

// InProgress does nothing: Kafka has no per-message ack deadline.
func (r *record) InProgress(context.Context) error { return nil }

// Revoked implements consumer.Revocable: once r's partition is being
// revoked, the route does not start r; the partition's next owner
// delivers it again from the final commit.
func (r *record) Revoked() bool { return r.part.gen.Ending.Load() }

// nak puts the message back for another attempt without blocking its
// partition: in process for delays up to LocalRetryMaxDelay, otherwise
// (and when the in-process retries' allowance is full) through the retry
// topic if there is one. The original is settled only after the retry
// topic acknowledged the copy; a failed write keeps it in process. A
// message whose partition is being revoked is dropped: it is not
// committed, so it is delivered again.
func (r *record) nak(ctx context.Context, delay time.Duration) error {
	p := r.part
	s := p.src
	if p.gen.Ending.Load() {
		p.gen.Outstanding.Add(-1)
		s.stats.staleSettles.Add(1)
		return nil
	}
	now := s.clock.Now()
	if s.cfg.RetryTopic != "" && s.limits.Ordering == consumer.Unordered && (delay > s.cfg.LocalRetryMaxDelay || s.buf.Full(r)) {
		if err := s.writeRetry(ctx, r, now, now.Add(delay)); err == nil {
			s.stats.retryWrites.Add(1)
			r.settle()
			return nil
		}
		s.stats.retryWriteErrors.Add(1)
		delay = min(delay, s.cfg.LocalRetryMaxDelay)
	}
	p.gen.Outstanding.Add(-1)
	s.stats.localRetries.Add(1)
	if r.firstFailure.IsZero() {
		r.firstFailure = now
	}
	r.attempt++
	r.due = now.Add(delay)
	s.buf.PushDelayed(r)
	return nil
}

// writeRetry writes r to the retry topic through the Source's client, to
// be handed out again at notBefore as the next attempt, and returns once
// the client's acks (kgo's default: all in-sync replicas) have it.
func (s *Source) writeRetry(ctx context.Context, r *record, now, notBefore time.Time) error {
	rt := r.retryView()
	rec := &kgo.Record{Topic: s.cfg.RetryTopic, Key: r.key, Value: r.value,
		Headers: kafkacore.RetryHeaders(&rt, now, notBefore, []kgo.RecordHeader(nil))}
	if err := s.cl.ProduceSync(ctx, rec).FirstErr(); err != nil {
		return fmt.Errorf("franz source: retry topic %s: %w", s.cfg.RetryTopic, err)
	}
	return nil
}

var (
	_ consumer.Acker     = (*record)(nil)
	_ consumer.Revocable = (*record)(nil)
)

// kerrFor is the error of a Kafka error code (nil for 0).
func kerrFor(code int16) error { return kerr.ErrorForCode(code) }

func isMetadataTooLarge(err error) bool { return errors.Is(err, kerr.OffsetMetadataTooLarge) }
