package kafkacore

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// randomSettled returns a random set above mark: runs of settled and not
// settled offsets, the shapes a watermark sees (long settled stretches
// after a stuck offset, scattered in-flight ones).
func randomSettled(rng *rand.Rand, mark int64, ranges int) Settled {
	var s Settled
	cur := mark + 1
	for range ranges {
		lo := cur + rng.Int64N(1+rng.Int64N(40))
		if len(s) > 0 && lo == cur {
			lo++
		}
		hi := lo + 1 + rng.Int64N(1+rng.Int64N(200))
		s = s.Add(lo, hi)
		cur = hi
	}
	return s
}

func TestSettledRoundTrip(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 300 {
		mark := rng.Int64N(1 << 40)
		s := randomSettled(rng, mark, rng.IntN(3000))
		meta := EncodeSettled(mark, s)
		if len(meta) > MaxSettledMeta {
			t.Fatalf("case %d: %d bytes", i, len(meta))
		}
		got := DecodeSettled(mark, meta)
		// What fits is a prefix of the ranges, whole.
		if len(got) > len(s) || !slices.Equal(got, s[:len(got)]) {
			t.Fatalf("case %d: decoded %v is not a prefix of %v", i, got, s)
		}
		if len(s) > 0 && len(got) == 0 {
			t.Fatalf("case %d: %d ranges, nothing fit", i, len(s))
		}
		// Within 2% of the longest prefix that fits.
		if n := len(got) + len(got)/50 + 1; n < len(s) && len(DecodeSettled(mark, EncodeSettled(mark, s[:n]))) == n {
			t.Fatalf("case %d: %d of %d ranges kept, %d fit", i, len(got), len(s), n)
		}
		if DecodeSettled(mark+1, meta) != nil {
			t.Fatalf("case %d: the map was read for another commit point", i)
		}
	}
}

// TestSettledCapacity: how many scattered in-flight offsets (every other
// offset settled) the map holds within Kafka's default 4 KiB.
func TestSettledCapacity(t *testing.T) {
	for _, step := range []int64{2, 3, 7} {
		var s Settled
		for o := int64(1); o < 200_000; o += step {
			s = s.Add(o, o+step-1)
		}
		meta := EncodeSettled(0, s)
		got := DecodeSettled(0, meta)
		t.Logf("pattern 1 in %d not settled: %d of %d ranges in %d bytes (up to offset %d)", step, len(got), len(s), len(meta), got[len(got)-1].Hi)
		if len(got) < 1000 {
			t.Errorf("only %d ranges fit", len(got))
		}
	}
}

func TestSettledNotOurs(t *testing.T) {
	for _, meta := range []string{"", "hello", "sluice:s1:", "sluice:s1:!!", "sluice:s1:AA", "sluice:s1:Ag",
		SettledMetaPrefix + strings.Repeat("A", MaxSettledMeta+1), "sluice-settled:", "sluice-settled:1,x", "sluice-settled:0"} {
		if got := DecodeSettled(5, meta); got != nil {
			t.Errorf("%q decoded to %v", meta, got)
		}
	}
	// The replay LetterSource's earlier map is still read.
	if got := DecodeSettled(10, "sluice-settled:2,1,5"); !slices.Equal(got, Settled{{12, 14}, {18, 19}}) {
		t.Fatalf("legacy map: %v", got)
	}
}

func FuzzDecodeSettled(f *testing.F) {
	f.Add(int64(7), EncodeSettled(7, Settled{{9, 12}, {20, 21}}))
	f.Add(int64(0), EncodeSettled(0, randomSettled(rand.New(rand.NewPCG(3, 4)), 0, 500)))
	f.Add(int64(10), "sluice-settled:2,1,5")
	f.Fuzz(func(t *testing.T, mark int64, meta string) {
		s := DecodeSettled(mark, meta)
		for i, r := range s {
			if r.Lo <= mark || r.Hi <= r.Lo || i > 0 && r.Lo <= s[i-1].Hi && !strings.HasPrefix(meta, LegacySettledPrefix) {
				t.Fatalf("mark %d: bad range %d %v in %v", mark, i, r, s)
			}
		}
		if len(s) > 0 && !strings.HasPrefix(meta, LegacySettledPrefix) {
			again := DecodeSettled(mark, EncodeSettled(mark, s))
			if len(again) == 0 || !slices.Equal(again, s[:len(again)]) {
				t.Fatalf("re-encoded %v decodes to %v", s, again)
			}
		}
	})
}

