package kafkaadapter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/protocol"
	fetchAPI "github.com/segmentio/kafka-go/protocol/fetch"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/kafkacore"
)

// TestSimulation is the deterministic model of the Kafka Source's own
// state (issue 24, "the adapters' own models"): the prefetch buffer, the
// fetch lanes, the retry partitions' not-before, the watermarks and the
// settled-offset map, driven through the real code (buffer, fetcher.ready,
// rotate, decode, readRecords, dueRetries, keep, take, Settle, nak, purge,
// Watermark.CommitMetadata, Restore) with a simulated broker, route and
// clock in one goroutine. Each seed draws the partitions, record sizes (up
// to the window), batch shapes (gaps, transaction markers), retry records
// (not-before none, past, near, forged far in the future, skewed
// timestamps), the route's acks, naks and terminations, commits that fail
// and rebalances (a random subset of partitions per generation), then
// drains: no more faults, everything acked.
//
// Invariants, checked at every step or commit:
//   - liveness: after the drain every record is settled (delivered and
//     acked, or dead-lettered) and committed, within a bounded number of
//     fetches and of virtual time (a retry's not-before, clamped to the
//     route's longest delay after it was written, included);
//   - the prefetch bound: the bytes of the records fetched and queued plus
//     the room reserved for fetches in flight never exceed the prefetch's
//     bytes (one record larger than it alone excepted); with the
//     in-process retries (naks) and what the route holds, never more than
//     prefetch + the retries' allowance + window + one record; by count,
//     one response keeps at most PrefetchMessages records and the records
//     queued stay below PrefetchMessages plus one such response per lane
//     (producer batches of up to three windows of records exercise it);
//   - a commit never passes an offset that is not settled;
//   - the settled-offset map of a commit never names an unsettled offset;
//   - a generation never hands out an offset it has handed out and not
//     settled; a retry record is not handed out before its not-before;
//   - in-process retries within their allowance never keep a fetch back
//     (issue 24.10: poison messages whose dead letter cannot be written).
//
// SLUICE_SIM_SEEDS sets how many seeds run (default 1000, 200 under -race),
// SLUICE_SIM_SEED runs one seed with a trace of its steps. A failing seed
// is reported with its configuration, where each partition stands, the
// last steps, and the command that replays it.
func TestSimulation(t *testing.T) {
	seeds, first := simSeeds, 0
	if v := os.Getenv("SLUICE_SIM_SEEDS"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n <= 0 {
			t.Fatalf("SLUICE_SIM_SEEDS=%q", v)
		}
		seeds = n
	}
	trace := false
	if v := os.Getenv("SLUICE_SIM_SEED"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("SLUICE_SIM_SEED=%q", v)
		}
		first, seeds, trace = n, 1, true
	}
	var fetches, steps, records int
	for seed := first; seed < first+seeds; seed++ {
		m := newSim(uint64(seed), trace)
		err := m.run()
		fetches, steps, records = fetches+m.fetches, steps+m.steps, records+m.records()
		if err != nil {
			again := newSim(uint64(seed), false)
			again.keepLog = true
			_ = again.run() // deterministic: the same failure, with its last steps
			t.Fatalf("seed %d (after %d seeds): %v\n%s\nreplay: SLUICE_SIM_SEED=%d go test ./adapters/kafka -run TestSimulation -v",
				seed, seed-first+1, err, again.config(), seed)
		}
	}
	t.Logf("%d seeds (%d..%d): %d records, %d fetches, %d steps", seeds, first, first+seeds-1, records, fetches, steps)
}

// simRec is one offset of a simulated partition's log.
type simRec struct {
	offset    int64
	size      int
	control   bool      // a transaction marker
	notBefore time.Time // retry partitions: the header (zero: none)
	legit     bool      // a not-before the Source must respect (not forged, timestamp not skewed)
	ts        time.Time // the record's timestamp
}

type simBatch struct{ recs []simRec }

func (b simBatch) bytes() int64 {
	n := int64(0)
	for _, r := range b.recs {
		n += int64(r.size) + kafkacore.RecordOverhead
	}
	return n
}

