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
