package expiry

import (
	"errors"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)

func TestDeadlineFromHeaderAndMaxAge(t *testing.T) {
	p := Policy{MaxAge: time.Minute}
	// Header earlier than publish+MaxAge wins.
	d, err := p.Deadline(FormatDeadline(t0.Add(10*time.Second)), true, t0)
	if err != nil || !d.Equal(t0.Add(10*time.Second)) {
		t.Fatalf("got %v %v", d, err)
	}
	// A header cannot extend life past MaxAge.
	d, _ = p.Deadline(t0.Add(time.Hour).Format(time.RFC3339Nano), true, t0)
	if !d.Equal(t0.Add(time.Minute)) {
		t.Fatalf("header extended MaxAge: %v", d)
	}
	// No header: publish + MaxAge.
	d, _ = p.Deadline("", false, t0)
	if !d.Equal(t0.Add(time.Minute)) {
		t.Fatalf("got %v", d)
	}
	// Headers off and no MaxAge: no deadline.
	off := Policy{IgnoreHeader: true}
	if d, _ := off.Deadline(FormatDeadline(t0), true, t0); !d.IsZero() || off.Enabled() {
		t.Fatalf("IgnoreHeader policy produced %v (enabled %v)", d, off.Enabled())
	}
}

// The zero Policy is protection by default: it reads DefaultHeader.
func TestZeroPolicyReadsTheHeader(t *testing.T) {
	var p Policy
	if !p.Enabled() || p.HeaderName() != DefaultHeader {
		t.Fatalf("zero policy: enabled %v, header %q", p.Enabled(), p.HeaderName())
	}
	d, err := p.Deadline(FormatDeadline(t0), true, t0.Add(-time.Hour))
	if err != nil || !d.Equal(t0) {
		t.Fatalf("got %v %v", d, err)
	}
	if d, _ := p.Deadline("", false, t0); !d.IsZero() {
		t.Fatalf("no header, no MaxAge: deadline %v", d)
	}
}

// A producer that writes Go's zero time or 0 made a mistake: read as "no
// deadline" it would also switch off MaxAge, so it is malformed and MaxAge
// still applies.
func TestZeroTimeDeadlineIsMalformed(t *testing.T) {
	p := Policy{MaxAge: time.Minute}
	for _, s := range []string{"0001-01-01T00:00:00Z", "0", "1970-01-01T00:00:00Z", "1960-05-01T00:00:00Z"} {
		d, err := p.Deadline(s, true, t0)
		if !errors.Is(err, ErrMalformed) {
			t.Errorf("%q accepted: %v", s, d)
		}
		if !d.Equal(t0.Add(time.Minute)) {
			t.Errorf("%q: deadline %v, want publish + MaxAge", s, d)
		}
	}
}

func TestSkewAllowance(t *testing.T) {
	p := Policy{Skew: 2 * time.Second}
	d, _ := p.Deadline(FormatDeadline(t0), true, time.Time{})
	if Expired(d, t0.Add(time.Second)) {
		t.Fatal("expired within the skew allowance")
	}
	if !Expired(d, t0.Add(3*time.Second)) {
		t.Fatal("not expired after the skew allowance")
	}
	if Expired(time.Time{}, t0) {
		t.Fatal("zero deadline expired")
	}
}

func TestMalformedPolicies(t *testing.T) {
	ign := Policy{MaxAge: time.Minute}
	d, err := ign.Deadline("next tuesday", true, t0)
	if !errors.Is(err, ErrMalformed) || !d.Equal(t0.Add(time.Minute)) {
		t.Fatalf("ignore: %v %v", d, err)
	}
	exp := Policy{OnMalformed: MalformedExpired}
	d, err = exp.Deadline("garbage", true, t0)
	if !errors.Is(err, ErrMalformed) || !Expired(d, t0) {
		t.Fatalf("expired policy: %v %v", d, err)
	}
}

func TestParseDeadlineFormats(t *testing.T) {
	for _, s := range []string{"1796205600500", "2026-12-02T10:00:00.5Z", "2026-12-02T11:00:00+01:00"} {
		if _, err := ParseDeadline(s); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	for _, s := range []string{"", "abc", "12-12", "99999999999999999999", "2026-13-40T00:00:00Z"} {
		if _, err := ParseDeadline(s); !errors.Is(err, ErrMalformed) {
			t.Errorf("%q accepted", s)
		}
	}
	got, _ := ParseDeadline(FormatDeadline(t0))
	if !got.Equal(t0) {
		t.Fatalf("round trip %v", got)
	}
}

func TestValidate(t *testing.T) {
	for _, p := range []Policy{{MaxAge: -1}, {Skew: -1}, {OnMalformed: 7}} {
		if err := p.Validate(); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%+v: %v", p, err)
		}
	}
}

func FuzzParseDeadline(f *testing.F) {
	for _, s := range []string{"1796205600500", "2026-12-02T10:00:00.5Z", "", "-1", "1e9", "9999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		d, err := ParseDeadline(s)
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v does not wrap ErrMalformed", err)
			}
			return
		}
		// Any accepted deadline must survive arithmetic with skew.
		_ = Expired(d.Add(time.Hour), time.Now())
		p := Policy{MaxAge: time.Second, Skew: time.Second}
		if _, err := p.Deadline(s, true, time.Now()); err != nil {
			t.Fatalf("Deadline rejected what ParseDeadline accepted: %v", err)
		}
	})
}