// reader is the batch as a fetch response carries it.
func (b simBatch) reader() protocol.RecordReader {
	if b.recs[0].control {
		return &protocol.ControlBatch{Records: protocol.NewRecordReader(protocol.Record{Offset: b.recs[0].offset})}
	}
	rs := make([]protocol.Record, len(b.recs))
	for i, r := range b.recs {
		rs[i] = protocol.Record{Offset: r.offset, Time: r.ts, Value: protocol.NewBytes(make([]byte, r.size))}
		if !r.notBefore.IsZero() {
			rs[i].Headers = []protocol.Header{
				{Key: HeaderNotBefore, Value: []byte(r.notBefore.UTC().Format(time.RFC3339Nano))},
				{Key: HeaderAttempt, Value: []byte("2")},
			}
		}
	}
	return protocol.NewRecordReader(rs...)
}

type simLog struct {
	topic   string
	id      int
	retry   bool
	batches []simBatch
	next    int64 // the log end offset
	recs    map[int64]*simRec
}

func (l *simLog) append(b simBatch) {
	l.batches = append(l.batches, b)
	for i := range b.recs {
		l.recs[b.recs[i].offset] = &b.recs[i]
	}
	l.next = b.recs[len(b.recs)-1].offset + 1
}

type simCommit struct {
	off  int64
	meta string
}

const (
	laneIdle = iota
	laneBlocked
	laneInFlight
	laneSleeping
	laneDone
)

type simLane struct {
	f     *fetcher
	state int
	space <-chan struct{} // blocked: the buffer's space channel it waits on
	ready []*partition
	grant int64
	res   *fetchAPI.Response
	due   time.Time // in flight: when the response arrives; sleeping: the wake
	round int
}

type simHeld struct {
	r   *record
	gen *generation
	log int
	off int64
}

type simClock struct{ m *sim }

func (c simClock) Now() time.Time { return c.m.now }

type sim struct {
	seed    uint64
	rng     *rand.Rand
	trace   bool // print each step
	keepLog bool // keep the last steps for the failure report
	log     []string

	now     time.Time
	start   time.Time
	s       *Source
	logs    []*simLog
	limits  consumer.RouteLimits
	maxRec  int64
	gen     *generation
	genLogs []int // gen.parts[i] is logs[genLogs[i]]
	lanes   []*simLane
	genID   int32
	gens    int

	committed  []simCommit
	verified   []int64 // per log: every record below it is settled
	settled    []map[int64]bool
	held       []*simHeld
	heldBytes  int64
	out        map[*generation]map[[2]int64]bool // handed out, not settled, per generation
	nextCommit time.Time

	skewed                    int // retry records with a not-before and a timestamp ahead of the clock
	steps, fetches, fruitless int
	drainFetches              int
	drain                     bool
	drainStart                time.Time
}

func newSim(seed uint64, trace bool) *sim {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	m := &sim{seed: seed, rng: rng, trace: trace, out: map[*generation]map[[2]int64]bool{}}
	m.now = time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	m.start = m.now
	windows := []int{4, 8, 16, 64, 128}
	bytes := []int64{4 << 10, 16 << 10, 64 << 10, 256 << 10}
	m.limits = consumer.RouteLimits{Route: "sim", Messages: windows[rng.IntN(len(windows))], Bytes: bytes[rng.IntN(len(bytes))],
		MaxAttempts: 5, MaxDelay: time.Duration(1+rng.IntN(10)) * time.Second}
	cfg := Config{GroupID: "sim", Topics: []string{"main"}, FetchMaxWait: time.Duration(100+rng.IntN(900)) * time.Millisecond,
		PollWait: time.Second, LocalRetryMaxDelay: time.Duration(1+rng.IntN(5)) * time.Second, Clock: simClock{m}}
	if rng.IntN(3) == 0 {
		cfg.FetchMaxBytes = 1 + rng.IntN(int(m.limits.Bytes))
	}
	if rng.IntN(3) == 0 {
		cfg.LocalRetryMessages = 1 + rng.IntN(8)
		cfg.LocalRetryBytes = int64(1 + rng.IntN(int(m.limits.Bytes)))
	}
	nParts := 1 + rng.IntN(4)
	if rng.IntN(2) == 0 {
		cfg.RetryTopic = "retry"
	}
	s := &Source{}
	s.feed.init(cfg)
	s.limits = m.limits
	s.cfg.sizeFrom(m.limits)
	s.buf = kafkacore.NewBuffer[*record](s.cfg.PrefetchMessages, s.cfg.PrefetchBytes, s.cfg.LocalRetryMessages, s.cfg.LocalRetryBytes)
	s.attached.Store(true)
	m.s = s
	for i := range nParts {
		m.logs = append(m.logs, &simLog{topic: "main", id: i, recs: map[int64]*simRec{}})
	}
	if cfg.RetryTopic != "" {
		m.logs = append(m.logs, &simLog{topic: "retry", id: 0, retry: true, recs: map[int64]*simRec{}})
	}
	for _, l := range m.logs {
		for range rng.IntN(8) {
			m.produce(l)
		}
	}
	m.committed = make([]simCommit, len(m.logs))
	m.verified = make([]int64, len(m.logs))
	m.settled = make([]map[int64]bool, len(m.logs))
	for i := range m.settled {
		m.settled[i] = map[int64]bool{}
	}
	m.nextCommit = m.now.Add(100 * time.Millisecond)
	return m
}

