package expiry

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-go/sluice/backpressure"
)

// DefaultHeader is the header that carries an absolute deadline when a
// Policy names none.
const DefaultHeader = "Sluice-Deadline"

// ErrMalformed is reported when a deadline header is present but cannot be
// parsed. The caller decides what happens through Policy.OnMalformed.
var ErrMalformed = errors.New("sluice: malformed deadline header")

// ErrInvalidOption wraps every Policy validation error. It is the same value
// as backpressure.ErrInvalidOption and consumer.ErrInvalidOption.
var ErrInvalidOption = backpressure.ErrInvalidOption

// Malformed says what a message with an unparsable deadline header becomes.
type Malformed int8

const (
	// MalformedIgnore treats the header as absent: the message keeps only
	// its MaxAge deadline, if any. The default, since dropping work because a
	// producer wrote a bad header loses data silently.
	MalformedIgnore Malformed = iota
	// MalformedExpired treats the message as already expired.
	MalformedExpired
)

// Policy is a route's expiry policy. The zero value reads absolute
// deadlines from the DefaultHeader header (producers set it with
// FormatDeadline) and sets no age limit; a message without the header has
// no deadline. Set IgnoreHeader (and leave MaxAge 0) for a route where
// nothing ever expires.
type Policy struct {
	// Header names the absolute-deadline header. "" means DefaultHeader.
	Header string
	// IgnoreHeader turns header deadlines off: only MaxAge applies.
	IgnoreHeader bool
	// MaxAge is the longest a message may live after its broker publish
	// time. 0 means no age limit. Negative is invalid.
	MaxAge time.Duration
	// Skew is added to every deadline before comparing it with the local
	// clock, to tolerate producer/broker clocks that differ from ours. 0
	// means none. Negative is invalid.
	Skew time.Duration
	// OnMalformed says what an unparsable header means. Default MalformedIgnore.
	OnMalformed Malformed
}

// Validate reports a bad policy, wrapping ErrInvalidOption.
func (p Policy) Validate() error {
	if p.MaxAge < 0 {
		return fmt.Errorf("%w: expiry MaxAge %v is negative", ErrInvalidOption, p.MaxAge)
	}
	if p.Skew < 0 {
		return fmt.Errorf("%w: expiry Skew %v is negative", ErrInvalidOption, p.Skew)
	}
	if p.OnMalformed != MalformedIgnore && p.OnMalformed != MalformedExpired {
		return fmt.Errorf("%w: expiry OnMalformed %d", ErrInvalidOption, p.OnMalformed)
	}
	return nil
}

// Enabled reports whether the policy can ever produce a deadline. Callers
// skip all deadline work on the hot path when it is false.
func (p Policy) Enabled() bool { return p.MaxAge > 0 || p.headerName() != "" }

func (p Policy) headerName() string {
	switch {
	case p.IgnoreHeader:
		return ""
	case p.Header != "":
		return p.Header
	}
	return DefaultHeader
}

// HeaderName returns the header the policy reads, or "" for none.
func (p Policy) HeaderName() string { return p.headerName() }

// Deadline computes a message's deadline from its header value (hasHeader
// false when the header is absent) and its broker publish time (zero when
// unknown). The zero time means no deadline. When the header is present but
// unparsable the error wraps ErrMalformed and the returned deadline already
// reflects OnMalformed: the MaxAge deadline for MalformedIgnore, or a
// deadline in the distant past for MalformedExpired.
//
// The returned deadline includes Skew.
func (p Policy) Deadline(header string, hasHeader bool, published time.Time) (time.Time, error) {
	var d time.Time
	if p.MaxAge > 0 && !published.IsZero() {
		d = published.Add(p.MaxAge)
	}
	var err error
	if hasHeader && p.headerName() != "" {
		hd, perr := ParseDeadline(header)
		switch {
		case perr != nil:
			err = perr
			if p.OnMalformed == MalformedExpired {
				return time.Unix(0, 0), err
			}
		case d.IsZero() || hd.Before(d):
			d = hd
		}
	}
	if !d.IsZero() {
		d = d.Add(p.Skew)
	}
	return d, err
}

// Expired reports whether deadline has passed at now. A zero deadline never
// expires.
func Expired(deadline, now time.Time) bool {
	return !deadline.IsZero() && now.After(deadline)
}

// ParseDeadline parses an absolute deadline: RFC 3339 (fractional seconds
// allowed) or integer Unix milliseconds, after 1970. Anything else (an
// empty string, Go's zero time, 0) reports ErrMalformed.
func ParseDeadline(s string) (time.Time, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return time.Time{}, fmt.Errorf("%w: empty", ErrMalformed)
	}
	if c := s[0]; c >= '0' && c <= '9' && !strings.ContainsAny(s, "-:T") {
		ms, err := strconv.ParseInt(s, 10, 64)
		// Reject values that would overflow time arithmetic.
		// 0 (the epoch) is what a producer writes for a zero time.Time: a
		// mistake, not a deadline in 1970.
		if err != nil || ms > 1<<50 || ms <= 0 {
			return time.Time{}, fmt.Errorf("%w: %q is not Unix milliseconds", ErrMalformed, truncate(s))
		}
		return time.UnixMilli(ms), nil
	}
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%w: %q is not RFC 3339", ErrMalformed, truncate(s))
	}
	if t.Unix() <= 0 {
		// Go's zero time (0001-01-01T00:00:00Z) or anything before the
		// epoch is a producer's mistake; read as "no deadline" it would
		// also switch off MaxAge.
		return time.Time{}, fmt.Errorf("%w: %q is not a plausible deadline", ErrMalformed, truncate(s))
	}
	return t, nil
}

// FormatDeadline formats t the way producers should write the header: Unix
// milliseconds, the cheapest to parse and free of time-zone mistakes.
func FormatDeadline(t time.Time) string { return strconv.FormatInt(t.UnixMilli(), 10) }

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}
