package kafkaadapter

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/kafkacore"
)

func testPart(g *generation, id int) *partition {
	return &partition{gen: g, Part: kafkacore.Part[*record]{Gen: &g.Gen}, id: id, wm: NewWatermark()}
}

func recsOf(p *partition, n int, size int64) []*record {
	out := make([]*record, n)
	for i := range out {
		out[i] = &record{part: p, offset: int64(i), size: size}
	}
	return out
}

// A fetch response far larger than the prefetch budget (a librdkafka batch
// of 1,000 records against 8 messages / 640 bytes): admit keeps only what
// fits, shared round robin between the partitions of the response, and the
// buffer never holds more than its budget.
func TestAdmitKeepsWhatFits(t *testing.T) {
	g := &generation{kick: make(chan struct{}, 1)}
	ps := []*partition{testPart(g, 0), testPart(g, 1), testPart(g, 2)}
	for _, c := range []struct {
		maxCount int
		maxBytes int64
		want     []int
	}{
		{8, 1 << 20, []int{5, 2, 1}},       // count-bound: 1, 1, 1, then 2, 2, then 3, 4, 5
		{1000, 640, []int{3, 2, 1}},        // byte-bound (100 B records, one partition shorter)
		{2000, 1 << 20, []int{1000, 2, 1}}, // everything fits
	} {
		b := kafkacore.NewBuffer[*record](c.maxCount, c.maxBytes, 0, 0)
		grant, _, err := b.Reserve(context.Background(), 1<<20, nil)
		if err != nil {
			t.Fatal(err)
		}
		lists := [][]*record{recsOf(ps[0], 1000, 100), recsOf(ps[1], 2, 100), recsOf(ps[2], 1, 100)}
		kept := b.Admit(grant, lists, nil)
		for i := range kept {
			if kept[i] != c.want[i] {
				t.Fatalf("budget %d/%d: kept %v, want %v", c.maxCount, c.maxBytes, kept, c.want)
			}
		}
		n, bytes, peak, peakN := b.Usage()
		if n > c.maxCount || bytes > c.maxBytes || peak > max(c.maxBytes, grant) || peakN > c.maxCount {
			t.Fatalf("budget %d/%d: holds %d records / %d bytes (peak %d / %d)", c.maxCount, c.maxBytes, n, bytes, peakN, peak)
		}
	}
	// A record larger than the whole budget still goes through alone.
	b := kafkacore.NewBuffer[*record](8, 50, 0, 0)
	grant, _, _ := b.Reserve(context.Background(), 1<<20, nil)
	if kept := b.Admit(grant, [][]*record{recsOf(ps[0], 3, 100)}, nil); kept[0] != 1 {
		t.Fatalf("oversize record: kept %v, want 1", kept)
	}
}

// take serves the partitions round robin, whatever order they filled in.
func TestTakeRoundRobin(t *testing.T) {
	g := &generation{kick: make(chan struct{}, 1)}
	b := kafkacore.NewBuffer[*record](10000, 1<<30, 0, 0)
	ps := []*partition{testPart(g, 0), testPart(g, 1), testPart(g, 2)}
	for _, p := range ps {
		rs := recsOf(p, 100, 1)
		b.Admit(0, [][]*record{rs}, nil)
		b.Publish(&p.Part, rs)
	}
	out, _ := b.Take(time.Now(), 30, 1<<30, nil)
	counts := map[int]int{}
	for i, r := range out {
		counts[r.part.id]++
		if want := i % 3; r.part.id != want {
			t.Fatalf("record %d from partition %d, want %d", i, r.part.id, want)
		}
	}
	if len(out) != 30 || counts[0] != 10 || counts[1] != 10 || counts[2] != 10 {
		t.Fatalf("took %d: %v", len(out), counts)
	}
}

// TestTakeCountsOutstanding races Fetch's take against the end of a
// generation (ending, purge, wait for outstanding, final commit): a record
// that take handed out must already be counted in outstanding when the
// generation's end looks, or the final commit runs while it is in flight
// and a record of a revoked generation is handed to the handler. Before
// the fix, outstanding was counted in Fetch after take had released the
// buffer lock.
func TestTakeCountsOutstanding(t *testing.T) {
	for range 200 {
		b := kafkacore.NewBuffer[*record](1000, 1<<20, 0, 0)
		g := &generation{kick: make(chan struct{}, 1)}
		p := &partition{gen: g, Part: kafkacore.Part[*record]{Gen: &g.Gen}, wm: NewWatermark()}
		var recs []*record
		for i := range 50 {
			r := &record{part: p, offset: int64(i), size: 1}
			p.wm.Deliver(r.offset)
			recs = append(recs, r)
		}
		b.Admit(0, [][]*record{recs}, nil)
		b.Publish(&p.Part, recs)
		var taken int64 // written by the taker only until purge returns
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				out, _ := b.Take(time.Now(), 1, 1<<20, nil)
				if len(out) == 0 {
					return
				}
				taken += int64(len(out))
			}
		}()
		// The generation ends while take runs.
		time.Sleep(time.Duration(len(recs)%7) * time.Microsecond)
		g.Ending.Store(true)
		b.Purge(&g.Gen)
		seen := g.Outstanding.Load()
		wg.Wait()
		if seen != taken {
			t.Fatalf("after the generation ended, outstanding was %d but take had handed out %d", seen, taken)
		}
	}
}
