package dlq

import (
	"strings"
	"testing"
)

func TestTraceRoundTrip(t *testing.T) {
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	l := &Letter{Class: ClassExhausted, Headers: map[string][]string{"traceparent": {"00-producer"}},
		Trace: map[string]string{"traceparent": tp, "tracestate": "vendor=1"}}
	h := l.EnvelopeHeaders()
	if h[HeaderTracePrefix+"traceparent"][0] != tp || h["traceparent"][0] != "00-producer" {
		t.Fatalf("envelope: %v", h)
	}
	got, err := Decode(nil, nil, h)
	if err != nil {
		t.Fatal(err)
	}
	if got.Trace["traceparent"] != tp || got.Trace["tracestate"] != "vendor=1" || len(got.Trace) != 2 {
		t.Fatalf("Trace read back: %v", got.Trace)
	}
	if got.Headers["traceparent"][0] != "00-producer" || len(got.Headers) != 1 {
		t.Fatalf("original headers: %v", got.Headers)
	}
	// A replayed letter dying again gets the new processing's context, not
	// the old one's (envelope headers of the original are dropped).
	again := &Letter{Class: ClassPermanent, Headers: h, Trace: map[string]string{"traceparent": "00-new"}}
	if v := again.EnvelopeHeaders()[HeaderTracePrefix+"traceparent"]; len(v) != 1 || v[0] != "00-new" {
		t.Fatalf("re-dead-lettered: %v", v)
	}
}

// Trace fields come from headers anyone can write: out-of-bounds names and
// values are left out both ways, and no more than MaxTraceFields are kept.
func TestTraceBounds(t *testing.T) {
	tr := map[string]string{
		"ok":           "v",
		"":             "empty name",
		"bad name":     "space in the name",
		"colon:":       "colon in the name",
		"empty":        "",
		"ctl":          "a\r\nb",
		"long":         strings.Repeat("x", MaxTraceField+1),
		"utf8":         "é",
		"with space":   "v",
		"fine-too":     "a b=c",
		"max":          strings.Repeat("y", MaxTraceField),
		"lower":        "z",
		"upper":        "Z",
		"mixed-Case_1": "1",
	}
	h := (&Letter{Class: ClassPermanent, Trace: tr}).EnvelopeHeaders()
	n := 0
	for k := range h {
		if f, ok := strings.CutPrefix(k, HeaderTracePrefix); ok {
			n++
			if !traceField(f, h[k][0]) {
				t.Errorf("wrote out-of-bounds field %q", f)
			}
		}
	}
	if n == 0 || n > MaxTraceFields {
		t.Fatalf("wrote %d trace fields, want 1..%d", n, MaxTraceFields)
	}
	forged := map[string][]string{HeaderClass: {ClassPermanent}}
	for i := range 3 * MaxTraceFields {
		forged[HeaderTracePrefix+"f"+strings.Repeat("x", i)] = []string{"v"}
	}
	forged[HeaderTracePrefix+"bad"] = []string{"a\nb"}
	got, err := Decode(nil, nil, forged)
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Trace) != MaxTraceFields || got.Trace["bad"] != "" {
		t.Fatalf("decoded %d fields (%v), want %d in bounds", len(got.Trace), got.Trace, MaxTraceFields)
	}
}
