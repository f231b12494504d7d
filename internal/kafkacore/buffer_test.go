package kafkacore_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/kafkacore"
)

// item is a client adapter's record, as the buffer sees it.
type item struct {
	part *kafkacore.Part[*item]
	id   int
	size int64
	due  time.Time
}

func (r *item) BufferSize() int64                  { return r.size }
func (r *item) BufferDue() time.Time               { return r.due }
func (r *item) BufferPart() *kafkacore.Part[*item] { return r.part }

func items(p *kafkacore.Part[*item], first, n int, size int64) []*item {
	out := make([]*item, n)
	for i := range out {
		out[i] = &item{part: p, id: first + i, size: size}
	}
	return out
}

// What one lane polled is admitted round robin within the budget, handed
// out a partition at a time, and a generation's end drops what it held.
func TestBufferAdmitTakePurge(t *testing.T) {
	var g1, g2 kafkacore.Gen
	p0, p1 := &kafkacore.Part[*item]{Gen: &g1}, &kafkacore.Part[*item]{Gen: &g2}
	b := kafkacore.NewBuffer[*item](4, 1<<20, 2, 1<<10)
	grant, _, err := b.Reserve(context.Background(), 1<<10, "lane")
	if err != nil {
		t.Fatal(err)
	}
	lists := [][]*item{items(p0, 0, 5, 10), items(p1, 100, 1, 10)}
	kept := b.Admit(grant, lists, "lane")
	if kept[0] != 3 || kept[1] != 1 {
		t.Fatalf("kept %v, want [3 1] (four slots, round robin)", kept)
	}
	b.Publish(p0, lists[0][:kept[0]])
	b.Publish(p1, lists[1][:kept[1]])
	got, _ := b.Take(time.Now(), 2, 1<<20, nil)
	if len(got) != 2 || got[0].part == got[1].part {
		t.Fatalf("took %v: want one record of each partition", got)
	}
	if g1.Outstanding.Load() != 1 || g2.Outstanding.Load() != 1 {
		t.Fatalf("outstanding %d / %d, want 1 / 1", g1.Outstanding.Load(), g2.Outstanding.Load())
	}
	// An in-process retry waits for its due time, in its own allowance.
	now := time.Now()
	got[1].due = now.Add(time.Minute)
	b.PushDelayed(got[1])
	if st := b.State(); st.RetryN != 1 || st.Count != 3 || st.QueuedN != 2 {
		t.Fatalf("state %+v", st)
	}
	g1.Ending.Store(true)
	if n := b.Purge(&g1); n != 2 {
		t.Fatalf("purge dropped %d, want the 2 queued of the ended generation", n)
	}
	if got, next := b.Take(now, 10, 1<<20, nil); len(got) != 0 || !next.Equal(now.Add(time.Minute)) {
		t.Fatalf("took %v before the retry was due (next %v)", got, next)
	}
	if got, _ := b.Take(now.Add(time.Minute), 10, 1<<20, nil); len(got) != 1 || got[0].id != 100 {
		t.Fatalf("took %v once due, want the retry", got)
	}
	if n, bytes, _, _ := b.Usage(); n != 0 || bytes != 0 {
		t.Fatalf("holds %d records / %d bytes after everything left", n, bytes)
	}
}

