package kafkaadapter

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
	fetchAPI "github.com/segmentio/kafka-go/protocol/fetch"

	"github.com/sluice-go/sluice/internal/kafkacore"
)

// fetchLoop pulls parts, one of a generation's fetch lanes: each round it
// reserves what the buffer has free (up to FetchMaxBytes), sends one
// multi-partition Fetch per partition leader (partitions in a rotating
// order, each asking for an equal share), and keeps of the responses only
// what fits in the prefetch budget (buffer.admit); what did not fit is
// fetched again from its first offset once room frees.
func (s *Source) fetchLoop(ctx context.Context, g *generation, parts []*partition) {
	f := &fetcher{s: s, g: g, parts: parts, leaders: map[*partition]int32{}}
	defer s.buf.Leave(f)
	f.begin()
	for round := 0; ctx.Err() == nil; round++ {
		now := time.Now()
		ready, wake := f.ready(ctx, now)
		if len(ready) == 0 {
			if !sleepCtx(ctx, max(wake.Sub(now), time.Millisecond)) {
				return
			}
			continue
		}
		grant, first, err := s.buf.Reserve(ctx, int64(s.cfg.FetchMaxBytes), f)
		if err != nil {
			return
		}
		ready = rotate(ready, round, first)
		lists := f.fetch(ctx, ready, grant)
		if ctx.Err() != nil {
			s.buf.Unreserve(grant)
			return
		}
		f.keep(ready, lists, grant, time.Now())
	}
}

// begin sets the fetcher's partitions up before the first fetch.
func (f *fetcher) begin() {
	for _, p := range f.parts {
		if p.retry && p.offset < 0 {
			// The retry topic holds only work this group owes (its originals
			// are committed): never skip any of it, whatever StartOffset says.
			p.offset = kafka.FirstOffset
		}
		if p.offset >= 0 {
			// The group's committed offset: nothing new to commit yet.
			p.wm.Begin(p.offset)
			p.wm.Committed(p.offset)
		}
	}
}

// rotate orders a round's partitions so each is the first of a request in
// turn (a broker lets only the first partition's batch exceed its share),
// and first (the partition of a record that did not fit last time, see
// buffer.reserve), when it is among them, first.
func rotate(ready []*partition, round int, first *kafkacore.Part[*record]) []*partition {
	k := round % len(ready)
	if i := slices.IndexFunc(ready, func(p *partition) bool { return &p.Part == first }); i >= 0 {
		k = i
	}
	return append(ready[k:], ready[:k]...)
}

// keep admits what fits of one round's responses (lists, one per
// partition of ready, fetched with grant), delivers it to the partitions'
// watermarks and queues it; a partition whose tail did not fit reads it
// again. wall is the time the partitions' holds are measured in.
func (f *fetcher) keep(ready []*partition, lists [][]*record, grant int64, wall time.Time) {
	s := f.s
	kept := s.buf.Admit(grant, lists, f)
	for i, p := range ready {
		l := lists[i]
		if kept[i] < len(l) {
			p.offset = l[kept[i]].offset // the tail did not fit: read it again
			clear(l[kept[i]:])
		}
		for _, r := range l[:kept[i]] {
			p.wm.Deliver(r.offset)
		}
		if kept[i] == len(l) && p.skip > p.offset && !p.hold.After(wall) {
			// Everything up to a transaction marker (or a record the
			// commit's map lists as settled) was kept: the marker's
			// offset is done too.
			p.offset = p.skip
			p.wm.Advance(p.skip)
		}
		// This response's only: a later round whose response leaves
		// the partition out (kfake does, once the response is full)
		// must not move past records it never kept.
		p.skip = -1
		s.stats.fetched.Add(int64(kept[i]))
		s.stats.dropped.Add(int64(s.buf.Publish(&p.Part, l[:kept[i]])))
	}
}

// sleepCtx waits d or until ctx ends (false).
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

