package dlq

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Limits describe what a Sink's broker stores in one message, so that a
// letter is made to fit: a message that fit its origin must not become a
// letter the dead-letter store refuses (the envelope adds about 1 KiB).
type Limits struct {
	// MaxHeaderBytes bounds the encoded headers (JetStream refuses more
	// than 65,535 bytes of headers). 0 means no separate bound.
	MaxHeaderBytes int
	// MaxBytes bounds the whole message: encoded headers, key and value
	// (NATS: the server's max payload; Kafka: the topic's
	// max.message.bytes less the batch overhead). 0 means no bound.
	MaxBytes int
	// HeaderSize returns the encoded size of h on the broker. nil means
	// NATSHeaderSize.
	HeaderSize func(h map[string][]string) int
}

// NATSHeaderSize is the size of h as NATS encodes it: "NATS/1.0\r\n",
// "Key: value\r\n" per value, and a closing "\r\n".
func NATSHeaderSize(h map[string][]string) int {
	n := len("NATS/1.0\r\n\r\n")
	for k, vs := range h {
		for _, v := range vs {
			n += len(k) + len(v) + 4
		}
	}
	return n
}

// keepHeaderBytes is what a cut header value keeps.
const keepHeaderBytes = 256

// Encode returns the key, value and headers that store l within lim: the
// original headers plus the envelope (EnvelopeHeaders), and the original
// key and value, when they fit. When the headers exceed MaxHeaderBytes the
// original headers move into the value: HeaderPackedHeaders says how many
// of its first bytes they take, and Decode moves them back, so the letter
// is still whole. When the message still exceeds MaxBytes, Encode cuts:
// original header values over 256 bytes first (largest first), then whole
// original headers (largest first), then the value, then the key; the
// envelope itself is never cut. HeaderTruncated then says what was cut:
// the letter keeps why and where the message died, and a Replayer refuses
// to republish it. l is not modified.
func (l *Letter) Encode(lim Limits) (key, value []byte, headers map[string][]string) {
	size := lim.HeaderSize
	if size == nil {
		size = NATSHeaderSize
	}
	key, value = l.Key, l.Value
	headers = l.EnvelopeHeaders()
	hsize := size(headers)
	headerOK := lim.MaxHeaderBytes <= 0 || hsize <= lim.MaxHeaderBytes
	if headerOK && (lim.MaxBytes <= 0 || hsize+len(key)+len(value) <= lim.MaxBytes) {
		return key, value, headers
	}

	env := map[string][]string{}
	var orig []headerEntry
	for k, vs := range headers {
		if strings.HasPrefix(k, HeaderPrefix) {
			env[k] = vs
			continue
		}
		for _, v := range vs {
			orig = append(orig, headerEntry{k, v})
		}
	}
	slices.SortStableFunc(orig, func(a, b headerEntry) int { return strings.Compare(a.k, b.k) })
	packed := !headerOK
	// The cost of one original header value where it is stored.
	empty := size(map[string][]string{})
	cost := func(e headerEntry) int {
		if packed {
			return uvarintLen(len(e.k)) + len(e.k) + uvarintLen(len(e.v)) + len(e.v)
		}
		return size(map[string][]string{e.k: {e.v}}) - empty
	}
	var note cuts
	if lim.MaxBytes > 0 {
		// Room for the note and the packing header, then what is left for
		// the original headers, key and value.
		budget := lim.MaxBytes - size(env) - size(map[string][]string{HeaderTruncated: {strings.Repeat("x", maxErrLen)},
			HeaderPackedHeaders: {"1234567890"}}) + empty - binary.MaxVarintLen64
		used := len(key) + len(value)
		for _, e := range orig {
			used += cost(e)
		}
		if used > budget {
			// Largest header values first, down to keepHeaderBytes.
			slices.SortStableFunc(orig, func(a, b headerEntry) int { return cmp.Compare(len(b.v), len(a.v)) })
			for i := range orig {
				if used <= budget || len(orig[i].v) <= keepHeaderBytes {
					break
				}
				before := cost(orig[i])
				note.header(orig[i].k, len(orig[i].v))
				orig[i].v = cutString(orig[i].v, keepHeaderBytes)
				used -= before - cost(orig[i])
			}
			// Then whole headers, largest first.
			for used > budget && len(orig) > 0 {
				used -= cost(orig[0])
				note.dropped++
				orig = orig[1:]
			}
			if used > budget {
				keep := max(len(value)-(used-budget), 0)
				note.value = fmt.Sprintf("value cut from %d to %d bytes", len(value), keep)
				used -= len(value) - keep
				value = value[:keep]
			}
			if used > budget && len(key) > keepHeaderBytes {
				note.key = fmt.Sprintf("key cut from %d to %d bytes", len(key), keepHeaderBytes)
				key = key[:keepHeaderBytes]
			}
		}
	}

	headers = make(map[string][]string, len(env)+len(orig)+2)
	for k, v := range env {
		headers[k] = v
	}
	if s := note.String(); s != "" {
		headers[HeaderTruncated] = []string{cutString(s, maxErrLen)}
	}
	if !packed {
		for _, e := range orig {
			headers[e.k] = append(headers[e.k], e.v)
		}
		return key, value, headers
	}
	block := packHeaders(orig)
	headers[HeaderPackedHeaders] = []string{strconv.Itoa(len(block))}
	return key, append(block, value...), headers
}