// TestWatermarkMapRestore: what one owner settled above its commit point
// is what the next owner skips, no more, no less; the map follows the
// commit point as it moves.
func TestWatermarkMapRestore(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for round := range 200 {
		w := NewWatermark()
		start := int64(rng.IntN(1000))
		w.Begin(start)
		w.Committed(start)
		var offs []int64
		for o := start; len(offs) < 50+rng.IntN(500); o += 1 + int64(rng.IntN(3)) {
			offs = append(offs, o)
			w.Deliver(o)
		}
		settled := map[int64]bool{}
		for _, o := range offs {
			if rng.IntN(4) != 0 {
				w.Settle(o)
				settled[o] = true
			}
		}
		point, meta, ok := w.CommitMetadata()
		if !ok {
			t.Fatalf("round %d: nothing to commit", round)
		}
		w.CommittedMetadata(point, meta)
		if _, _, again := w.CommitMetadata(); again {
			t.Fatalf("round %d: the same commit offered twice", round)
		}
		next := NewWatermark()
		next.Restore(point, meta)
		for _, o := range offs {
			want := settled[o] && o >= point
			if got := next.Skip(o); got != want {
				t.Fatalf("round %d: offset %d (point %d, settled %v): skip %v", round, o, point, settled[o], got)
			}
		}
		// The next owner delivers what it does not skip, settles it all:
		// its commit point passes the restored offsets too.
		next.Begin(point)
		next.Committed(point)
		last := point
		for _, o := range offs {
			if o >= point && !next.Skip(o) {
				next.Deliver(o)
				next.Settle(o)
				last = o
			}
		}
		p2, meta2, _ := next.CommitMetadata()
		if want := offs[len(offs)-1] + 1; p2 != want && !(p2 == last+1 && last == offs[len(offs)-1]) {
			t.Fatalf("round %d: commit point %d after everything settled, want %d (meta %q)", round, p2, want, meta2)
		}
		if meta2 != "" {
			t.Fatalf("round %d: nothing above the point, map %q", round, meta2)
		}
	}
}

// TestWatermarkMapStuckOffset: one stuck offset holds the commit point
// while 10,000 later ones settle: the map lists them all (one range), and
// it changes (a commit is due) while the point stays.
func TestWatermarkMapStuckOffset(t *testing.T) {
	w := NewWatermark()
	for o := range int64(10_001) {
		w.Deliver(o)
	}
	for o := int64(1); o <= 10_000; o++ {
		w.Settle(o)
		if o == 5000 {
			p, meta, ok := w.CommitMetadata()
			if !ok || p != 0 {
				t.Fatalf("point %d ok %v", p, ok)
			}
			w.CommittedMetadata(p, meta)
		}
	}
	p, meta, ok := w.CommitMetadata()
	if !ok || p != 0 {
		t.Fatalf("the map changed but no commit is due: point %d ok %v", p, ok)
	}
	if got := DecodeSettled(0, meta); !slices.Equal(got, Settled{{1, 10_001}}) || len(meta) > 40 {
		t.Fatalf("map %q = %v", meta, got)
	}
	t.Logf("10,000 settled behind a stuck offset: %d bytes of metadata (%s)", len(meta), strconv.Quote(meta))
}

// BenchmarkEncodeSettled is the cost a commit pays per partition for its
// map: 300 scattered in-flight offsets (fits whole) and 5,000 (cut to fit).
func BenchmarkEncodeSettled(b *testing.B) {
	for _, n := range []int{300, 5000} {
		s := randomSettled(rand.New(rand.NewPCG(7, 8)), 1000, n)
		b.Run(strconv.Itoa(n), func(b *testing.B) {
			var meta string
			for b.Loop() {
				meta = EncodeSettled(1000, s)
			}
			b.ReportMetric(float64(len(meta)), "bytes")
			b.ReportMetric(float64(len(DecodeSettled(1000, meta))), "ranges")
		})
	}
}
