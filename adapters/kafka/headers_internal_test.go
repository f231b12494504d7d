package kafkaadapter

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/internal/kafkacore"
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

// A retry record's headers are untrusted: a far-future not-before is
// clamped to the route's longest delay (it held its whole partition back
// before), and an origin topic the Source does not read is ignored (it
// decided where dead letters and replays went).
func TestParseRetryUntrusted(t *testing.T) {
	now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	g := &generation{src: &feed{}}
	p := &partition{gen: g, Part: kafkacore.Part[*record]{Gen: &g.Gen}, topic: "orders-retry", id: 2, retry: true}
	mk := func(kv ...string) *record {
		return newRecord(p, 7, nil, []byte("v"), hdrs(kv...), now)
	}
	r := mk(HeaderNotBefore, "2100-01-01T00:00:00Z", HeaderOriginTopic, "payments", HeaderOriginPartition, "1", "App", "x")
	res := parseRetry(r, now, time.Time{}, time.Minute, []string{"orders"})
	if !res.clamped || !r.due.Equal(now.Add(time.Minute)) {
		t.Fatalf("not-before 2100: due %v, clamped %v; want now+1m", r.due, res.clamped)
	}
	// The clamp is anchored where the record was written (its timestamp,
	// or when the Source first read it), not at each re-read (issue 24.3).
	later := now.Add(10 * time.Minute)
	r = mk(HeaderNotBefore, "2100-01-01T00:00:00Z")
	if res := parseRetry(r, later, time.Time{}, time.Minute, nil); !res.clamped || !r.due.Equal(now.Add(time.Minute)) {
		t.Fatalf("re-read 10m after it was written: due %v, want its timestamp + 1m", r.due)
	}
	r = newRecord(p, 7, nil, nil, hdrs(HeaderNotBefore, "2100-01-01T00:00:00Z"), time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)) // a forged timestamp too
	if res := parseRetry(r, later.Add(5*time.Minute), later, time.Minute, nil); !res.clamped || !r.due.Equal(later.Add(time.Minute)) {
		t.Fatalf("first seen at %v: due %v, want first seen + 1m", later, r.due)
	}
	r = mk(HeaderNotBefore, "2100-01-01T00:00:00Z", HeaderOriginTopic, "payments", HeaderOriginPartition, "1", "App", "x")
	res = parseRetry(r, now, time.Time{}, time.Minute, []string{"orders"})
	if !res.refused || r.origin.Topic != "orders-retry" || r.origin.Partition != 2 || r.origin.Offset != 7 {
		t.Fatalf("origin %+v (refused %v): a foreign origin topic must be ignored", r.origin, res.refused)
	}
	if len(r.headers) != 1 || r.headers["App"][0] != "x" {
		t.Fatalf("headers after parse: %v", r.headers)
	}
	r = mk(HeaderNotBefore, now.Add(30*time.Second).Format(time.RFC3339Nano), HeaderOriginTopic, "orders",
		HeaderOriginPartition, "3", HeaderOriginOffset, "99", HeaderAttempt, "4")
	res = parseRetry(r, now, time.Time{}, time.Minute, []string{"orders"})
	if res.clamped || res.refused || !r.due.Equal(now.Add(30*time.Second)) || r.attempt != 4 ||
		r.origin.Topic != "orders" || r.origin.Partition != 3 || r.origin.Offset != 99 || r.headers != nil {
		t.Fatalf("a proper retry record: %+v due %v attempt %d headers %v (%+v)", r.origin, r.due, r.attempt, r.headers, res)
	}
}

// kafka-go's Murmur2Balancer, which the writers use, puts a key where the
// core's KeyPartition (the Java client's partitioner) does.
func TestMurmur2MatchesCore(t *testing.T) {
	parts := []int{0, 1, 2, 3, 4, 5, 6}
	for i := range 500 {
		key := []byte(fmt.Sprintf("key-%d", i*7919))
		got := (&kafka.Murmur2Balancer{}).Balance(kafka.Message{Key: key}, parts...)
		if want := kafkacore.KeyPartition(key, len(parts)); got != want {
			t.Fatalf("%q: kafka-go %d, core %d", key, got, want)
		}
	}
}