type headerEntry struct{ k, v string }

func uvarintLen(n int) int {
	var b [binary.MaxVarintLen64]byte
	return binary.PutUvarint(b[:], uint64(n))
}

// cuts collects what Encode cut, for HeaderTruncated.
type cuts struct {
	headers    int
	first      string
	firstWas   int
	dropped    int
	value, key string
}

func (c *cuts) header(name string, was int) {
	if c.headers == 0 {
		c.first, c.firstWas = name, was
	}
	c.headers++
}

func (c *cuts) String() string {
	var parts []string
	if c.value != "" {
		parts = append(parts, c.value)
	}
	if c.key != "" {
		parts = append(parts, c.key)
	}
	switch {
	case c.headers == 1:
		parts = append(parts, fmt.Sprintf("header %s cut from %d to %d bytes", Printable(c.first, 64), c.firstWas, keepHeaderBytes))
	case c.headers > 1:
		parts = append(parts, fmt.Sprintf("%d header values cut to %d bytes (the largest, %s, from %d)",
			c.headers, keepHeaderBytes, Printable(c.first, 64), c.firstWas))
	}
	if c.dropped > 0 {
		parts = append(parts, fmt.Sprintf("%d header values dropped", c.dropped))
	}
	if len(parts) == 0 {
		return ""
	}
	return "did not fit the dead-letter store: " + strings.Join(parts, "; ")
}

// packHeaders encodes entries as: uvarint count, then per entry uvarint
// len(key), key, uvarint len(value), value.
func packHeaders(entries []headerEntry) []byte {
	b := binary.AppendUvarint(nil, uint64(len(entries)))
	for _, e := range entries {
		b = binary.AppendUvarint(b, uint64(len(e.k)))
		b = append(b, e.k...)
		b = binary.AppendUvarint(b, uint64(len(e.v)))
		b = append(b, e.v...)
	}
	return b
}

var errPacked = errors.New("bad packed headers")

func unpackHeaders(b []byte) (map[string][]string, error) {
	str := func() (string, error) {
		n, w := binary.Uvarint(b)
		if w <= 0 || n > uint64(len(b)-w) {
			return "", errPacked
		}
		s := string(b[w : w+int(n)])
		b = b[w+int(n):]
		return s, nil
	}
	count, w := binary.Uvarint(b)
	if w <= 0 || count > uint64(len(b)) { // each value takes at least 2 bytes
		return nil, errPacked
	}
	b = b[w:]
	h := map[string][]string{}
	for range count {
		k, err := str()
		if err != nil {
			return nil, err
		}
		v, err := str()
		if err != nil {
			return nil, err
		}
		h[k] = append(h[k], v)
	}
	if len(b) != 0 {
		return nil, errPacked
	}
	return h, nil
}