type fetcher struct {
	s       *Source
	g       *generation
	parts   []*partition         // the partitions this fetcher owns
	leaders map[*partition]int32 // from the transport's metadata cache; cleared on errors
	scratch []*partition
}

// ready returns the partitions to fetch now (start offsets resolved, not
// waiting for a retry's not-before or an error backoff) and, when there
// are none, when the next one will be.
func (f *fetcher) ready(ctx context.Context, now time.Time) ([]*partition, time.Time) {
	out := f.scratch[:0]
	var wake time.Time
	for _, p := range f.parts {
		if p.hold.After(now) {
			if wake.IsZero() || p.hold.Before(wake) {
				wake = p.hold
			}
			continue
		}
		if p.offset < 0 {
			off, err := f.s.resolve(ctx, p, p.offset)
			if err != nil {
				f.s.stats.fetchErrors.Add(1)
				p.backoff(now)
				continue
			}
			p.offset = off
			// Commit the resolved start, so that a rebalance before the
			// first delivery cannot resolve it again further on (LastOffset)
			// and skip what was written in between.
			p.wm.Begin(off)
		}
		out = append(out, p)
	}
	f.scratch = out
	if len(out) == 0 && wake.IsZero() {
		wake = now.Add(time.Second)
	}
	return out, wake
}

// fetch sends the requests for parts, one per leader, splitting grant
// bytes between them, and returns the records of each partition (in the
// order of parts).
func (f *fetcher) fetch(ctx context.Context, parts []*partition, grant int64) [][]*record {
	lists := make([][]*record, len(parts))
	if len(f.leaders) == 0 {
		f.lookupLeaders(ctx)
	}
	byLeader := map[int32][]int{}
	for i, p := range parts {
		l := f.leaders[p] // 0 when unknown: the transport routes it anyway
		byLeader[l] = append(byLeader[l], i)
	}
	share := max(grant/int64(len(byLeader)), 1)
	if len(byLeader) == 1 {
		for _, idx := range byLeader {
			f.fetchLeader(ctx, parts, idx, share, lists)
		}
		return lists
	}
	var wg sync.WaitGroup
	for _, idx := range byLeader {
		wg.Go(func() { f.fetchLeader(ctx, parts, idx, share, lists) })
	}
	wg.Wait()
	return lists
}

func (f *fetcher) lookupLeaders(ctx context.Context) {
	topics := make([]string, 0, 2)
	for _, p := range f.parts {
		if len(topics) == 0 || topics[len(topics)-1] != p.topic {
			topics = append(topics, p.topic)
		}
	}
	mctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	md, err := f.s.client.Metadata(mctx, &kafka.MetadataRequest{Topics: topics})
	if err != nil {
		return
	}
	ids := map[string]map[int]int32{}
	for _, t := range md.Topics {
		m := map[int]int32{}
		for _, p := range t.Partitions {
			m[p.ID] = int32(p.Leader.ID) + 1 // 0 stays "unknown"
		}
		ids[t.Name] = m
	}
	for _, p := range f.parts {
		f.leaders[p] = ids[p.topic][p.id]
	}
}

