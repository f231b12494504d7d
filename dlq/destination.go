package dlq

import (
	"cmp"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
)

// A letter's headers are untrusted: anyone who can write to the
// dead-letter store chooses them. So the destination a letter names
// (Sluice-Dlq-Origin-Topic) is only a request; a Replayer publishes to it
// only when the operator allowed it (ReplayOptions.Allow, Destination or
// Topic), and never to a destination CheckDestination refuses.

var (
	// ErrRefused marks a letter the Replayer did not republish because of
	// its destination: not allowed, always refused, none named, or the
	// letter was truncated when it was dead-lettered. The letter is parked
	// with the reason (or left in place without a Park sink); the run goes
	// on.
	ErrRefused = errors.New("sluice: replay destination refused")
	// ErrUndeliverable is wrapped by a Target's error when the destination
	// can never take this message as it is (no stream or topic captures
	// it, it is too large): retrying is useless, so the Replayer parks the
	// letter with the error as its reason and goes on. Any other publish
	// error stops the run with the letter left in place.
	ErrUndeliverable = errors.New("sluice: destination cannot take the message")
)

// CheckDestination refuses destinations a replay must never publish to,
// whatever the allow-list says: "" (the letter names none), subjects that
// start with "$" (the NATS server's APIs: $JS.API, $SYS, $KV...),
// "_INBOX" (replies to other clients' requests), Kafka's internal topics
// ("__consumer_offsets", "__transaction_state": anything starting with
// "__"), wildcards and names with spaces or control characters. The error
// wraps ErrRefused.
func CheckDestination(d string) error {
	why := ""
	switch {
	case d == "":
		why = "the letter names no destination"
	case strings.HasPrefix(d, "$"):
		why = "\"$\" subjects are the server's APIs"
	case strings.HasPrefix(d, "_INBOX"):
		why = "_INBOX subjects carry replies to other clients"
	case strings.HasPrefix(d, "__"):
		why = "\"__\" topics are Kafka's internal topics"
	case len(d) > 255:
		why = "longer than 255 bytes"
	default:
		for _, tok := range strings.Split(d, ".") {
			if tok == "" || tok == "*" || tok == ">" {
				why = "not a literal subject or topic"
			}
		}
		for _, c := range []byte(d) {
			if c <= ' ' || c >= 0x7f {
				why = "space, control or non-ASCII byte in the name"
				break
			}
		}
	}
	if why == "" {
		return nil
	}
	return fmt.Errorf("%w: %q: %s", ErrRefused, Printable(d, 80), why)
}

// CheckPattern reports whether p is a valid destination pattern (see
// MatchDestination). Errors wrap ErrInvalidOption.
func CheckPattern(p string) error {
	if p == "" {
		return fmt.Errorf("%w: empty destination pattern", ErrInvalidOption)
	}
	toks := strings.Split(p, ".")
	for i, t := range toks {
		switch {
		case t == "":
			return fmt.Errorf("%w: destination pattern %q: empty token", ErrInvalidOption, p)
		case t == ">" && i != len(toks)-1:
			return fmt.Errorf("%w: destination pattern %q: \">\" must be the last token", ErrInvalidOption, p)
		}
		if _, err := path.Match(t, ""); err != nil {
			return fmt.Errorf("%w: destination pattern %q: %v", ErrInvalidOption, p, err)
		}
	}
	return nil
}

// MatchDestination reports whether destination d matches pattern p. Both
// are split into dot-separated tokens, as NATS subjects are: "*" matches
// one token, a final ">" one or more, and any other token is a glob
// within its token (path.Match: "orders-*", "eu-?"), so "orders.*" matches
// "orders.new" but not "orders.new.eu", and Kafka topics without dots
// match single-token patterns ("orders-*"). An invalid pattern matches
// nothing.
func MatchDestination(p, d string) bool {
	pt, dt := strings.Split(p, "."), strings.Split(d, ".")
	for i, t := range pt {
		if t == ">" && i == len(pt)-1 {
			return len(dt) > i
		}
		if i >= len(dt) {
			return false
		}
		if ok, err := path.Match(t, dt[i]); err != nil || !ok {
			return false
		}
	}
	return len(pt) == len(dt)
}

// DestinationCount is one destination of a replay, with the letters that
// asked for it (or were sent to it).
type DestinationCount struct {
	Name    string
	Letters int
	// Refused says why the destination was refused ("" when it was used).
	// With several reasons it holds the first.
	Refused string
}

// maxTracked bounds the destinations a run tracks: a crafted queue can
// name one per letter.
const maxTracked = 1000

// destTally counts destinations; not safe for concurrent use.
type destTally struct {
	m     map[string]*DestinationCount
	other DestinationCount
}

func (t *destTally) add(name, refused string) {
	if t.m == nil {
		t.m = map[string]*DestinationCount{}
	}
	d := t.m[name]
	if d == nil {
		if len(t.m) >= maxTracked {
			t.other.Name = "(other destinations)"
			t.other.Letters++
			if t.other.Refused == "" {
				t.other.Refused = refused
			}
			return
		}
		d = &DestinationCount{Name: name}
		t.m[name] = d
	}
	d.Letters++
	if d.Refused == "" {
		d.Refused = refused
	}
}

// list returns the destinations, most letters first.
func (t *destTally) list() []DestinationCount {
	out := make([]DestinationCount, 0, len(t.m)+1)
	for _, d := range t.m {
		out = append(out, *d)
	}
	slices.SortFunc(out, func(a, b DestinationCount) int {
		return cmp.Or(cmp.Compare(b.Letters, a.Letters), cmp.Compare(a.Name, b.Name))
	})
	if t.other.Letters > 0 {
		out = append(out, t.other)
	}
	return out
}

// NoDestinationError is returned by Replayer.Run when ReplayOptions gives
// no destination policy (no Allow, Destination or Topic): nothing was
// moved, and Asked lists what the letters ask for, most letters first. It
// wraps ErrNoDestination.
type NoDestinationError struct {
	Asked []DestinationCount
}

func (e *NoDestinationError) Error() string {
	var b strings.Builder
	b.WriteString("sluice: replay needs the destinations it may publish to (an allow-list, or one destination for all): nothing was moved")
	if len(e.Asked) == 0 {
		b.WriteString("; no letter to replay")
		return b.String()
	}
	b.WriteString("; the letters ask for ")
	for i, d := range e.Asked {
		if i == 10 {
			fmt.Fprintf(&b, ", and %d more", len(e.Asked)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		name := d.Name
		if name == "" {
			name = "(none)"
		}
		fmt.Fprintf(&b, "%s (%d)", Printable(name, 80), d.Letters)
	}
	return b.String()
}

func (e *NoDestinationError) Unwrap() error { return ErrNoDestination }
