package kafkaadapter

import (
	"slices"
	"testing"

	"github.com/segmentio/kafka-go"
)

func hdrs(kv ...string) []kafka.Header {
	var out []kafka.Header
	for i := 0; i < len(kv); i += 2 {
		out = append(out, kafka.Header{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return out
}

func sameHeaders(a, b []kafka.Header) bool {
	return slices.EqualFunc(a, b, func(x, y kafka.Header) bool { return x.Key == y.Key && string(x.Value) == string(y.Value) })
}

// Headers survive the map in their wire order, interleaved duplicates
// included; sorted headers need no HeaderOrder.
func TestHeaderOrderRoundTrip(t *testing.T) {
	for _, in := range [][]kafka.Header{
		hdrs("b", "1", "a", "2", "b", "3", "trace", "x", "a", "4"),
		hdrs("a", "1", "a", "2", "b", "3"),
		hdrs("z", ""),
		hdrs("Sluice-Deadline", "t", "App", "v"),
	} {
		h, _ := headerMap(in, nil, nil)
		if got := wireHeaders(h, "", nil); !sameHeaders(got, in) {
			t.Errorf("round trip of %v gave %v", in, got)
		}
		sorted := slices.IsSortedFunc(in, func(x, y kafka.Header) int {
			if x.Key < y.Key {
				return -1
			}
			if x.Key > y.Key {
				return 1
			}
			return 0
		})
		if _, has := h[HeaderOrder]; has == sorted {
			t.Errorf("%v: HeaderOrder present %v, sorted %v", in, has, sorted)
		}
	}
}

// A forged or stale HeaderOrder only reorders the map's own values: nothing
// is invented, nothing lost, and metadata headers never reach the wire.
func TestHeaderOrderForged(t *testing.T) {
	h := map[string][]string{
		"a": {"1", "2"}, "b": {"3"},
		HeaderOrder:          {"b", "ghost", "a", "b", "b", HeaderOrder, metaOriginPartitions},
		metaOriginPartitions: {"4"},
	}
	got := wireHeaders(h, "", nil)
	want := hdrs("b", "3", "a", "1", "a", "2")
	if !sameHeaders(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	// Wire headers named like the metadata are not trusted.
	m, _ := headerMap(hdrs(HeaderOrder, "a", metaOriginPartitions, "9", "x", "1"), nil, nil)
	if len(m) != 1 || m["x"][0] != "1" {
		t.Fatalf("metadata taken from the wire: %v", m)
	}
}