// Reserve refuses to grant room the budget does not have: it waits, and
// returns ctx's error when ctx ends first.
func TestBufferReserveWaits(t *testing.T) {
	var g kafkacore.Gen
	p := &kafkacore.Part[*item]{Gen: &g}
	b := kafkacore.NewBuffer[*item](2, 100, 0, 0)
	grant, _, _ := b.Reserve(context.Background(), 100, nil)
	b.Force(grant, items(p, 0, 1, 100)[0])
	if _, _, ok, _ := b.TryReserve(10, nil); ok {
		t.Fatal("reserved with the budget full")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, _, err := b.Reserve(ctx, 10, nil); err != context.Canceled {
		t.Fatalf("Reserve on a full buffer with a done ctx: %v", err)
	}
}

// A fetch's response (Admit with a grant) is kept whole past the message
// count, up to one response of maxCount records: the count only gates
// sending a fetch (Reserve waits for a quarter of the slots), because a
// broker returns a partition's whole first batch and dropping the excess
// made each fetch decode records it threw away. Records charged without a
// grant are still kept only within the count and a partition's share.
func TestBufferAdmitKeepsResponseUpToCount(t *testing.T) {
	var g kafkacore.Gen
	p0, p1 := &kafkacore.Part[*item]{Gen: &g}, &kafkacore.Part[*item]{Gen: &g}
	b := kafkacore.NewBuffer[*item](8, 1<<20, 0, 0)
	held := items(p0, 0, 4, 10)
	if kept := b.Admit(0, [][]*item{held}, nil); kept[0] != 4 {
		t.Fatalf("kept %v of 4 handed over alone, want all 4", kept)
	}
	b.Publish(p0, held)
	grant, _, err := b.Reserve(context.Background(), 1<<10, "lane")
	if err != nil || grant == 0 {
		t.Fatalf("Reserve with half the slots free: grant %d, %v", grant, err)
	}
	// 4 held, 4 free: the response of 20 + 3 records keeps 8 (one
	// response's count), round robin.
	resp := [][]*item{items(p0, 4, 20, 10), items(p1, 100, 3, 10)}
	kept := b.Admit(grant, resp, "lane")
	if kept[0] != 5 || kept[1] != 3 {
		t.Fatalf("kept %v of a response with 4 slots free, want [5 3] (8, round robin)", kept)
	}
	b.Publish(p0, resp[0][:kept[0]])
	b.Publish(p1, resp[1][:kept[1]])
	if n, _, _, peakN := b.Usage(); n != 12 || peakN != 12 {
		t.Fatalf("holds %d (peak %d), want 12: 4 + one response of 8", n, peakN)
	}
	// Over the count: no fetch is sent, and nothing is charged alone.
	if _, _, ok, _ := b.TryReserve(1<<10, nil); ok {
		t.Fatal("reserved for a fetch with 12 of 8 slots held")
	}
	if kept := b.Admit(0, [][]*item{items(p1, 200, 1, 10)}, nil); kept[0] != 0 {
		t.Fatal("a record handed over alone was charged past the count")
	}
	// The hand-out stays round robin.
	got, _ := b.Take(time.Now(), 4, 1<<20, nil)
	if len(got) != 4 || got[0].part == got[1].part || got[1].part == got[2].part {
		t.Fatalf("took %v: want the partitions in turn", got)
	}
}

// The bytes bound a response whatever the count: records that do not fit
// the budget's bytes are dropped.
func TestBufferAdmitResponseBoundByBytes(t *testing.T) {
	var g kafkacore.Gen
	p := &kafkacore.Part[*item]{Gen: &g}
	b := kafkacore.NewBuffer[*item](100, 1000, 0, 0)
	grant, _, _ := b.Reserve(context.Background(), 1000, "lane")
	if kept := b.Admit(grant, [][]*item{items(p, 0, 20, 100)}, "lane"); kept[0] != 10 {
		t.Fatalf("kept %v of 20 records of 100 B in a 1,000 B budget, want 10", kept)
	}
	if _, bytes, peak, _ := b.Usage(); bytes != 1000 || peak != 1000 {
		t.Fatalf("holds %d B (peak %d), want 1000", bytes, peak)
	}
}

// Records handed over without a grant keep a partition's share of the
// slots (SetShares), so one partition cannot take them all.
func TestBufferAdmitAloneKeepsShares(t *testing.T) {
	var g kafkacore.Gen
	p0, p1 := &kafkacore.Part[*item]{Gen: &g}, &kafkacore.Part[*item]{Gen: &g}
	b := kafkacore.NewBuffer[*item](8, 1<<20, 0, 0)
	b.SetShares(2)
	kept := b.Admit(0, [][]*item{items(p0, 0, 6, 10)}, nil)
	if kept[0] != 4 {
		t.Fatalf("kept %v of one partition with 2 shares of 8 slots, want 4", kept)
	}
	b.Publish(p0, items(p0, 0, 4, 10))
	if kept := b.Admit(0, [][]*item{items(p1, 0, 6, 10)}, nil); kept[0] != 4 {
		t.Fatalf("the other partition kept %v, want its 4", kept)
	}
}
