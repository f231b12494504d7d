package dlq

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestEnvelopeRoundTrip(t *testing.T) {
	first := time.Date(2026, 12, 2, 9, 0, 0, 123, time.UTC)
	l := &Letter{Key: []byte("k"), Value: []byte("v"), Headers: map[string][]string{"X-App": {"1", "2"}},
		Route: "orders", Err: "boom", Class: ClassExhausted, Attempts: 3, FirstFailure: first, LastFailure: first.Add(time.Second),
		Origin: Origin{Topic: "orders.created", Stream: "ORDERS", Sequence: 42, Group: "workers", Partition: -1}, Replays: 1}
	h := l.EnvelopeHeaders()
	if len(l.Headers) != 1 {
		t.Fatal("EnvelopeHeaders modified the original headers")
	}
	got, err := Decode(l.Key, l.Value, h)
	if err != nil {
		t.Fatal(err)
	}
	if got.Err != "boom" || got.Class != ClassExhausted || got.Attempts != 3 || !got.FirstFailure.Equal(first) ||
		got.Origin != l.Origin || got.Replays != 1 || got.Route != "orders" || strings.Join(got.Headers["X-App"], ",") != "1,2" {
		t.Fatalf("round trip: %+v", got)
	}
	if _, ok := got.Headers[HeaderClass]; ok {
		t.Fatal("envelope header leaked into original headers")
	}
	if h[HeaderVersion][0] != Version {
		t.Fatal("version header")
	}
}

func TestKafkaOriginRoundTrip(t *testing.T) {
	l := &Letter{Class: ClassPermanent, Origin: Origin{Topic: "t", Partition: 3, Offset: 99, Group: "g"}}
	got, err := Decode(nil, nil, l.EnvelopeHeaders())
	if err != nil || got.Origin != l.Origin {
		t.Fatalf("%+v %v", got, err)
	}
}

func TestDecodeRejects(t *testing.T) {
	if _, err := Decode(nil, nil, map[string][]string{"X": {"y"}}); !errors.Is(err, ErrMalformed) {
		t.Fatalf("not a letter: %v", err)
	}
	bad := map[string][]string{HeaderClass: {"permanent"}, HeaderAttempts: {"three"}}
	if _, err := Decode(nil, nil, bad); !errors.Is(err, ErrMalformed) {
		t.Fatalf("bad attempts: %v", err)
	}
}

func TestLongErrorTruncated(t *testing.T) {
	l := &Letter{Class: ClassPanic, Err: strings.Repeat("x", 5000)}
	if n := len(l.EnvelopeHeaders()[HeaderError][0]); n != 1024 {
		t.Fatalf("error header %d bytes", n)
	}
}
