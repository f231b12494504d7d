package dlq

import (
	"errors"
	"slices"
	"testing"
	"time"
)

func TestParseFilter(t *testing.T) {
	f, err := ParseFilter("class=permanent,exhausted origin=orders.* route=pay since=2h until=2026-12-02T11:30:00Z", t0)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(f.Classes, []string{"permanent", "exhausted"}) || !slices.Equal(f.Origins, []string{"orders.*"}) ||
		!slices.Equal(f.Routes, []string{"pay"}) || !f.Since.Equal(t0.Add(-2*time.Hour)) ||
		!f.Until.Equal(time.Date(2026, 12, 2, 11, 30, 0, 0, time.UTC)) {
		t.Fatalf("%+v", f)
	}
	if z, err := ParseFilter("  ", t0); err != nil || !z.IsZero() {
		t.Fatalf("empty: %+v %v", z, err)
	}
	for _, bad := range []string{"class", "class=", "colour=red", "since=yesterday", "since=-1h",
		"origin=[", "since=1h until=2h"} {
		if _, err := ParseFilter(bad, t0); !errors.Is(err, ErrInvalidFilter) || !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestFilterMatch(t *testing.T) {
	l := &Letter{Class: ClassExhausted, Route: "pay", LastFailure: t0,
		Origin: Origin{Topic: "orders.new", Stream: "ORDERS"}}
	for _, tc := range []struct {
		f    Filter
		want bool
	}{
		{Filter{}, true},
		{Filter{Classes: []string{ClassPermanent}}, false},
		{Filter{Classes: []string{ClassPermanent, ClassExhausted}}, true},
		{Filter{Origins: []string{"orders.*"}}, true},
		{Filter{Origins: []string{"ORDERS"}}, true},
		{Filter{Origins: []string{"reports.*"}}, false},
		{Filter{Routes: []string{"ship"}}, false},
		{Filter{Since: t0}, true},
		{Filter{Since: t0.Add(time.Nanosecond)}, false},
		{Filter{Until: t0}, false},
		{Filter{Until: t0.Add(time.Nanosecond)}, true},
	} {
		if got := tc.f.Match(l); got != tc.want {
			t.Errorf("%+v: %v, want %v", tc.f, got, tc.want)
		}
	}
}

func TestTally(t *testing.T) {
	var tl Tally
	tl.Add(&Letter{Class: ClassPermanent, Origin: Origin{Topic: "orders.new", Stream: "ORDERS"}, LastFailure: t0})
	tl.Add(&Letter{Class: ClassPermanent, Origin: Origin{Topic: "orders.new", Stream: "ORDERS"}, LastFailure: t0.Add(time.Hour), Replays: 2})
	tl.Add(&Letter{Class: ClassExhausted, Origin: Origin{Topic: "billing"}, LastFailure: t0})
	tl.Add(nil)
	rows := tl.Rows()
	if tl.Total != 4 || tl.Malformed != 1 || len(rows) != 2 {
		t.Fatalf("%+v %+v", tl, rows)
	}
	if r := rows[0]; r.Origin != "ORDERS/orders.new" || r.Count != 2 || !r.Oldest.Equal(t0) || !r.Newest.Equal(t0.Add(time.Hour)) || r.MaxReplays != 2 {
		t.Fatalf("%+v", r)
	}
	if rows[1].Origin != "billing" {
		t.Fatalf("order %+v", rows)
	}
}

// FuzzParseFilter: any expression parses or fails with ErrInvalidFilter,
// never panics, and a parsed filter can be applied.
func FuzzParseFilter(f *testing.F) {
	for _, s := range []string{"class=permanent", "origin=orders.* since=2h", "until=2026-12-02T11:30:00Z route=a,b", "origin=[", "=", "since=1h until=2h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, expr string) {
		flt, err := ParseFilter(expr, t0)
		if err != nil {
			if !errors.Is(err, ErrInvalidFilter) {
				t.Fatalf("%q: %v does not wrap ErrInvalidFilter", expr, err)
			}
			return
		}
		flt.Match(&Letter{Class: ClassPermanent, LastFailure: t0, Origin: Origin{Topic: "orders.new", Stream: "ORDERS"}})
	})
}
