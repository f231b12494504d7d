package kafkaadapter

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
// Format: settledMetaPrefix, then base64 (URL alphabet, no padding) of one
// flag byte (0: raw, 1: DEFLATE) and the body: the uvarint commit point,
// then for each range of settled offsets the uvarint gap from the end of
// the previous one (from the commit point + 1 for the first) and its uvarint
// length. The writer keeps the shorter of raw and DEFLATE, and as many
// ranges (in offset order) as fit in maxSettledMeta bytes; what does not
// fit is redone (at-least-once), at worst all of it: the plain watermark.
// The reader takes the map only when it names the committed offset; any
// other metadata (another client's, an older sluice's, junk) is a plain
// watermark.
const settledMetaPrefix = "sluice:s1:"

// legacySettledPrefix is the map written by the replay LetterSource before
// settledMetaPrefix: decimal offset deltas, comma separated. It is still
// read.
const legacySettledPrefix = "sluice-settled:"

// maxSettledMeta keeps the metadata under Kafka's default
// offset.metadata.max.bytes (4096).
const maxSettledMeta = 4000

// maxSettledBody bounds the inflated body a reader accepts (what a writer
// can fit in maxSettledMeta deflates to far less).
const maxSettledBody = 1 << 20

// offRange is the offsets [lo, hi).
type offRange struct{ lo, hi int64 }

// settledSet is a sorted set of disjoint, non-adjacent offset ranges.
type settledSet []offRange

// has reports whether o is in s.
func (s settledSet) has(o int64) bool {
	i, found := slices.BinarySearchFunc(s, o, func(r offRange, o int64) int {
		switch {
		case r.hi <= o:
			return -1
		case r.lo > o:
			return 1
		}
		return 0
	})
	return found && i < len(s)
}

// from returns the part of s at or above o.
func (s settledSet) from(o int64) settledSet {
	i, _ := slices.BinarySearchFunc(s, o, func(r offRange, o int64) int {
		if r.hi <= o {
			return -1
		}
		return 1
	})
	out := slices.Clone(s[i:])
	if len(out) > 0 && out[0].lo < o {
		out[0].lo = o
	}
	return out
}

// add appends [lo, hi) to s, which must end at or below lo, merging
// adjacent ranges.
func (s settledSet) add(lo, hi int64) settledSet {
	if hi <= lo {
		return s
	}
	if n := len(s); n > 0 && s[n-1].hi >= lo {
		s[n-1].hi = max(s[n-1].hi, hi)
		return s
	}
	return append(s, offRange{lo, hi})
}

// union returns the union of a and b.
func union(a, b settledSet) settledSet {
	all := append(slices.Clone(a), b...)
	slices.SortFunc(all, func(x, y offRange) int {
		switch {
		case x.lo < y.lo:
			return -1
		case x.lo > y.lo:
			return 1
		}
		return 0
	})
	var out settledSet
	for _, r := range all {
		if n := len(out); n > 0 && out[n-1].hi >= r.lo {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

// rangesOf turns sorted, distinct offsets into a set.
func rangesOf(offs []int64) settledSet {
	var s settledSet
	for _, o := range offs {
		s = s.add(o, o+1)
	}
	return s
}

// encodeSettled writes the metadata for a commit at mark with the settled
// ranges s (all above mark): "" when s is empty or not even its first
// range fits. When s does not fit whole it keeps a prefix that fits, within
// 2% of the longest, sized from the sizes seen (a few compressions at
// most: it runs on every commit).
func encodeSettled(mark int64, s settledSet) string {
	if len(s) == 0 {
		return ""
	}
	body := make([]byte, 1, 1+binary.MaxVarintLen64*(1+2*len(s)))
	body = binary.AppendUvarint(body, uint64(mark))
	ends := make([]int, len(s)) // body length after each range
	cur := mark + 1
	for i, r := range s {
		body = binary.AppendUvarint(body, uint64(r.lo-cur))
		body = binary.AppendUvarint(body, uint64(r.hi-r.lo))
		cur = r.hi
		ends[i] = len(body)
	}
	room := float64(maxSettledMeta - len(settledMetaPrefix))
	best := ""
	lo, hi := 0, len(s)+1 // s[:lo] fits (best), s[:hi] does not
	for n, tries := len(s), 0; n > lo && n < hi && tries < 8; tries++ {
		meta := packSettled(body[:ends[n-1]])
		if len(meta) <= maxSettledMeta {
			lo, best = n, meta
		} else {
			hi = n
		}
		if hi-lo <= max(1, hi/50) {
			break
		}
		// The share that should just fit, by this size (compression keeps
		// sizes about proportional), inside the bracket.
		n = int(float64(n) * 0.99 * room / float64(len(meta)-len(settledMetaPrefix)))
		n = min(max(n, lo+1), hi-1)
	}
	return best
}

// packSettled writes body (its first byte free for the flag) raw when that
// fits, else DEFLATE-compressed when that is shorter.
func packSettled(body []byte) string {
	body[0] = 0
	if len(settledMetaPrefix)+base64.RawURLEncoding.EncodedLen(len(body)) > maxSettledMeta {
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
	return settledMetaPrefix + base64.RawURLEncoding.EncodeToString(body)
}

// deflaters keeps flate.Writers (each holds several hundred KiB of tables).
var deflaters = sync.Pool{New: func() any {
	w, _ := flate.NewWriter(nil, flate.BestCompression)
	return w
}}

// decodeSettled reads the settled map of a commit at mark from its
// metadata; nil for a plain watermark (no map, another writer's metadata,
// a map for another offset, junk).
func decodeSettled(mark int64, meta string) settledSet {
	if rest, ok := strings.CutPrefix(meta, legacySettledPrefix); ok {
		return decodeLegacySettled(mark, rest)
	}
	rest, ok := strings.CutPrefix(meta, settledMetaPrefix)
	if !ok || len(rest) > maxSettledMeta {
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
	var s settledSet
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
		s = append(s, offRange{lo, lo + int64(length)})
		cur = lo + int64(length)
	}
	return s
}

func decodeLegacySettled(mark int64, rest string) settledSet {
	if rest == "" {
		return nil
	}
	var offs []int64
	prev := mark
	for _, f := range strings.Split(rest, ",") {
		d, err := strconv.ParseInt(f, 10, 64)
		if err != nil || d <= 0 || len(offs) > maxSettledMeta || prev > 1<<62-d {
			return nil
		}
		prev += d
		offs = append(offs, prev)
	}
	return rangesOf(offs)
}
