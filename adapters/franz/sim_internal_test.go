package franzadapter

import (
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/adapterkit"
	"github.com/sluice-go/sluice/internal/kafkacore"
	"github.com/sluice-go/sluice/sluicetest"
)

// TestSimulation is the deterministic model of the franz Source's own
// buffering, which differs from the kafka-go adapter's (whose simulation
// is adapters/kafka's TestSimulation): kgo fetches on its own and keeps
// one fetch response per broker buffered, the Source polls at most its
// free slots once Reserve finds room and charges everything a poll
// brought, retry records wait in the delayed heap with their partition
// paused, and revokes purge, commit once and drop later settlements
// (lost partitions: without the commit). Each
// seed is one run of the real Source code (keep, Fetch, Settle, the
// rebalance callbacks, commitLocked) against a model of kgo and a route
// with random window, sizes, settlements and rebalances, in virtual time.
// It checks after every step:
//
//   - the records polled and queued never exceed the prefetch slots, nor
//     its bytes by more than one poll;
//   - the buffer's counters equal what it holds;
//   - a commit never passes an offset that is not settled, and its map
//     lists only settled offsets;
//
// and at the end that every record was settled and every partition
// committed to its end (nothing lost; duplicates only after a revoke).
// SLUICE_SIM_SEEDS sets how many seeds (default 300), SLUICE_SIM_SEED=n
// replays one.
func TestSimulation(t *testing.T) {
	seeds := 300
	if v, err := strconv.Atoi(os.Getenv("SLUICE_SIM_SEEDS")); err == nil && v > 0 {
		seeds = v
	}
	if v, err := strconv.ParseUint(os.Getenv("SLUICE_SIM_SEED"), 10, 64); err == nil {
		if err := runSim(v); err != nil {
			t.Fatalf("seed %d: %v", v, err)
		}
		return
	}
	for seed := range uint64(seeds) {
		if err := runSim(seed); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	t.Logf("%d seeds", seeds)
}

type simClock struct{ now time.Time }

func (c *simClock) Now() time.Time { return c.now }

// simKgo models a kgo group consumer's fetching: one buffered fetch (one
// broker), refilled only once drained, from each unpaused partition's
// position; a revoke forgets a partition's position and buffered records.
type simKgo struct {
	rng      *rand.Rand
	logs     map[topicPartition][]*kgo.Record
	pos      map[topicPartition]int64 // next offset to fetch; absent: not assigned
	paused   map[topicPartition]bool
	buffered []*kgo.Record
	fetchMax int64
	// commits: the last accepted offset and metadata of each partition.
	committed map[topicPartition]int64
	meta      map[topicPartition]string
	settled   map[topicPartition]map[int64]bool // settled at least once, by any owner
	fail      bool                              // the next commit fails
	err       error
}

func (k *simKgo) PauseFetchPartitions(m map[string][]int32) map[string][]int32 {
	for t, ids := range m {
		for _, id := range ids {
			k.paused[topicPartition{t, id}] = true
		}
	}
	return nil
}

func (k *simKgo) ResumeFetchPartitions(m map[string][]int32) {
	for t, ids := range m {
		for _, id := range ids {
			delete(k.paused, topicPartition{t, id})
		}
	}
}

func (k *simKgo) commit(_ context.Context, offsets map[string]map[int32]kgo.EpochOffset, metas map[topicPartition]string) error {
	if k.fail {
		k.fail = false
		return fmt.Errorf("sim: commit refused")
	}
	for t, ps := range offsets {
		for id, eo := range ps {
			tp := topicPartition{t, id}
			for o := int64(0); o < eo.Offset; o++ {
				if !k.settled[tp][o] && k.err == nil {
					k.err = fmt.Errorf("commit of %s/%d at %d passes unsettled offset %d", t, id, eo.Offset, o)
				}
			}
			for _, r := range kafkacore.DecodeSettled(eo.Offset, metas[tp]) {
				for o := r.Lo; o < r.Hi; o++ {
					if !k.settled[tp][o] && k.err == nil {
						k.err = fmt.Errorf("commit of %s/%d at %d lists unsettled offset %d as settled", t, id, eo.Offset, o)
					}
				}
			}
			k.committed[tp], k.meta[tp] = eo.Offset, metas[tp]
		}
	}
	return nil
}

// poll is PollRecords(n): what is buffered, at most n; an empty buffer is
// refilled first with one fetch (each unpaused partition's records from its
// position, a partition's first record whole, then up to fetchMax bytes).
func (k *simKgo) poll(n int) (kgo.Fetches, int64) {
	if len(k.buffered) == 0 {
		var bytes int64
		tps := make([]topicPartition, 0, len(k.pos))
		for tp := range k.pos {
			tps = append(tps, tp)
		}
		sortTPs(tps)
		k.rng.Shuffle(len(tps), func(i, j int) { tps[i], tps[j] = tps[j], tps[i] })
		for _, tp := range tps {
			if k.paused[tp] {
				continue
			}
			for o := k.pos[tp]; o < int64(len(k.logs[tp])); o++ {
				r := k.logs[tp][o]
				sz := int64(len(r.Value))
				if bytes > 0 && bytes+sz > k.fetchMax {
					break
				}
				k.buffered = append(k.buffered, r)
				bytes += sz
				k.pos[tp] = o + 1
			}
		}
	}
	take := min(n, len(k.buffered))
	got := k.buffered[:take]
	k.buffered = k.buffered[take:]
	var fs kgo.Fetches
	var bytes int64
	byTP := map[topicPartition][]*kgo.Record{}
	var order []topicPartition
	for _, r := range got {
		tp := topicPartition{r.Topic, r.Partition}
		if _, ok := byTP[tp]; !ok {
			order = append(order, tp)
		}
		byTP[tp] = append(byTP[tp], r)
		bytes += int64(len(r.Value))
	}
	for _, tp := range order {
		fs = append(fs, kgo.Fetch{Topics: []kgo.FetchTopic{{Topic: tp.topic, Partitions: []kgo.FetchPartition{{Partition: tp.id, Records: byTP[tp]}}}}})
	}
	return fs, bytes
}

func sortTPs(tps []topicPartition) {
	for i := 1; i < len(tps); i++ {
		for j := i; j > 0 && (tps[j].topic < tps[j-1].topic || tps[j].topic == tps[j-1].topic && tps[j].id < tps[j-1].id); j-- {
			tps[j], tps[j-1] = tps[j-1], tps[j]
		}
	}
}

func runSim(seed uint64) error {
	rng := rand.New(rand.NewPCG(seed, 0xf2a5))
	clock := &simClock{now: time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)}
	const topic = "orders"
	nParts := 1 + rng.IntN(4)
	k := &simKgo{rng: rng, logs: map[topicPartition][]*kgo.Record{}, pos: map[topicPartition]int64{}, paused: map[topicPartition]bool{},
		committed: map[topicPartition]int64{}, meta: map[topicPartition]string{}, settled: map[topicPartition]map[int64]bool{},
		fetchMax: int64(100 + rng.IntN(3000))}
	total := 0
	maxRec := int64(0)
	for id := range int32(nParts) {
		tp := topicPartition{topic, id}
		k.settled[tp] = map[int64]bool{}
		n := rng.IntN(200)
		for o := range n {
			sz := 1 + rng.IntN(1+rng.IntN(400))
			maxRec = max(maxRec, int64(sz))
			k.logs[tp] = append(k.logs[tp], &kgo.Record{Topic: topic, Partition: id, Offset: int64(o), Value: make([]byte, sz),
				Key: []byte(strconv.Itoa(o)), Timestamp: clock.now})
		}
		total += n
	}
	limits := consumer.RouteLimits{Route: "sim", Messages: 1 + rng.IntN(30), Bytes: int64(200 + rng.IntN(5000)), MaxAttempts: 5,
		MaxDelay: time.Second}
	cfg := Config{Clock: clock, RevokeGrace: -1, LocalRetryMaxDelay: time.Second}
	if rng.IntN(2) == 0 {
		cfg.LocalRetryMessages, cfg.LocalRetryBytes = 1+rng.IntN(4), int64(1+rng.IntN(500))
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	s, err := NewSource(cfg)
	if err != nil {
		return err
	}
	defer s.cancel()
	s.cfg.sizeFrom(limits)
	s.limits, s.group, s.topics, s.ctl = limits, "sim", []string{topic}, k
	s.buf = kafkacore.NewBuffer[*record](s.cfg.PrefetchMessages, s.cfg.PrefetchBytes, s.cfg.LocalRetryMessages, s.cfg.LocalRetryBytes)
	s.attached.Store(true)
	ctx := context.Background()

	all := map[string][]int32{}
	for id := range int32(nParts) {
		all[topic] = append(all[topic], id)
	}
	assign := func(m map[string][]int32) {
		s.assigned(ctx, nil, m)
		resp := kmsg.NewPtrOffsetFetchResponse()
		for t, ids := range m {
			rt := kmsg.NewOffsetFetchResponseTopic()
			rt.Topic = t
			for _, id := range ids {
				tp := topicPartition{t, id}
				off, ok := k.committed[tp]
				if !ok {
					off = -1
				}
				k.pos[tp] = max(off, 0)
				rp := kmsg.NewOffsetFetchResponseTopicPartition()
				rp.Partition, rp.Offset = id, off
				meta := k.meta[tp]
				rp.Metadata = &meta
				rt.Partitions = append(rt.Partitions, rp)
			}
			resp.Topics = append(resp.Topics, rt)
		}
		_ = s.offsetsFetched(ctx, nil, resp)
	}
	revoke := func(m map[string][]int32, lost bool) {
		for t, ids := range m {
			for _, id := range ids {
				tp := topicPartition{t, id}
				delete(k.pos, tp)
				delete(k.paused, tp)
				keep := k.buffered[:0]
				for _, r := range k.buffered {
					if r.Topic != t || r.Partition != id {
						keep = append(keep, r)
					}
				}
				k.buffered = keep
			}
		}
		if lost {
			s.lost(ctx, nil, m) // fenced: no final commit
		} else {
			s.revoked(ctx, nil, m)
		}
	}
	assign(all)

	var held []*consumer.Message
	var heldBytes int64
	check := func(lastPoll int64) error {
		if k.err != nil {
			return k.err
		}
		st := s.buf.State()
		if st.QueuedBytes+st.DelayedBytes != st.Bytes || st.Delayed != st.RetryN && st.DelayedBytes != st.RetryBytes {
			return fmt.Errorf("buffer counts %d B / %d retries, holds %d queued + %d delayed B, %d delayed", st.Bytes, st.RetryN, st.QueuedBytes, st.DelayedBytes, st.Delayed)
		}
		if st.QueuedN > st.MaxCount {
			return fmt.Errorf("%d records queued, above the prefetch's %d slots", st.QueuedN, st.MaxCount)
		}
		if st.QueuedBytes > st.MaxBytes+lastPoll {
			return fmt.Errorf("%d bytes queued, above the prefetch %d + the last poll %d", st.QueuedBytes, st.MaxBytes, lastPoll)
		}
		return nil
	}
	var lastPoll int64
	for step := 0; step < 20000; step++ {
		done := true
		for tp, log := range k.logs {
			if c, ok := k.committed[tp]; (!ok && len(log) > 0) || c < int64(len(log)) {
				done = false
			}
		}
		if done && len(held) == 0 {
			break
		}
		switch x := rng.IntN(20); {
		case x < 6: // the poll loop
			if grant, _, ok, _ := s.buf.TryReserve(max(s.cfg.PrefetchBytes/4, 1), nil); ok {
				s.buf.Unreserve(grant)
				n, _ := s.buf.Free()
				var fs kgo.Fetches
				fs, lastPoll = k.poll(max(n, 1))
				if len(fs) > 0 {
					s.keep(fs)
				}
			}
		case x < 11: // the route takes what its window has room for
			room := limits.Messages - len(held)
			st := s.buf.State()
			takeable := st.Active > 0 || st.Delayed > 0 && !st.NextDue.After(clock.now)
			if room > 0 && heldBytes < limits.Bytes && takeable {
				ms, err := s.Fetch(ctx, room, limits.Bytes-heldBytes)
				if err != nil {
					return err
				}
				for _, m := range ms {
					held = append(held, m)
					heldBytes += m.Size
				}
			}
		case x < 17: // a settlement
			if len(held) == 0 {
				break
			}
			i := rng.IntN(len(held))
			m := held[i]
			held = append(held[:i], held[i+1:]...)
			heldBytes -= m.Size
			op, delay := consumer.SettleAck, time.Duration(0)
			if y := rng.IntN(10); y < 2 && m.Attempt < limits.MaxAttempts {
				op, delay = consumer.SettleNak, time.Duration(rng.IntN(1000))*time.Millisecond
			} else if y < 3 {
				op = consumer.SettleTerm
			}
			if op != consumer.SettleNak {
				if r := m; !adapterRecord(r).part.revoked.Load() {
					k.settled[topicPartition{r.Origin.Topic, r.Origin.Partition}][r.Origin.Offset] = true
				}
			}
			if err := sluicetest.Settle(ctx, m, consumer.Settlement{Op: op, Delay: delay}); err != nil {
				return err
			}
		case x < 18: // a commit, now and then refused
			k.fail = rng.IntN(5) == 0
			s.commitMu.Lock()
			s.mu.Lock()
			ps := make([]*partition, 0, len(s.parts))
			for _, p := range s.parts {
				ps = append(ps, p)
			}
			s.mu.Unlock()
			s.commitLocked(ctx, s.ctl, ps)
			s.commitMu.Unlock()
		case x < 19: // time passes
			clock.now = clock.now.Add(time.Duration(rng.IntN(300)) * time.Millisecond)
		default: // a rebalance now and then: some partitions revoked, then assigned again
			if rng.IntN(10) != 0 {
				break
			}
			m := map[string][]int32{}
			for id := range int32(nParts) {
				if rng.IntN(2) == 0 {
					m[topic] = append(m[topic], id)
				}
			}
			if len(m) == 0 {
				break
			}
			revoke(m, rng.IntN(4) == 0)
			// The route hands back what it holds of them (Revoked).
			keep := held[:0]
			for _, h := range held {
				if adapterRecord(h).Revoked() {
					heldBytes -= h.Size
					if err := sluicetest.Settle(ctx, h, consumer.Settlement{Op: consumer.SettleNak}); err != nil {
						return err
					}
					continue
				}
				keep = append(keep, h)
			}
			held = keep
			assign(m)
		}
		if err := check(lastPoll); err != nil {
			return fmt.Errorf("step %d: %w", step, err)
		}
	}
	for tp, log := range k.logs {
		if c := k.committed[tp]; len(log) > 0 && c != int64(len(log)) {
			return fmt.Errorf("%s/%d committed at %d of %d (held %d, buffer %+v)", tp.topic, tp.id, c, len(log), len(held), s.buf.State())
		}
		for o := range int64(len(log)) {
			if !k.settled[tp][o] {
				return fmt.Errorf("%s/%d offset %d never settled", tp.topic, tp.id, o)
			}
		}
	}
	return k.err
}

// adapterRecord is the Source's record behind a message it handed out.
func adapterRecord(m *consumer.Message) *record { return adapterkit.AckerOf(m).(*record) }