// produce appends a batch to l: data records (sizes up to the window,
// mostly small), now and then after a gap (compaction) or a transaction
// marker; on a retry partition with not-before headers of every kind.
func (m *sim) produce(l *simLog) {
	rng := m.rng
	off := l.next
	if rng.IntN(20) == 0 {
		off += int64(1 + rng.IntN(3)) // compacted away
	}
	if rng.IntN(10) == 0 {
		l.append(simBatch{recs: []simRec{{offset: off, control: true}}})
		return
	}
	n := 1 + rng.IntN(12)
	if l.retry {
		n = 1 + rng.IntN(3)
	} else if rng.IntN(15) == 0 {
		// A producer batch larger than the window (a broker returns a
		// partition's whole first batch): kept whole up to the count.
		n = m.limits.Messages * (1 + rng.IntN(3))
	}
	b := simBatch{}
	for i := range n {
		r := simRec{offset: off + int64(i), size: 8 + rng.IntN(300), ts: m.now, legit: true}
		if rng.IntN(25) == 0 {
			r.size = int(max(1, int64(rng.IntN(int(m.limits.Bytes)))+1)) // up to the window
		}
		if l.retry {
			maxDelay := max(m.s.cfg.LocalRetryMaxDelay, m.limits.MaxDelay)
			switch rng.IntN(5) {
			case 0: // no header: due at once
			case 1:
				r.notBefore = m.now.Add(-time.Duration(rng.IntN(10)) * time.Second)
			case 2, 3:
				r.notBefore = m.now.Add(time.Duration(rng.Int64N(int64(maxDelay))))
			case 4:
				r.notBefore, r.legit = time.Date(2100, 1, 1, 0, 0, 0, 0, time.UTC), false // forged
			}
			switch rng.IntN(8) {
			case 0:
				r.ts, r.legit = m.now.Add(time.Duration(1+rng.IntN(48))*time.Hour), false // a producer clock ahead
				if !r.notBefore.IsZero() {
					m.skewed++
				}
			case 1:
				r.ts = time.Time{}
			}
		}
		m.maxRec = max(m.maxRec, int64(r.size)+kafkacore.RecordOverhead)
		b.recs = append(b.recs, r)
	}
	l.append(b)
}

func (m *sim) records() int {
	n := 0
	for _, l := range m.logs {
		n += len(l.recs)
	}
	return n
}

