package natsadapter

import (
	"math"
	"strings"
	"time"
)

// ackMeta is what the consumer needs from a delivery's ack subject.
type ackMeta struct {
	stream, consumer string
	delivered        uint64
	streamSeq        uint64
	timestamp        time.Time
}

// parseAck reads the ack subject of a JetStream delivery without
// allocating (nats.Msg.Metadata splits it into a slice on every message):
//
//	$JS.ACK.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>
//	$JS.ACK.<domain>.<account>.<stream>.<consumer>.<delivered>.<sseq>.<cseq>.<ts>.<pending>[.<token>...]
func parseAck(reply string) (ackMeta, bool) {
	const prefix = "$JS.ACK."
	if !strings.HasPrefix(reply, prefix) {
		return ackMeta{}, false
	}
	rest := reply[len(prefix):]
	var tok [16]string
	n := 0
	for n < len(tok) {
		i := strings.IndexByte(rest, '.')
		if i < 0 {
			tok[n] = rest
			n++
			break
		}
		tok[n] = rest[:i]
		rest = rest[i+1:]
		n++
	}
	var f []string
	switch {
	case n == 7: // the original form, without domain and account
		f = tok[:7]
	case n >= 9: // domain ("_" for none), account hash, then the same seven
		f = tok[2:9]
	default:
		return ackMeta{}, false
	}
	var m ackMeta
	var ok1, ok2, ok3 bool
	m.stream, m.consumer = f[0], f[1]
	m.delivered, ok1 = parseDec(f[2])
	m.streamSeq, ok2 = parseDec(f[3])
	ts, ok3 := parseDecInt(f[5])
	if !ok1 || !ok2 || !ok3 {
		return ackMeta{}, false
	}
	m.timestamp = time.Unix(0, ts)
	return m, true
}

// parseDec is strconv.ParseUint(s, 10, 64) for the ack subject's numbers,
// without its generality (and its error value): a third of parseAck's time
// in a profile went to ParseUint.
func parseDec(s string) (uint64, bool) {
	if s == "" {
		return 0, false
	}
	var n uint64
	for i := 0; i < len(s); i++ {
		c := s[i] - '0'
		if c > 9 {
			return 0, false
		}
		if n > (math.MaxUint64-uint64(c))/10 {
			return 0, false // overflow
		}
		n = n*10 + uint64(c)
	}
	return n, true
}

// parseDecInt is strconv.ParseInt(s, 10, 64) on the same terms.
func parseDecInt(s string) (int64, bool) {
	neg := false
	if s != "" && (s[0] == '-' || s[0] == '+') {
		neg, s = s[0] == '-', s[1:]
	}
	u, ok := parseDec(s)
	switch {
	case !ok:
		return 0, false
	case neg && u <= 1<<63:
		return int64(-u), true // -(1<<63) wraps to MinInt64, as intended
	case !neg && u < 1<<63:
		return int64(u), true
	}
	return 0, false
}
