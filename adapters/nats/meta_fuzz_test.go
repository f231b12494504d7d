package natsadapter

import (
	"strconv"
	"strings"
	"testing"
)

// FuzzParseAck: the ack subject of a delivery is parsed on every message.
// parseAck never panics, accepts only the two JetStream layouts, and
// reads back what a well-formed subject says.
func FuzzParseAck(f *testing.F) {
	f.Add("$JS.ACK.ORDERS.orders.3.42.40.1764672000000000000.7", "ORDERS", "orders", uint64(3), uint64(42), int64(1764672000000000000))
	f.Add("$JS.ACK._.ACC.ORDERS.orders.1.1.1.1.0.token", "S", "c", uint64(1), uint64(1), int64(0))
	f.Add("$JS.ACK.a.b.c", "x", "y", uint64(0), uint64(18446744073709551615), int64(-1))
	f.Fuzz(func(t *testing.T, reply, stream, cons string, delivered, seq uint64, ts int64) {
		m, ok := parseAck(reply)
		if ok && (strings.Contains(m.stream, ".") || strings.Contains(m.consumer, ".")) {
			t.Fatalf("%q: stream %q consumer %q hold a dot", reply, m.stream, m.consumer)
		}
		if stream == "" || cons == "" || strings.ContainsAny(stream+cons, ". \t\r\n") {
			return
		}
		built := "$JS.ACK." + stream + "." + cons + "." + strconv.FormatUint(delivered, 10) + "." +
			strconv.FormatUint(seq, 10) + ".9." + strconv.FormatInt(ts, 10) + ".0"
		m, ok = parseAck(built)
		if !ok || m.stream != stream || m.consumer != cons || m.delivered != delivered || m.streamSeq != seq || m.timestamp.UnixNano() != ts {
			t.Fatalf("%q read as %+v (%v)", built, m, ok)
		}
	})
}

// FuzzParseDec: parseDec and parseDecInt read exactly what strconv does.
func FuzzParseDec(f *testing.F) {
	for _, s := range []string{"0", "42", "18446744073709551615", "18446744073709551616", "-9223372036854775808", "9223372036854775808", "+7", "-", "", "1a", "007"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		u, ok := parseDec(s)
		wu, err := strconv.ParseUint(s, 10, 64)
		if ok != (err == nil) || ok && u != wu {
			t.Fatalf("parseDec(%q) = %d, %v; strconv %d, %v", s, u, ok, wu, err)
		}
		i, ok := parseDecInt(s)
		wi, err := strconv.ParseInt(s, 10, 64)
		if ok != (err == nil) || ok && i != wi {
			t.Fatalf("parseDecInt(%q) = %d, %v; strconv %d, %v", s, i, ok, wi, err)
		}
	})
}