func (m *sim) config() string {
	var parts []string
	for _, l := range m.logs {
		parts = append(parts, fmt.Sprintf("%s/%d: %d offsets in %d batches", l.topic, l.id, l.next, len(l.batches)))
	}
	s := fmt.Sprintf("window %d msgs / %d B, prefetch %d / %d B, FetchMaxBytes %d, FetchMaxWait %v, max delay %v; %s; %d generations; %d fetches (%d fruitless)",
		m.limits.Messages, m.limits.Bytes, m.s.cfg.PrefetchMessages, m.s.cfg.PrefetchBytes, m.s.cfg.FetchMaxBytes,
		m.s.cfg.FetchMaxWait, m.s.maxDelay(), strings.Join(parts, ", "), m.gens, m.fetches, m.fruitless)
	for i, l := range m.logs {
		first := int64(-1)
		for o := int64(0); o < l.next; o++ {
			if r := l.recs[o]; r != nil && !r.control && !m.settled[i][o] {
				first = o
				break
			}
		}
		if m.committed[i].off == l.next && first < 0 {
			continue
		}
		s += fmt.Sprintf("\n%s/%d: committed %d of %d, first unsettled %d", l.topic, l.id, m.committed[i].off, l.next, first)
		if r := l.recs[first]; r != nil {
			s += fmt.Sprintf(" (%d B, not-before %v, ts %v)", r.size, r.notBefore, r.ts)
		}
		for j, p := range m.gen.parts {
			if m.genLogs[j] == i {
				s += fmt.Sprintf("; fetching from %d, hold %v, skip %d, watermark pending %d", p.offset, p.hold, p.skip, p.wm.Pending())
			}
		}
	}
	for _, l := range m.lanes {
		s += fmt.Sprintf("\nlane %p: state %d, due %v, grant %d", l.f, l.state, l.due, l.grant)
	}
	b := m.s.buf.State()
	s += fmt.Sprintf("\nbuffer: %d records / %d B, reserved %d, claim %p %d B", b.Count, b.Bytes, b.Reserved, b.ClaimLane, b.ClaimSize)
	if n := len(m.log); n > 0 {
		s += "\nlast steps:\n  " + strings.Join(m.log[max(0, n-40):], "\n  ")
	}
	return s
}

func (m *sim) tracef(format string, args ...any) {
	if !m.trace && !m.keepLog {
		return // a failing seed is played again with its log kept
	}
	if !m.trace && len(m.log) > 200 {
		m.log = m.log[100:]
	}
	line := fmt.Sprintf("%8.3fs ", m.now.Sub(m.start).Seconds()) + fmt.Sprintf(format, args...)
	m.log = append(m.log, line)
	if m.trace {
		fmt.Println(line)
	}
}

// startGen starts a generation with parts of the logs (all of them
// during the drain), each from its committed offset and settled map, as
// Source.start does.
func (m *sim) startGen(all bool) {
	m.genID++
	m.gens++
	g := &generation{src: &m.s.feed, id: m.genID, kick: make(chan struct{}, 1)}
	g.ctx, g.cancel = context.WithCancel(context.Background())
	m.genLogs = m.genLogs[:0]
	for i, l := range m.logs {
		if !all && m.rng.IntN(3) == 0 {
			continue // another member's this time
		}
		c := m.committed[i]
		p := &partition{gen: g, Part: kafkacore.Part[*record]{Gen: &g.Gen}, topic: l.topic, id: l.id, wm: NewWatermark(), retry: l.retry, offset: c.off}
		if c.meta != "" {
			p.wm.Restore(c.off, c.meta)
		}
		g.parts = append(g.parts, p)
		m.genLogs = append(m.genLogs, i)
	}
	m.gen = g
	m.out[g] = map[[2]int64]bool{}
	m.lanes = m.lanes[:0]
	if len(g.parts) == 0 {
		return
	}
	for _, parts := range m.s.lanes(g.parts) {
		f := &fetcher{s: m.s, g: g, parts: parts, leaders: map[*partition]int32{}}
		f.begin()
		m.lanes = append(m.lanes, &simLane{f: f})
	}
	m.tracef("generation %d: %d partitions, %d lanes", g.id, len(g.parts), len(m.lanes))
}

func (m *sim) logOf(p *partition) int {
	for i, q := range m.gen.parts {
		if q == p {
			return m.genLogs[i]
		}
	}
	for i, l := range m.logs {
		if l.topic == p.topic && l.id == p.id {
			return i
		}
	}
	panic("no log")
}

