package kafkaadapter

import (
	"slices"
	"strings"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"
)

// HeaderOrder carries the wire order of a record's headers through sluice's
// map-shaped headers (consumer.Headers, dlq.Letter.Headers): one value per
// header on the wire, naming its key, in order. The Source adds it only
// when the order is not already sorted by key, and everything this package
// writes (dead letters, retry copies, replays) puts the headers back in
// that order and drops HeaderOrder, so a record keeps its header order and
// duplicates end to end. Handlers may see it; they can ignore it.
const HeaderOrder = "Sluice-Kafka-Header-Order"

// HeaderOriginPartitions is this package's addition to a dead letter's
// envelope: how many partitions the origin topic had when the letter was
// written. A ReplayTarget sends a replayed message back to its original
// partition only while the topic still has that many.
const HeaderOriginPartitions = "Sluice-Dlq-Origin-Partitions"

// kafkaMetaPrefix starts the names of what this package carries in header
// maps for itself (HeaderOrder, the origin's partition count on a letter
// read back); nothing it writes to a broker keeps them.
const kafkaMetaPrefix = "Sluice-Kafka-"

// metaOriginPartitions holds HeaderOriginPartitions in a letter's headers
// once dlq.Decode has removed the envelope.
const metaOriginPartitions = kafkaMetaPrefix + "Origin-Partitions"

// headerMap converts wire headers to a map, adding HeaderOrder when their
// order is not sorted by key. Keys drop reports (nil: none) are left out,
// and keys unordered reports are kept but left out of the order (a letter's
// envelope). Headers named with kafkaMetaPrefix are never taken from the
// wire. It returns the map (nil when empty) and the bytes of the kept
// headers.
func headerMap(hs []protocol.Header, drop, unordered func(string) bool) (map[string][]string, int64) {
	if len(hs) == 0 {
		return nil, 0
	}
	skip := func(k string) bool { return strings.HasPrefix(k, kafkaMetaPrefix) || (drop != nil && drop(k)) }
	inOrder := func(k string) bool { return unordered == nil || !unordered(k) }
	h := make(map[string][]string, len(hs))
	var size int64
	sorted := true
	last, n := "", 0
	for _, kh := range hs {
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
		for _, kh := range hs {
			if !skip(kh.Key) && inOrder(kh.Key) {
				order = append(order, kh.Key)
			}
		}
		h[HeaderOrder] = order
	}
	return h, size
}

// wireHeaders converts a header map back to wire headers: first in the
// order HeaderOrder names (each entry takes its key's next value; entries
// whose key is gone or used up are passed over), then whatever the order
// does not cover, by key. Keys with skipPrefix and HeaderOrder itself are
// left out, and so is every other key with kafkaMetaPrefix. The order is only a permutation of the map's own values, so a
// forged HeaderOrder can change nothing but the order.
func wireHeaders(h map[string][]string, skipPrefix string, out []kafka.Header) []kafka.Header {
	skip := func(k string) bool {
		return strings.HasPrefix(k, kafkaMetaPrefix) || (skipPrefix != "" && strings.HasPrefix(k, skipPrefix))
	}
	var used map[string]int
	if order := h[HeaderOrder]; len(order) > 0 {
		used = make(map[string]int, len(h))
		for _, k := range order {
			vs := h[k]
			if skip(k) || used[k] >= len(vs) {
				continue
			}
			out = append(out, kafka.Header{Key: k, Value: []byte(vs[used[k]])})
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
			out = append(out, kafka.Header{Key: k, Value: []byte(v)})
		}
	}
	return out
}
