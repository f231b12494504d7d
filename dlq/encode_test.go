package dlq

import (
	"bytes"
	"maps"
	"slices"
	"strings"
	"testing"
)

// natsLimits are JetStream's: 65,535 bytes of headers, 1 MiB in all.
var natsLimits = Limits{MaxHeaderBytes: 65535, MaxBytes: 1 << 20}

func bigHeaders(n, size int) map[string][]string {
	h := map[string][]string{}
	for i := range n {
		h["X-"+strings.Repeat("k", 3)+string(rune('a'+i%26))+strings.Repeat("0", i/26)] = []string{strings.Repeat("v", size)}
	}
	return h
}

// TestEncodeSmallLetterUnchanged: what fits is stored as EnvelopeHeaders
// says, headers in headers.
func TestEncodeSmallLetterUnchanged(t *testing.T) {
	l := &Letter{Value: []byte("v"), Key: []byte("k"), Class: ClassPermanent, Headers: map[string][]string{"App": {"1"}}}
	k, v, h := l.Encode(natsLimits)
	if string(k) != "k" || string(v) != "v" || !maps.EqualFunc(h, l.EnvelopeHeaders(), slices.Equal) {
		t.Fatalf("%q %q %v", k, v, h)
	}
}

// TestEncodeHeadersJustUnderLimit (issue 13.5): a message whose headers
// are just under JetStream's header limit fit its origin; with the
// envelope they would not. Its headers move into the value, whole, and
// Decode gives the original message back.
func TestEncodeHeadersJustUnderLimit(t *testing.T) {
	orig := map[string][]string{"X-Big": {strings.Repeat("h", 65535-len("NATS/1.0\r\n\r\n")-len("X-Big: \r\n")-100)}, "App": {"a", "b"}}
	if NATSHeaderSize(orig) > 65535 {
		t.Fatal("fixture over the limit itself")
	}
	l := &Letter{Value: []byte("payload"), Class: ClassExhausted, Err: strings.Repeat("e", 2000), Attempts: 3, Headers: orig,
		Origin: Origin{Topic: "orders.new", Stream: "ORDERS", Sequence: 9, Partition: -1}}
	if NATSHeaderSize(l.EnvelopeHeaders()) <= 65535 {
		t.Fatal("the envelope does not push this one over: not the case under test")
	}
	k, v, h := l.Encode(natsLimits)
	if NATSHeaderSize(h) > 65535 || NATSHeaderSize(h)+len(k)+len(v) > 1<<20 {
		t.Fatalf("encoded letter does not fit: headers %d", NATSHeaderSize(h))
	}
	if h[HeaderPackedHeaders] == nil || h[HeaderTruncated] != nil {
		t.Fatalf("want packed, not truncated: %v", slices.Collect(maps.Keys(h)))
	}
	back, err := Decode(k, v, h)
	if err != nil {
		t.Fatal(err)
	}
	if string(back.Value) != "payload" || !maps.EqualFunc(back.Headers, orig, slices.Equal) || back.Truncated != "" || back.Origin.Sequence != 9 {
		t.Fatalf("round trip lost something: value %q, headers equal %v, truncated %q",
			back.Value, maps.EqualFunc(back.Headers, orig, slices.Equal), back.Truncated)
	}
}