// endGen ends the current generation as Source.commitLoop does: stop the
// lanes (a response in flight is dropped, its grant returned), stop
// handing out, purge, let the route settle some of what it holds (the
// revoke grace), commit, drop later settlements.
func (m *sim) endGen() error {
	g := m.gen
	g.cancel()
	g.Ending.Store(true)
	for _, l := range m.lanes {
		if l.state == laneInFlight {
			m.s.buf.Unreserve(l.grant)
		}
		m.s.buf.Leave(l.f)
		l.state = laneDone
	}
	m.s.buf.Purge(&g.Gen)
	for _, h := range append([]*simHeld(nil), m.held...) {
		if h.gen == g && m.rng.IntN(2) == 0 {
			m.settle(h, consumer.SettleAck)
		}
	}
	if err := m.commit(); err != nil {
		return err
	}
	g.revoked.Store(true)
	m.tracef("generation %d ends", g.id)
	return nil
}

// laneStep runs one fetcher round up to the request: ready partitions,
// reserve (or block on the buffer's space), rotate, send.
func (m *sim) laneStep(l *simLane) {
	b := m.s.buf
	if l.state != laneBlocked {
		ready, wake := l.f.ready(l.f.g.ctx, m.now)
		l.round++
		if len(ready) == 0 {
			l.state, l.due = laneSleeping, maxTime(wake, m.now.Add(time.Millisecond))
			return
		}
		l.ready = ready
	}
	grant, first, ok, space := b.TryReserve(int64(m.s.cfg.FetchMaxBytes), l.f)
	if !ok {
		l.state, l.space = laneBlocked, space
		return
	}
	l.ready = rotate(l.ready, l.round-1, first)
	l.grant = grant
	var n int
	l.res, n = m.respond(l.ready, grant)
	m.fetches++
	if m.drain {
		m.drainFetches++
	}
	l.state = laneInFlight
	if n > 0 {
		l.due = m.now.Add(time.Duration(500+m.rng.IntN(3000)) * time.Microsecond)
	} else {
		l.due = m.now.Add(m.s.cfg.FetchMaxWait) // a long poll, its grant held all along
	}
	if m.trace || m.keepLog {
		var which []string
		for _, p := range l.ready {
			which = append(which, fmt.Sprintf("%s/%d@%d", p.topic, p.id, p.offset))
		}
		m.tracef("lane %p fetches %v with grant %d: %d records", l.f, which, grant, n)
	}
}

// respond is the broker: from each partition's offset, whole batches
// within the partition's share and the request's bytes, except that the
// first batch of the first partition with data comes whatever its size; a
// partition without data is sometimes left out of the response.
func (m *sim) respond(parts []*partition, grant int64) (*fetchAPI.Response, int) {
	per := max(grant/int64(len(parts)), 1)
	res := &fetchAPI.Response{}
	var total int64
	n := 0
	for _, p := range parts {
		l := m.logs[m.logOf(p)]
		var readers []protocol.RecordReader
		var pb int64
		for _, b := range l.batches {
			if b.recs[len(b.recs)-1].offset < p.offset {
				continue
			}
			bs := b.bytes()
			if total > 0 && (pb+bs > per || total+bs > grant) {
				break
			}
			readers = append(readers, b.reader())
			pb, total, n = pb+bs, total+bs, n+len(b.recs)
		}
		if len(readers) == 0 && m.rng.IntN(2) == 0 {
			continue
		}
		if len(res.Topics) == 0 || res.Topics[len(res.Topics)-1].Topic != l.topic {
			res.Topics = append(res.Topics, fetchAPI.ResponseTopic{Topic: l.topic})
		}
		rp := fetchAPI.ResponsePartition{Partition: int32(l.id), HighWatermark: l.next}
		if len(readers) > 0 {
			rp.RecordSet = protocol.RecordSet{Version: 2, Records: &protocol.RecordStream{Records: readers}}
		}
		t := &res.Topics[len(res.Topics)-1]
		t.Partitions = append(t.Partitions, rp)
	}
	return res, n
}

// arrive processes a lane's response (decode, keep) and goes straight on
// to its next request, as fetchLoop does.
func (m *sim) arrive(l *simLane) error {
	lists := make([][]*record, len(l.ready))
	idx := make([]int, len(l.ready))
	for i := range idx {
		idx[i] = i
	}
	l.f.decode(l.res, l.ready, idx, lists, m.now)
	got := 0
	for _, ls := range lists {
		got += len(ls)
	}
	before := m.s.stats.fetched.Load()
	l.f.keep(l.ready, lists, l.grant, m.now)
	kept := m.s.stats.fetched.Load() - before
	if got > 0 && kept == 0 {
		m.fruitless++
	}
	if kept > int64(m.s.cfg.PrefetchMessages) {
		return fmt.Errorf("one response kept %d records, above PrefetchMessages %d", kept, m.s.cfg.PrefetchMessages)
	}
	m.tracef("lane %p response: %d records, kept %d", l.f, got, kept)
	l.res, l.state = nil, laneIdle
	m.laneStep(l)
	return nil
}

