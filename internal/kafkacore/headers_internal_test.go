package kafkacore

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/dlq"
)

// wh is a client's header type (kafka-go's and franz-go's have this shape).
type wh struct {
	Key   string
	Value []byte
}

func hdrs(kv ...string) []wh {
	var out []wh
	for i := 0; i < len(kv); i += 2 {
		out = append(out, wh{Key: kv[i], Value: []byte(kv[i+1])})
	}
	return out
}

func sameHeaders(a, b []wh) bool {
	return slices.EqualFunc(a, b, func(x, y wh) bool { return x.Key == y.Key && string(x.Value) == string(y.Value) })
}

// Headers survive the map in their wire order, interleaved duplicates
// included; sorted headers need no HeaderOrder.
func TestHeaderOrderRoundTrip(t *testing.T) {
	for _, in := range [][]wh{
		hdrs("b", "1", "a", "2", "b", "3", "trace", "x", "a", "4"),
		hdrs("a", "1", "a", "2", "b", "3"),
		hdrs("z", ""),
		hdrs("Sluice-Deadline", "t", "App", "v"),
	} {
		h, _ := HeaderMap(in, nil, nil)
		if got := WireHeaders(h, "", []wh(nil)); !sameHeaders(got, in) {
			t.Errorf("round trip of %v gave %v", in, got)
		}
		sorted := slices.IsSortedFunc(in, func(x, y wh) int { return strings.Compare(x.Key, y.Key) })
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
		HeaderOrder:          {"b", "ghost", "a", "b", "b", HeaderOrder, MetaOriginPartitions},
		MetaOriginPartitions: {"4"},
	}
	got := WireHeaders(h, "", []wh(nil))
	if want := hdrs("b", "3", "a", "1", "a", "2"); !sameHeaders(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	m, _ := HeaderMap(hdrs(HeaderOrder, "a", MetaOriginPartitions, "9", "x", "1"), nil, nil)
	if len(m) != 1 || m["x"][0] != "1" {
		t.Fatalf("metadata taken from the wire: %v", m)
	}
}

// A retry copy written with RetryHeaders reads back with ParseRetry as the
// next attempt of the same message, its headers in their order.
func TestRetryRoundTrip(t *testing.T) {
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	in := hdrs("b", "1", "a", "2", RetryHeaderPrefix+"Stale", "x")
	h, _ := HeaderMap(in, nil, nil)
	orig := Retry{Headers: h, Time: now.Add(-time.Hour), Attempt: 2,
		Origin: dlq.Origin{Topic: "orders", Partition: 3, Offset: 41}}
	wire := RetryHeaders(&orig, now, now.Add(30*time.Second), []wh(nil))
	back, _ := HeaderMap(wire, nil, IsRetryHeader)
	r := Retry{Headers: back, Time: now, Attempt: 1, Origin: dlq.Origin{Topic: "orders-retry", Partition: 0, Offset: 7}}
	res := ParseRetry(&r, now, time.Time{}, time.Minute, []string{"orders"})
	if res.Clamped || res.Refused || !r.Due.Equal(now.Add(30*time.Second)) || r.Attempt != 3 ||
		!r.FirstFailure.Equal(now) || !r.Time.Equal(now.Add(-time.Hour)) || r.Origin != orig.Origin {
		t.Fatalf("read back %+v (%+v)", r, res)
	}
	if got := WireHeaders(r.Headers, "", []wh(nil)); !sameHeaders(got, hdrs("b", "1", "a", "2")) {
		t.Fatalf("headers after the round trip: %v", got)
	}
}

// A retry record's headers are untrusted: a far-future not-before is
// clamped to the route's longest delay, anchored where the record was
// written, and an origin topic the Source does not read is ignored.
func TestParseRetryUntrusted(t *testing.T) {
	now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	mk := func(ts time.Time, kv ...string) *Retry {
		h, _ := HeaderMap(hdrs(kv...), nil, IsRetryHeader)
		return &Retry{Headers: h, Time: ts, Attempt: 1, Origin: dlq.Origin{Topic: "orders-retry", Partition: 2, Offset: 7}}
	}
	r := mk(now, HeaderNotBefore, "2100-01-01T00:00:00Z", HeaderOriginTopic, "payments", HeaderOriginPartition, "1", "App", "x")
	res := ParseRetry(r, now, time.Time{}, time.Minute, []string{"orders"})
	if !res.Clamped || !r.Due.Equal(now.Add(time.Minute)) {
		t.Fatalf("not-before 2100: due %v, clamped %v; want now+1m", r.Due, res.Clamped)
	}
	if !res.Refused || r.Origin.Topic != "orders-retry" || r.Origin.Partition != 2 || r.Origin.Offset != 7 {
		t.Fatalf("origin %+v (refused %v): a foreign origin topic must be ignored", r.Origin, res.Refused)
	}
	later := now.Add(10 * time.Minute)
	r = mk(now, HeaderNotBefore, "2100-01-01T00:00:00Z")
	if res := ParseRetry(r, later, time.Time{}, time.Minute, nil); !res.Clamped || !r.Due.Equal(now.Add(time.Minute)) {
		t.Fatalf("re-read 10m after it was written: due %v, want its timestamp + 1m", r.Due)
	}
	r = mk(time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC), HeaderNotBefore, "2100-01-01T00:00:00Z")
	if res := ParseRetry(r, later.Add(5*time.Minute), later, time.Minute, nil); !res.Clamped || !r.Due.Equal(later.Add(time.Minute)) {
		t.Fatalf("first seen at %v: due %v, want first seen + 1m", later, r.Due)
	}
}