// TestEncodeCutsWhatCannotFit: a Kafka record with a 1 MiB header fit a
// topic allowing it but not a 1 MiB dead-letter topic: the header is cut
// with a marker, the value and the envelope are kept.
func TestEncodeCutsWhatCannotFit(t *testing.T) {
	kafka := Limits{MaxBytes: 1000000, HeaderSize: func(h map[string][]string) int {
		n := 0
		for k, vs := range h {
			for _, v := range vs {
				n += len(k) + len(v) + 10
			}
		}
		return n
	}}
	l := &Letter{Value: bytes.Repeat([]byte("p"), 1000), Class: ClassPermanent, Err: "boom",
		Headers: map[string][]string{"X-Huge": {strings.Repeat("h", 1<<20)}, "App": {"a"}},
		Origin:  Origin{Topic: "orders", Partition: 2, Offset: 40}}
	k, v, h := l.Encode(kafka)
	if kafka.HeaderSize(h)+len(k)+len(v) > kafka.MaxBytes {
		t.Fatal("does not fit")
	}
	back, err := Decode(k, v, h)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(back.Truncated, "header X-Huge cut from 1048576 to 256 bytes") || len(back.Value) != 1000 ||
		back.Headers["App"][0] != "a" || back.Err != "boom" || back.Origin.Offset != 40 {
		t.Fatalf("truncated %q value %d headers %d err %q", back.Truncated, len(back.Value), len(back.Headers), back.Err)
	}
	// Many headers, then a value too large: headers dropped, value cut.
	l = &Letter{Value: bytes.Repeat([]byte("p"), 2<<20), Class: ClassPermanent, Headers: bigHeaders(3000, 300)}
	k, v, h = l.Encode(natsLimits)
	if NATSHeaderSize(h) > 65535 || NATSHeaderSize(h)+len(k)+len(v) > 1<<20 {
		t.Fatalf("does not fit: %d + %d", NATSHeaderSize(h), len(v))
	}
	back, err = Decode(k, v, h)
	if err != nil || !strings.Contains(back.Truncated, "value cut from 2097152") || len(back.Truncated) > 1024 {
		t.Fatalf("%v %q", err, back.Truncated)
	}
}

func TestDecodeRejectsBadPacking(t *testing.T) {
	for _, tc := range []struct {
		n     string
		value []byte
	}{{"5", []byte("abc")}, {"-1", nil}, {"x", nil}, {"3", []byte{9, 1, 'a'}}, {"2", []byte{1, 5}}} {
		h := map[string][]string{HeaderClass: {"permanent"}, HeaderPackedHeaders: {tc.n}}
		if _, err := Decode(nil, tc.value, h); err == nil {
			t.Errorf("%s %v: decoded", tc.n, tc.value)
		}
	}
}

// FuzzDecode: Decode never panics on stored bytes, and what it accepts
// encodes back to the same letter.
func FuzzDecode(f *testing.F) {
	l := &Letter{Value: []byte("v"), Class: ClassPermanent, Err: "e", Attempts: 2, Headers: map[string][]string{"A": {"1"}},
		Origin: Origin{Topic: "t", Stream: "S", Sequence: 3, Partition: -1}}
	_, v, h := l.Encode(Limits{MaxHeaderBytes: 200})
	f.Add([]byte("k"), v, encodeFuzzHeaders(h))
	f.Add([]byte(nil), []byte("v"), encodeFuzzHeaders(l.EnvelopeHeaders()))
	f.Add([]byte(nil), []byte{1, 1, 'a', 1, 'b'}, []byte("Sluice-Dlq-Class\x00permanent\x00Sluice-Dlq-Packed-Headers\x005\x00Sluice-Replay-Count\x00-7"))
	f.Fuzz(func(t *testing.T, key, value, rawHeaders []byte) {
		h := decodeFuzzHeaders(rawHeaders)
		got, err := Decode(key, value, h)
		if err != nil {
			return
		}
		if got.Replays < 0 || got.Replays > MaxReplayCount {
			t.Fatalf("Replays %d", got.Replays)
		}
		k2, v2, h2 := got.Encode(Limits{})
		again, err := Decode(k2, v2, h2)
		if err != nil {
			t.Fatalf("re-encoded letter does not decode: %v", err)
		}
		if again.Class != got.Class || again.Err != cutString(got.Err, maxErrLen) || again.Origin != got.Origin ||
			!bytes.Equal(again.Value, got.Value) || !maps.EqualFunc(again.Headers, got.Headers, slices.Equal) {
			t.Fatalf("round trip changed the letter:\n%+v\n%+v", got, again)
		}
	})
}

// encodeFuzzHeaders writes h as NUL-separated name, value pairs.
func encodeFuzzHeaders(h map[string][]string) []byte {
	var b []byte
	for _, k := range slices.Sorted(maps.Keys(h)) {
		for _, v := range h[k] {
			b = append(append(append(append(b, k...), 0), v...), 0)
		}
	}
	return b
}

func decodeFuzzHeaders(b []byte) map[string][]string {
	parts := bytes.Split(b, []byte{0})
	h := map[string][]string{}
	for i := 0; i+1 < len(parts); i += 2 {
		h[string(parts[i])] = append(h[string(parts[i])], string(parts[i+1]))
	}
	return h
}