// take is the route's Fetch: as much as its window has room for.
func (m *sim) take() error {
	n := m.limits.Messages - len(m.held)
	room := m.limits.Bytes - m.heldBytes
	if n <= 0 || room <= 0 {
		return nil
	}
	recs, _ := m.s.buf.Take(m.now, n, room, nil)
	for _, r := range recs {
		li := m.logOf(r.part)
		key := [2]int64{int64(li), r.offset}
		g := r.part.gen
		if m.out[g][key] {
			return fmt.Errorf("generation %d handed out %s/%d@%d while it was handed out and not settled", g.id, r.part.topic, r.part.id, r.offset)
		}
		if sr := m.logs[li].recs[r.offset]; sr == nil || sr.control {
			return fmt.Errorf("handed out %s/%d@%d, which is no record", r.part.topic, r.part.id, r.offset)
		} else if r.attempt <= 2 && sr.legit && m.now.Before(sr.notBefore) {
			return fmt.Errorf("retry record %s/%d@%d handed out at %v, before its not-before %v", r.part.topic, r.part.id, r.offset, m.now, sr.notBefore)
		}
		m.out[g][key] = true
		m.held = append(m.held, &simHeld{r: r, gen: g, log: li, off: r.offset})
		m.heldBytes += r.size
	}
	if len(recs) > 0 {
		m.tracef("route takes %d", len(recs))
	}
	return nil
}

// settle is the route settling h: an ack or term counts as settled when
// its generation has not been revoked (later settlements are dropped, the
// record is delivered again).
func (m *sim) settle(h *simHeld, op consumer.SettleOp) {
	for i, x := range m.held {
		if x == h {
			m.held = append(m.held[:i], m.held[i+1:]...)
			break
		}
	}
	m.heldBytes -= h.r.size
	delete(m.out[h.gen], [2]int64{int64(h.log), h.off})
	live := !h.gen.revoked.Load()
	s := consumer.Settlement{Op: op}
	if op == consumer.SettleNak {
		s.Delay = time.Duration(m.rng.Int64N(int64(m.s.cfg.LocalRetryMaxDelay)))
	}
	if err := h.r.Settle(context.Background(), s); err != nil {
		panic(err)
	}
	if op != consumer.SettleNak && live {
		m.settled[h.log][h.off] = true
	}
	m.tracef("route %s %d@%d (generation %d, live %v)", op, h.log, h.off, h.gen.id, live)
}

// commit commits the current generation's partitions as Source.commit
// does, checking each commit against what is settled; now and then the
// request fails (nothing is recorded, the next commit offers it again).
func (m *sim) commit() error {
	fail := !m.drain && m.rng.IntN(10) == 0
	for i, p := range m.gen.parts {
		off, meta, ok := p.wm.CommitMetadata()
		if !ok {
			continue
		}
		li := m.genLogs[i]
		l := m.logs[li]
		if off < m.committed[li].off {
			return fmt.Errorf("commit of %s/%d went back from %d to %d", l.topic, l.id, m.committed[li].off, off)
		}
		for o := m.verified[li]; o < off; o++ { // below verified: checked by an earlier commit (settled stays settled)
			if r := l.recs[o]; r != nil && !r.control && !m.settled[li][o] {
				return fmt.Errorf("commit of %s/%d at %d passes offset %d, which is not settled", l.topic, l.id, off, o)
			}
		}
		m.verified[li] = max(m.verified[li], off)
		for _, rg := range kafkacore.DecodeSettled(off, meta) {
			for o := rg.Lo; o < rg.Hi; o++ {
				if r := l.recs[o]; r != nil && !r.control && !m.settled[li][o] {
					return fmt.Errorf("commit of %s/%d at %d: its settled map names offset %d, which is not settled", l.topic, l.id, off, o)
				}
			}
		}
		if fail {
			continue
		}
		m.committed[li] = simCommit{off, meta}
		p.wm.CommittedMetadata(off, meta)
		m.tracef("commit %s/%d at %d (%d B map)", l.topic, l.id, off, len(meta))
	}
	return nil
}

