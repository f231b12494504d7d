package kafkacore

import (
	"slices"
	"strings"

	"github.com/sluice-go/sluice/dlq"
)

// DeadLetterMaxBytes is the most a dead letter takes on the wire (headers,
// key and value), below the 1 MiB a topic accepts by default
// (max.message.bytes) less the batch overhead. A larger letter is fitted
// by dlq.Letter.Encode: original headers packed into the value, or cut
// with a Sluice-Dlq-Truncated marker.
const DeadLetterMaxBytes = 1_000_000

// HeaderSize is the size of h in a Kafka record: per header a varint
// length and the key, a varint length and the value (dlq.Limits.HeaderSize).
func HeaderSize(h map[string][]string) int {
	n := 0
	for k, vs := range h {
		for _, v := range vs {
			n += varintSize(len(k)) + len(k) + varintSize(len(v)) + len(v)
		}
	}
	return n
}

// varintSize is the length of Kafka's zigzag varint encoding of x >= 0.
func varintSize(x int) int {
	n := 1
	for u := uint64(x) << 1; u >= 0x80; u >>= 7 {
		n++
	}
	return n
}

// LetterHeaders orders a letter's headers for the wire (env is what
// dlq.Letter.Encode returned), appended to out: the original headers
// first, in their original order (HeaderOrder), then the envelope by name.
func LetterHeaders[H Header](env map[string][]string, out []H) []H {
	out = WireHeaders(env, dlq.HeaderPrefix, out)
	var keys []string
	for k := range env {
		if strings.HasPrefix(k, dlq.HeaderPrefix) {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		for _, v := range env[k] {
			out = append(out, H(header{Key: k, Value: []byte(v)}))
		}
	}
	return out
}

// IsEnvelope reports whether k is a dead letter's envelope header.
func IsEnvelope(k string) bool { return strings.HasPrefix(k, dlq.HeaderPrefix) }
