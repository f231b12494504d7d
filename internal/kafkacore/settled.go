package kafkacore

import (
	"bytes"
	"compress/flate"
	"encoding/base64"
	"encoding/binary"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// The settled map: which offsets above a partition's commit point are
// already settled, carried in the commit's metadata so that the next owner
// (this process after a restart, another member after a rebalance, the next
// replay pass) skips them instead of doing them again. A commit point is
// the first offset not settled; everything handed out after it and settled
// would otherwise be redone.
//
// Format: SettledMetaPrefix, then base64 (URL alphabet, no padding) of one
// flag byte (0: raw, 1: DEFLATE) and the body: the uvarint commit point,
// then for each range of settled offsets the uvarint gap from the end of
// the previous one (from the commit point + 1 for the first) and its uvarint
// length. The writer keeps the shorter of raw and DEFLATE, and as many
// ranges (in offset order) as fit in MaxSettledMeta bytes; what does not
// fit is redone (at-least-once), at worst all of it: the plain watermark.
// The reader takes the map only when it names the committed offset; any
// other metadata (another client's, an older sluice's, junk) is a plain
// watermark.
const SettledMetaPrefix = "sluice:s1:"

// LegacySettledPrefix is the map written by the replay LetterSource before
// SettledMetaPrefix: decimal offset deltas, comma separated. It is still
// read.
const LegacySettledPrefix = "sluice-settled:"

// MaxSettledMeta keeps the metadata under Kafka's default
// offset.metadata.max.bytes (4096).
const MaxSettledMeta = 4000

// maxSettledBody bounds the inflated body a reader accepts (what a writer
// can fit in MaxSettledMeta deflates to far less).
const maxSettledBody = 1 << 20

// Range is the offsets [lo, hi).
type Range struct{ Lo, Hi int64 }

// Settled is a sorted set of disjoint, non-adjacent offset ranges.
type Settled []Range

// Has reports whether o is in s.
func (s Settled) Has(o int64) bool {
	i, found := slices.BinarySearchFunc(s, o, func(r Range, o int64) int {
		switch {
		case r.Hi <= o:
			return -1
		case r.Lo > o:
			return 1
		}
		return 0
	})
	return found && i < len(s)
}

// From returns the part of s at or above o.
func (s Settled) From(o int64) Settled {
	i, _ := slices.BinarySearchFunc(s, o, func(r Range, o int64) int {
		if r.Hi <= o {
			return -1
		}
		return 1
	})
	out := slices.Clone(s[i:])
	if len(out) > 0 && out[0].Lo < o {
		out[0].Lo = o
	}
	return out
}

// Add appends [lo, hi) to s, which must end at or below lo, merging
// adjacent ranges.
func (s Settled) Add(lo, hi int64) Settled {
	if hi <= lo {
		return s
	}
	if n := len(s); n > 0 && s[n-1].Hi >= lo {
		s[n-1].Hi = max(s[n-1].Hi, hi)
		return s
	}
	return append(s, Range{lo, hi})
}

// Union returns the union of a and b.
func Union(a, b Settled) Settled {
	all := append(slices.Clone(a), b...)
	slices.SortFunc(all, func(x, y Range) int {
		switch {
		case x.Lo < y.Lo:
			return -1
		case x.Lo > y.Lo:
			return 1
		}
		return 0
	})
	var out Settled
	for _, r := range all {
		if n := len(out); n > 0 && out[n-1].Hi >= r.Lo {
			out[n-1].Hi = max(out[n-1].Hi, r.Hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

// RangesOf turns sorted, distinct offsets into a set.
func RangesOf(offs []int64) Settled {
	var s Settled
	for _, o := range offs {
		s = s.Add(o, o+1)
	}
	return s
}

// EncodeSettled writes the metadata for a commit at mark with the settled
// ranges s (all above mark): "" when s is empty or not even its first
// range fits. When s does not fit whole it keeps a prefix that fits, within
// 2% of the longest, sized from the sizes seen (a few compressions at
// most: it runs on every commit).
func EncodeSettled(mark int64, s Settled) string {
	if len(s) == 0 {
		return ""
	}
	body := make([]byte, 1, 1+binary.MaxVarintLen64*(1+2*len(s)))
	body = binary.AppendUvarint(body, uint64(mark))
	ends := make([]int, len(s)) // body length after each range
	cur := mark + 1
	for i, r := range s {
		body = binary.AppendUvarint(body, uint64(r.Lo-cur))
		body = binary.AppendUvarint(body, uint64(r.Hi-r.Lo))
		cur = r.Hi
		ends[i] = len(body)
	}
	room := float64(MaxSettledMeta - len(SettledMetaPrefix))
	best := ""
	lo, hi := 0, len(s)+1 // s[:lo] fits (best), s[:hi] does not
	for n, tries := len(s), 0; n > lo && n < hi && tries < 8; tries++ {
		meta := packSettled(body[:ends[n-1]])
		if len(meta) <= MaxSettledMeta {
			lo, best = n, meta
		} else {
			hi = n
		}
		if hi-lo <= max(1, hi/50) {
			break
		}
		// The share that should just fit, by this size (compression keeps
		// sizes about proportional), inside the bracket.
		n = int(float64(n) * 0.99 * room / float64(len(meta)-len(SettledMetaPrefix)))
		n = min(max(n, lo+1), hi-1)
	}
	return best
}

// packSettled writes body (its first byte free for the flag) raw when that
// fits, else DEFLATE-compressed when that is shorter.
func packSettled(body []byte) string {
	body[0] = 0
	if len(SettledMetaPrefix)+base64.RawURLEncoding.EncodedLen(len(body)) > MaxSettledMeta {
		z := bytes.NewBuffer(make([]byte, 0, len(body)))
		z.WriteByte(1)
		w := deflaters.Get().(*flate.Writer)
		w.Reset(z)
		_, _ = w.Write(body[1:])
		_ = w.Close()
		deflaters.Put(w)
		if z.Len() < len(body) {
			body = z.Bytes()
		}
	}
	return SettledMetaPrefix + base64.RawURLEncoding.EncodeToString(body)
}

// deflaters keeps flate.Writers (each holds several hundred KiB of tables).
var deflaters = sync.Pool{New: func() any {
	w, _ := flate.NewWriter(nil, flate.BestCompression)
	return w
}}

// DecodeSettled reads the settled map of a commit at mark from its
// metadata; nil for a plain watermark (no map, another writer's metadata,
// a map for another offset, junk).
func DecodeSettled(mark int64, meta string) Settled {
	if rest, ok := strings.CutPrefix(meta, LegacySettledPrefix); ok {
		return decodeLegacySettled(mark, rest)
	}
	rest, ok := strings.CutPrefix(meta, SettledMetaPrefix)
	if !ok || len(rest) > MaxSettledMeta {
		return nil
	}
	raw, err := base64.RawURLEncoding.DecodeString(rest)
	if err != nil || len(raw) == 0 {
		return nil
	}
	body := raw[1:]
	switch raw[0] {
	case 0:
	case 1:
		r := flate.NewReader(bytes.NewReader(body))
		body, err = io.ReadAll(io.LimitReader(r, maxSettledBody+1))
		if err != nil || len(body) > maxSettledBody {
			return nil
		}
	default:
		return nil
	}
	at, n := binary.Uvarint(body)
	if n <= 0 || at != uint64(mark) || mark < 0 {
		return nil
	}
	body = body[n:]
	var s Settled
	cur := mark + 1
	for len(body) > 0 {
		gap, n1 := binary.Uvarint(body)
		if n1 <= 0 {
			return nil
		}
		length, n2 := binary.Uvarint(body[n1:])
		if n2 <= 0 || length == 0 || gap > 1<<62 || length > 1<<62 || cur > 1<<62 {
			return nil
		}
		body = body[n1+n2:]
		lo := cur + int64(gap)
		if (len(s) > 0 && gap == 0) || lo > 1<<62 {
			return nil // adjacent ranges are one range: not written by us
		}
		s = append(s, Range{lo, lo + int64(length)})
		cur = lo + int64(length)
	}
	return s
}

func decodeLegacySettled(mark int64, rest string) Settled {
	if rest == "" {
		return nil
	}
	var offs []int64
	prev := mark
	for _, f := range strings.Split(rest, ",") {
		d, err := strconv.ParseInt(f, 10, 64)
		if err != nil || d <= 0 || len(offs) > MaxSettledMeta || prev > 1<<62-d {
			return nil
		}
		prev += d
		offs = append(offs, prev)
	}
	return RangesOf(offs)
}