// bound checks the prefetch bound.
func (m *sim) bound() error {
	b := m.s.buf.State()
	queued, delayed, queuedN := b.QueuedBytes, b.DelayedBytes, b.QueuedN
	if queued+delayed != b.Bytes {
		return fmt.Errorf("buffer counts %d bytes, holds %d queued + %d delayed", b.Bytes, queued, delayed)
	}
	if delayed != b.RetryBytes || b.Delayed != b.RetryN {
		return fmt.Errorf("buffer counts %d retries / %d bytes, holds %d / %d", b.RetryN, b.RetryBytes, b.Delayed, delayed)
	}
	// A Nak may take the buffer over (it never loses a message): fetches
	// then wait; what was fetched stays within the prefetch.
	if queued+b.Reserved > b.MaxBytes && !(queuedN == 1 && b.Reserved == 0) {
		return fmt.Errorf("buffer holds %d bytes in %d fetched records and %d reserved: above the prefetch %d", queued, queuedN, b.Reserved, b.MaxBytes)
	}
	// The count only gates sending a fetch (fewer than PrefetchMessages
	// held), and a response keeps at most PrefetchMessages: below the
	// prefetch plus one response per lane.
	if queuedN >= b.MaxCount*(1+len(m.lanes)) {
		return fmt.Errorf("buffer holds %d fetched records with %d lanes: not below PrefetchMessages %d + one response of at most %d per lane",
			queuedN, len(m.lanes), b.MaxCount, b.MaxCount)
	}
	// In-process retries within their allowance (poison messages waiting
	// for a dead letter that cannot be written) do not keep fetches back:
	// with nothing queued or reserved, some lane can fetch.
	if queuedN == 0 && b.Reserved == 0 && b.RetryN <= b.RetryMaxN && b.RetryBytes <= b.RetryMaxBytes && len(m.lanes) > 0 {
		stuck := true
		for _, l := range m.lanes {
			select {
			case <-l.space: // about to try again
				stuck = false
			default:
				stuck = stuck && l.state == laneBlocked
			}
		}
		if stuck {
			return fmt.Errorf("every lane waits to reserve with nothing queued or reserved and %d in-process retries (%d B) within their allowance %d / %d B",
				b.RetryN, b.RetryBytes, b.RetryMaxN, b.RetryMaxBytes)
		}
	}
	if all := b.Bytes + b.Reserved + m.heldBytes; all > b.MaxBytes+b.RetryMaxBytes+m.limits.Bytes+m.maxRec {
		return fmt.Errorf("held %d bytes (buffer %d, reserved %d, route %d): above prefetch %d + retries' allowance %d + window %d + one record %d",
			all, b.Bytes, b.Reserved, m.heldBytes, b.MaxBytes, b.RetryMaxBytes, m.limits.Bytes, m.maxRec)
	}
	return nil
}