// fetchLeader fetches parts[idx...] (one leader) with maxBytes in all.
func (f *fetcher) fetchLeader(ctx context.Context, parts []*partition, idx []int, maxBytes int64, lists [][]*record) {
	s := f.s
	per := int32(max(maxBytes/int64(len(idx)), 1))
	req := &fetchAPI.Request{
		ReplicaID: -1, MaxWaitTime: int32(s.cfg.FetchMaxWait / time.Millisecond), MinBytes: 1,
		MaxBytes: int32(min(maxBytes, 1<<31-1)), SessionID: -1, SessionEpoch: -1,
	}
	for _, i := range idx {
		p := parts[i]
		n := len(req.Topics)
		if n == 0 || req.Topics[n-1].Topic != p.topic {
			req.Topics = append(req.Topics, fetchAPI.RequestTopic{Topic: p.topic})
			n++
		}
		req.Topics[n-1].Partitions = append(req.Topics[n-1].Partitions, fetchAPI.RequestPartition{
			Partition: int32(p.id), CurrentLeaderEpoch: -1, FetchOffset: p.offset, LogStartOffset: -1,
			PartitionMaxBytes: per,
		})
	}
	// The request outlives ctx by up to FetchMaxWait + 1 s: when the
	// generation ends or the Source closes, the response in flight (a long
	// poll) is awaited rather than abandoned, so its connection is free
	// (and closed with the rest) by the time Close returns.
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.FetchMaxWait+15*time.Second)
	defer cancel()
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(s.cfg.FetchMaxWait+time.Second, cancel) })
	defer stop()
	s.stats.fetchRequests.Add(1)
	m, err := s.client.Transport.RoundTrip(fctx, s.client.Addr, req)
	if err == nil {
		res := m.(*fetchAPI.Response)
		if res.ErrorCode != 0 {
			err = kafka.Error(res.ErrorCode)
		} else {
			f.decode(res, parts, idx, lists, time.Now())
			return
		}
	}
	if ctx.Err() != nil {
		return
	}
	s.stats.fetchErrors.Add(1)
	s.errorf("kafka source: fetch: %v", err)
	clear(f.leaders)
	now := time.Now()
	for _, i := range idx {
		parts[i].backoff(now)
	}
}

// decode converts a fetch response into lists; wall is the time the
// partitions' holds are measured in (backoffs, a retry's wait).
func (f *fetcher) decode(res *fetchAPI.Response, parts []*partition, idx []int, lists [][]*record, wall time.Time) {
	s := f.s
	now := s.clock.Now()
	for ti := range res.Topics {
		rt := &res.Topics[ti]
		for pi := range rt.Partitions {
			rp := &rt.Partitions[pi]
			var i = -1
			for _, j := range idx {
				if parts[j].topic == rt.Topic && parts[j].id == int(rp.Partition) {
					i = j
					break
				}
			}
			if i < 0 {
				continue
			}
			p := parts[i]
			if rp.ErrorCode != 0 {
				s.stats.fetchErrors.Add(1)
				err := kafka.Error(rp.ErrorCode)
				s.errorf("kafka source: fetch %s/%d: %v", p.topic, p.id, err)
				if errors.Is(err, kafka.OffsetOutOfRange) {
					p.offset = s.cfg.StartOffset
					if p.retry {
						p.offset = kafka.FirstOffset
					}
				} else {
					clear(f.leaders)
				}
				p.backoff(wall)
				continue
			}
			p.backoffD = 0
			recs, skip, err := s.readRecords(p, rp, now)
			if err != nil {
				s.stats.fetchErrors.Add(1)
				s.errorf("kafka source: fetch %s/%d: %v", p.topic, p.id, err)
			}
			if p.retry {
				recs = s.dueRetries(p, recs, now, wall)
			}
			if len(recs) > 0 {
				p.offset = recs[len(recs)-1].offset + 1
			}
			p.skip = skip
			lists[i] = recs
		}
	}
}

// readRecords converts the records of one partition's response from
// p.offset on. Transaction markers (control batches) are not records: it
// returns one past the last marker it passed over (-1: none), so a
// partition whose next batch is only a marker moves on instead of
// fetching that marker again and again.
func (s *feed) readRecords(p *partition, rp *fetchAPI.ResponsePartition, now time.Time) (out []*record, skip int64, err error) {
	skip = -1
	rr := rp.RecordSet.Records
	if rr == nil {
		return nil, skip, nil
	}
	batches := []protocol.RecordReader{rr}
	if st, ok := rr.(*protocol.RecordStream); ok {
		batches = st.Records
	}
	for _, b := range batches {
		_, control := b.(*protocol.ControlBatch)
		for {
			kr, err := b.ReadRecord()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return out, skip, err
			}
			if kr.Offset < p.offset {
				continue // a batch starting before the offset asked for
			}
			if control {
				skip = max(skip, kr.Offset+1)
				continue
			}
			if p.wm.Skip(kr.Offset) {
				// Settled by a previous owner (its commit's map): passed
				// over like a marker.
				skip = max(skip, kr.Offset+1)
				s.stats.skippedSettled.Add(1)
				continue
			}
			r, err := s.convert(p, kr, now)
			if err != nil {
				return out, skip, err
			}
			out = append(out, r)
		}
	}
	return out, skip, nil
}

