package kafkacore

import (
	"slices"
	"strings"
)

// HeaderOrder carries the wire order of a record's headers through sluice's
// map-shaped headers (consumer.Headers, dlq.Letter.Headers): one value per
// header on the wire, naming its key, in order. HeaderMap adds it only when
// the order is not already sorted by key, and WireHeaders puts the headers
// back in that order and drops it, so a record keeps its header order and
// duplicates end to end.
const HeaderOrder = "Sluice-Kafka-Header-Order"

// HeaderOriginPartitions is the Kafka adapters' addition to a dead letter's
// envelope: how many partitions the origin topic had when the letter was
// written. A replay target sends a replayed message back to its original
// partition only while the topic still has that many.
const HeaderOriginPartitions = "Sluice-Dlq-Origin-Partitions"

// MetaPrefix starts the names of what the Kafka adapters carry in header
// maps for themselves (HeaderOrder, the origin's partition count on a
// letter read back); nothing they write to a broker keeps them, and
// HeaderMap never takes them from the wire.
const MetaPrefix = "Sluice-Kafka-"

// MetaOriginPartitions holds HeaderOriginPartitions in a letter's headers
// once dlq.Decode has removed the envelope.
const MetaOriginPartitions = MetaPrefix + "Origin-Partitions"

// Header is the shape of a wire header in kafka-go (kafka.Header) and
// franz-go (kgo.RecordHeader): HeaderMap and WireHeaders take either.
type Header interface {
	~struct {
		Key   string
		Value []byte
	}
}

type header = struct {
	Key   string
	Value []byte
}

// HeaderMap converts wire headers to a map, adding HeaderOrder when their
// order is not sorted by key. Keys drop reports (nil: none) are left out,
// and keys unordered reports are kept but left out of the order (a letter's
// envelope). Headers named with MetaPrefix are never taken from the wire.
// It returns the map (nil when empty) and the bytes of the kept headers.
func HeaderMap[H Header](hs []H, drop, unordered func(string) bool) (map[string][]string, int64) {
	if len(hs) == 0 {
		return nil, 0
	}
	skip := func(k string) bool { return strings.HasPrefix(k, MetaPrefix) || (drop != nil && drop(k)) }
	inOrder := func(k string) bool { return unordered == nil || !unordered(k) }
	h := make(map[string][]string, len(hs))
	var size int64
	sorted := true
	last, n := "", 0
	for _, wh := range hs {
		kh := header(wh)
		if skip(kh.Key) {
			continue
		}
		h[kh.Key] = append(h[kh.Key], string(kh.Value))
		size += int64(len(kh.Key) + len(kh.Value))
		if !inOrder(kh.Key) {
			continue
		}
		if n > 0 && kh.Key < last {
			sorted = false
		}
		last = kh.Key
		n++
	}
	if len(h) == 0 {
		return nil, 0
	}
	if !sorted {
		order := make([]string, 0, n)
		for _, wh := range hs {
			if k := header(wh).Key; !skip(k) && inOrder(k) {
				order = append(order, k)
			}
		}
		h[HeaderOrder] = order
	}
	return h, size
}

// WireHeaders converts a header map back to wire headers, appended to out:
// first in the order HeaderOrder names (each entry takes its key's next
// value; entries whose key is gone or used up are passed over), then
// whatever the order does not cover, by key. Keys with skipPrefix and
// HeaderOrder itself are left out, and so is every other key with
// MetaPrefix. The order is only a permutation of the map's own values, so
// a forged HeaderOrder can change nothing but the order.
func WireHeaders[H Header](h map[string][]string, skipPrefix string, out []H) []H {
	skip := func(k string) bool {
		return strings.HasPrefix(k, MetaPrefix) || (skipPrefix != "" && strings.HasPrefix(k, skipPrefix))
	}
	var used map[string]int
	if order := h[HeaderOrder]; len(order) > 0 {
		used = make(map[string]int, len(h))
		for _, k := range order {
			vs := h[k]
			if skip(k) || used[k] >= len(vs) {
				continue
			}
			out = append(out, H(header{Key: k, Value: []byte(vs[used[k]])}))
			used[k]++
		}
	}
	keys := make([]string, 0, len(h))
	for k, vs := range h {
		if !skip(k) && used[k] < len(vs) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range h[k][used[k]:] {
			out = append(out, H(header{Key: k, Value: []byte(v)}))
		}
	}
	return out
}