// done reports whether every record is settled and every partition
// committed to its end.
func (m *sim) done() bool {
	for i, l := range m.logs {
		// A commit at the end verified every record below it settled.
		if m.committed[i].off != l.next || m.verified[i] < l.next {
			return false
		}
	}
	return true
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// run plays the seed: a chaos phase, then the drain.
func (m *sim) run() error {
	m.startGen(false)
	chaos := 200 + m.rng.IntN(1500)
	for {
		m.steps++
		if !m.drain && m.steps >= chaos {
			m.drain, m.drainStart = true, m.now
			m.tracef("drain")
			if err := m.endGen(); err != nil {
				return err
			}
			m.startGen(true)
		}
		if m.drain {
			if m.done() {
				return nil
			}
			// Liveness: a retry waits at most the route's longest delay
			// after it was written (all were written before the drain),
			// in-process retries at most LocalRetryMaxDelay; idle lanes
			// poll once per FetchMaxWait.
			// A record whose timestamp is ahead of the clock as well is
			// anchored when the Source first reads it, which may be only
			// once the records before it were due: each such record may
			// add a longest delay.
			limit := time.Duration(1+m.skewed)*m.s.maxDelay() + m.s.cfg.LocalRetryMaxDelay + 30*time.Second
			if m.now.Sub(m.drainStart) > limit {
				return fmt.Errorf("liveness: not everything settled and committed %v into the drain", limit)
			}
			polls := int(limit/m.s.cfg.FetchMaxWait+1) * 2 * len(m.logs)
			if budget := polls + 8*m.records() + 100; m.drainFetches > budget {
				return fmt.Errorf("liveness: %d fetches into the drain (budget %d) and not done", m.drainFetches, budget)
			}
		}
		if m.steps > 500_000 {
			return fmt.Errorf("liveness: %d steps and not done (virtual time %v)", m.steps, m.now.Sub(m.start))
		}
		if err := m.step(); err != nil {
			return err
		}
		if err := m.bound(); err != nil {
			return err
		}
	}
}

// step picks one enabled action at random, or moves the clock to the
// next timer.
func (m *sim) step() error {
	type action struct {
		w  int
		fn func() error
	}
	var acts []action
	add := func(w int, fn func() error) { acts = append(acts, action{w, fn}) }
	var next time.Time
	timer := func(t time.Time) {
		if t.After(m.now) && (next.IsZero() || t.Before(next)) {
			next = t
		}
	}
	for _, l := range m.lanes {
		switch l.state {
		case laneIdle:
			add(3, func() error { m.laneStep(l); return nil })
		case laneBlocked:
			select {
			case <-l.space:
				add(3, func() error { m.laneStep(l); return nil })
			default:
			}
		case laneInFlight:
			if !l.due.After(m.now) {
				add(3, func() error { return m.arrive(l) })
			} else {
				timer(l.due)
			}
		case laneSleeping:
			if !l.due.After(m.now) {
				add(3, func() error { l.state = laneIdle; m.laneStep(l); return nil })
			} else {
				timer(l.due)
			}
		}
	}
	b := m.s.buf.State()
	takeable := b.Active > 0 || b.Delayed > 0 && !b.NextDue.After(m.now)
	if b.Delayed > 0 {
		timer(b.NextDue)
	}
	if takeable && len(m.held) < m.limits.Messages && m.heldBytes < m.limits.Bytes {
		add(2, m.take)
	}
	if len(m.held) > 0 {
		add(3, func() error {
			h := m.held[m.rng.IntN(len(m.held))]
			op := consumer.SettleAck
			if !m.drain {
				switch x := m.rng.IntN(10); {
				case x < 2 && h.r.attempt < m.limits.MaxAttempts:
					op = consumer.SettleNak
				case x < 3:
					op = consumer.SettleTerm // dead-lettered
				}
			}
			m.settle(h, op)
			return nil
		})
	}
	if !m.now.Before(m.nextCommit) {
		add(1, func() error { m.nextCommit = m.now.Add(100 * time.Millisecond); return m.commit() })
	} else {
		timer(m.nextCommit)
	}
	if !m.drain {
		if m.rng.IntN(400) == 0 && m.gens < 6 {
			add(1, func() error {
				if err := m.endGen(); err != nil {
					return err
				}
				m.startGen(false)
				return nil
			})
		}
		if m.rng.IntN(4) == 0 {
			add(1, func() error { m.produce(m.logs[m.rng.IntN(len(m.logs))]); return nil })
		}
	}
	if next.IsZero() {
		next = m.now.Add(10 * time.Millisecond)
	}
	if len(acts) == 0 {
		m.now = maxTime(next, m.now.Add(time.Microsecond)) // nothing to do until the next timer
		return nil
	}
	add(1, func() error {
		// A little time passes while there is work (handlers, round trips).
		m.now = m.now.Add(min(next.Sub(m.now), time.Duration(1+m.rng.IntN(2000))*time.Microsecond))
		return nil
	})
	total := 0
	for _, a := range acts {
		total += a.w
	}
	x := m.rng.IntN(total)
	for _, a := range acts {
		if x < a.w {
			return a.fn()
		}
		x -= a.w
	}
	panic("unreachable")
}
