package natsadapter

import (
	"strconv"
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
	var err error
	m.stream, m.consumer = f[0], f[1]
	if m.delivered, err = strconv.ParseUint(f[2], 10, 64); err != nil {
		return ackMeta{}, false
	}
	if m.streamSeq, err = strconv.ParseUint(f[3], 10, 64); err != nil {
		return ackMeta{}, false
	}
	ts, err := strconv.ParseInt(f[5], 10, 64)
	if err != nil {
		return ackMeta{}, false
	}
	m.timestamp = time.Unix(0, ts)
	return m, true
}