// backoff makes p wait before its next fetch, doubling up to 1 s.
func (p *partition) backoff(now time.Time) {
	p.backoffD = min(max(2*p.backoffD, 20*time.Millisecond), time.Second)
	p.hold = now.Add(p.backoffD)
}

// maxRetryHold caps one wait of a retry partition for a not-before; it then
// fetches again (and sees a clock that jumped).
const maxRetryHold = time.Second

// dueRetries keeps the retry-topic records whose not-before has passed, up
// to the first that has not, and makes p wait for that one: the records
// not due are dropped and fetched again after the wait, so while a retry
// partition waits it holds no memory and no part of the buffer, and other
// partitions keep flowing.
//
// A record's clamped not-before (see parseRetry) is counted once: when it
// is kept, or when the partition starts waiting for it.
func (s *feed) dueRetries(p *partition, recs []*record, now, wall time.Time) []*record {
	for i, r := range recs {
		first := !p.waiting || p.waitOff != r.offset
		if wait := r.due.Sub(now); wait > 0 {
			if first && r.clamped {
				s.stats.retryClamped.Add(1)
			}
			p.waitOff, p.waiting = r.offset, true
			p.sight(r.offset, recs[len(recs)-1].offset, now)
			p.offset = r.offset
			p.hold = wall.Add(min(wait, maxRetryHold))
			clear(recs[i:])
			return recs[:i]
		}
		if first && r.clamped {
			s.stats.retryClamped.Add(1)
		}
		p.waiting = false
	}
	return recs
}

// sighting says that a retry partition read every offset up to off by at.
type sighting struct {
	off int64
	at  time.Time
}

// maxSightings bounds a partition's sightings: records read after that
// many responses are anchored at their own timestamp, or when the
// partition waits for them.
const maxSightings = 32

// sight notes that p, waiting at head, read up to last at now, and
// forgets what lies below head.
func (p *partition) sight(head, last int64, now time.Time) {
	i := 0
	for i < len(p.sighted) && p.sighted[i].off < head {
		i++
	}
	p.sighted = append(p.sighted[:0], p.sighted[i:]...)
	if n := len(p.sighted); n < maxSightings && (n == 0 || last > p.sighted[n-1].off) {
		p.sighted = append(p.sighted, sighting{last, now})
	}
}

// seen returns when p first read offset while waiting (zero: not known).
func (p *partition) seen(offset int64) time.Time {
	for _, s := range p.sighted {
		if s.off >= offset {
			return s.at
		}
	}
	return time.Time{}
}

func (s *Source) resolve(ctx context.Context, p *partition, which int64) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	res, err := s.client.ListOffsets(rctx, &kafka.ListOffsetsRequest{
		Topics: map[string][]kafka.OffsetRequest{p.topic: {{Partition: p.id, Timestamp: which}}},
	})
	if err != nil {
		return 0, err
	}
	for _, po := range res.Topics[p.topic] {
		if po.Partition == p.id {
			if po.Error != nil {
				return 0, po.Error
			}
			if which == kafka.LastOffset {
				return po.LastOffset, nil
			}
			return po.FirstOffset, nil
		}
	}
	return 0, fmt.Errorf("kafka source: no offsets for %s/%d", p.topic, p.id)
}
