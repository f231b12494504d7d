package dlq

import (
	"context"
	"errors"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
)

func TestMatchDestination(t *testing.T) {
	for _, tc := range []struct {
		p, d string
		want bool
	}{
		{"orders.new", "orders.new", true},
		{"orders.new", "orders.new.x", false},
		{"orders.*", "orders.new", true},
		{"orders.*", "orders.new.eu", false},
		{"orders.*", "orders", false},
		{"orders.>", "orders.new.eu", true},
		{"orders.>", "orders", false},
		{">", "anything.at.all", true},
		{"orders-*", "orders-eu", true},
		{"orders-*", "orders.eu", false},
		{"*.new", "billing.new", true},
		{"ord[", "ord[", false}, // invalid pattern matches nothing
	} {
		if got := MatchDestination(tc.p, tc.d); got != tc.want {
			t.Errorf("MatchDestination(%q, %q) = %v", tc.p, tc.d, got)
		}
	}
	for _, bad := range []string{"", "a..b", "a.>.b", "ord["} {
		if err := CheckPattern(bad); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("CheckPattern(%q) = %v", bad, err)
		}
	}
}

func TestCheckDestinationAlwaysRefuses(t *testing.T) {
	for _, d := range []string{"", "$JS.API.STREAM.PURGE.WORK", "$SYS.REQ.SERVER.PING", "$KV.cfg.x", "_INBOX.abc",
		"_INBOX_alice.x", "__consumer_offsets", "orders.*", "orders.>", "orders..new", "orders new", "orders\x1b[2J",
		"ordérs", strings.Repeat("a", 256)} {
		if err := CheckDestination(d); !errors.Is(err, ErrRefused) {
			t.Errorf("CheckDestination(%q) = %v, want refused", d, err)
		}
	}
	for _, d := range []string{"orders.new", "orders-eu", "a_b.c-d.E9"} {
		if err := CheckDestination(d); err != nil {
			t.Errorf("CheckDestination(%q) = %v", d, err)
		}
	}
}

type parkRecorder struct {
	mu     sync.Mutex
	parked []*Letter
}

func (p *parkRecorder) Write(ctx context.Context, l *Letter) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.parked = append(p.parked, l)
	return nil
}

func (p *parkRecorder) reasons() map[string]string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]string{}
	for _, l := range p.parked {
		out[string(l.Value)] = l.ParkReason
	}
	return out
}

// TestReplayPublishesOnlyWhereAllowed: a crafted letter naming the
// JetStream purge API, one naming an inbox, one with no origin and one
// outside the allow-list are parked with their reasons, never published,
// and the run goes on to replay the others.
func TestReplayPublishesOnlyWhereAllowed(t *testing.T) {
	q := newMemQueue(letters(8, func(i int, l *Letter) {
		switch i {
		case 1:
			l.Origin.Topic = "$JS.API.STREAM.PURGE.WORK"
		case 3:
			l.Origin.Topic = "_INBOX.victim.1"
		case 4:
			l.Origin.Topic = ""
		case 6:
			l.Origin.Topic = "billing.new"
		}
	})...)
	dst := &memTarget{}
	park := &parkRecorder{}
	r, err := NewReplayer(ReplayOptions{Rate: math.Inf(1), Allow: []string{"orders.*"}, Park: park, Concurrency: 1})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Run(context.Background(), q, dst)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Replayed != 4 || rep.Refused != 4 || rep.Parked != 4 || q.left() != 0 {
		t.Fatalf("report %+v, %d left", rep, q.left())
	}
	for _, o := range dst.got {
		if o.Topic != "orders.new" {
			t.Fatalf("published to %q", o.Topic)
		}
	}
	reasons := park.reasons()
	for v, want := range map[string]string{"1": `"$" subjects`, "3": "_INBOX", "4": "names no destination", "6": "not in the allow-list"} {
		if !strings.Contains(reasons[v], want) {
			t.Errorf("letter %s parked with reason %q, want it to say %q", v, reasons[v], want)
		}
	}
	i := slices.IndexFunc(rep.Destinations, func(d DestinationCount) bool { return d.Name == "$JS.API.STREAM.PURGE.WORK" })
	if i < 0 || rep.Destinations[i].Refused == "" || rep.Destinations[0].Name != "orders.new" || rep.Destinations[0].Letters != 4 {
		t.Fatalf("destinations %+v", rep.Destinations)
	}
}

// TestReplayRefusedWithoutParkIsLeft: without a Park sink a refused letter
// stays in place (Leave is called) and is counted held and refused.
func TestReplayRefusedWithoutParkIsLeft(t *testing.T) {
	q := newMemQueue(letters(3, func(i int, l *Letter) {
		if i == 1 {
			l.Origin.Topic = "$JS.API.STREAM.DELETE.ORDERS"
		}
	})...)
	var left []string
	var mu sync.Mutex
	src := SourceFunc(func(ctx context.Context, n int) ([]*Pending, error) {
		ps, err := q.Fetch(ctx, n)
		for _, p := range ps {
			p.Leave = func() {
				mu.Lock()
				left = append(left, p.Pos)
				mu.Unlock()
			}
		}
		return ps, err
	})
	r, _ := NewReplayer(ReplayOptions{Rate: math.Inf(1), Allow: all})
	rep, err := r.Run(context.Background(), src, &memTarget{})
	if err != nil || rep.Replayed != 2 || rep.Refused != 1 || rep.Held != 1 || rep.Parked != 0 || q.left() != 1 {
		t.Fatalf("%+v %v, %d left", rep, err, q.left())
	}
	if !slices.Equal(left, []string{"q#1"}) {
		t.Fatalf("left %v", left)
	}
}

// TestReplayWithoutPolicyNamesDestinations: no Allow, Destination or
// Topic: nothing moves, and the error lists what the letters ask for.
func TestReplayWithoutPolicyNamesDestinations(t *testing.T) {
	q := newMemQueue(letters(5, func(i int, l *Letter) {
		if i >= 3 {
			l.Origin.Topic = "billing.new"
		}
	})...)
	dst := &memTarget{}
	r, err := NewReplayer(ReplayOptions{Rate: math.Inf(1), Park: &parkRecorder{}})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Run(context.Background(), q, dst)
	var nd *NoDestinationError
	if !errors.As(err, &nd) || !errors.Is(err, ErrNoDestination) {
		t.Fatalf("err %v", err)
	}
	if len(dst.got) != 0 || q.left() != 5 || rep.Moved() != 0 {
		t.Fatalf("moved something: %+v, %d published, %d left", rep, len(dst.got), q.left())
	}
	if !strings.Contains(err.Error(), "orders.new (3), billing.new (2)") {
		t.Fatalf("error %q", err)
	}
}

// TestDryRunWithoutPolicyPredictsTheRefusal (issue 29): a dry run without
// a destination policy returns the error the real run returns, instead of
// deciding letters the real run would never read.
func TestDryRunWithoutPolicyPredictsTheRefusal(t *testing.T) {
	q := newMemQueue(letters(3, nil)...)
	decided := 0
	r, err := NewReplayer(ReplayOptions{Rate: math.Inf(1), DryRun: true, Park: &parkRecorder{},
		OnLetter: func(d Decision) {
			if d.Action != ActionHold {
				decided++
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := r.Run(context.Background(), q, &memTarget{})
	var nd *NoDestinationError
	if !errors.As(err, &nd) || !strings.Contains(err.Error(), "orders.new (3)") {
		t.Fatalf("dry run: %v", err)
	}
	if rep.Parked != 0 || rep.Replayed != 0 || decided != 0 || q.left() != 3 {
		t.Fatalf("dry run predicted moves the real run would not make: %+v, %d decided", rep, decided)
	}
}

// TestReplayDestinationFunc: the function chooses; its error refuses; its
// choice still passes CheckDestination.
func TestReplayDestinationFunc(t *testing.T) {
	q := newMemQueue(letters(3, nil)...)
	dst := &memTarget{}
	park := &parkRecorder{}
	r, _ := NewReplayer(ReplayOptions{Rate: math.Inf(1), Park: park, Destination: func(l *Letter) (string, error) {
		switch string(l.Value) {
		case "0":
			return "orders.retry", nil
		case "1":
			return "", errors.New("tenant unknown")
		}
		return "$JS.API.STREAM.PURGE.X", nil
	}})
	rep, err := r.Run(context.Background(), q, dst)
	if err != nil || rep.Replayed != 1 || rep.Refused != 2 || len(dst.got) != 1 || dst.got[0].Topic != "orders.retry" {
		t.Fatalf("%+v %v %v", rep, err, dst.got)
	}
	if rs := park.reasons(); !strings.Contains(rs["1"], "tenant unknown") || !strings.Contains(rs["2"], "server's APIs") {
		t.Fatalf("reasons %v", rs)
	}
}

func TestReplayOptionsRefuseBadPolicy(t *testing.T) {
	for _, o := range []ReplayOptions{{Topic: "$JS.API.STREAM.PURGE.X"}, {Topic: "_INBOX.x"}, {Allow: []string{"a..b"}}, {Deny: []string{"x.>.y"}}} {
		if _, err := NewReplayer(o); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("%+v: %v", o, err)
		}
	}
	r, _ := NewReplayer(ReplayOptions{Allow: all, Deny: []string{"orders.new"}})
	if _, _, err := r.destination(&Letter{Origin: Origin{Topic: "orders.new"}}); !errors.Is(err, ErrRefused) {
		t.Fatalf("deny: %v", err)
	}
}

// undeliverableTarget refuses one destination for good and counts.
type undeliverableTarget struct {
	memTarget
	calls counter
}

func (u *undeliverableTarget) PublishBatch(ctx context.Context, ms []*Outgoing) []error {
	u.calls.Add()
	var errs []error
	for _, m := range ms {
		err := u.Publish(ctx, m)
		errs = append(errs, err)
	}
	return errs
}

// TestReplayUndeliverableParksAndGoesOn: a destination no stream captures
// parks its letters with the target's error and the run goes on; it is
// not retried.
func TestReplayUndeliverableParksAndGoesOn(t *testing.T) {
	for _, batched := range []bool{false, true} {
		q := newMemQueue(letters(10, func(i int, l *Letter) {
			if i%3 == 0 {
				l.Origin.Topic = "nowhere.x"
			}
		})...)
		var tries counter
		plain := &undeliverableTarget{memTarget: memTarget{fail: func(o *Outgoing) error {
			if o.Topic == "nowhere.x" {
				tries.Add()
				return errors.Join(ErrUndeliverable, errors.New("no stream captures nowhere.x"))
			}
			return nil
		}}}
		var dst Target = TargetFunc(plain.Publish)
		if batched {
			dst = plain
		}
		park := &parkRecorder{}
		r, _ := NewReplayer(ReplayOptions{Rate: math.Inf(1), Allow: all, Park: park, Attempts: 3})
		rep, err := r.Run(context.Background(), q, dst)
		if err != nil || rep.Replayed != 6 || rep.Refused != 4 || rep.Parked != 4 || q.left() != 0 || tries.Load() != 4 {
			t.Fatalf("batched %v: %+v %v, %d left, %d tries", batched, rep, err, q.left(), tries.Load())
		}
		if rs := park.reasons(); !strings.Contains(rs["0"], "no stream captures") {
			t.Fatalf("reasons %v", rs)
		}
	}
}

// TestReplayTruncatedLetterRefused: a letter cut to fit its store is not
// the original message and is not republished.
func TestReplayTruncatedLetterRefused(t *testing.T) {
	q := newMemQueue(letters(2, func(i int, l *Letter) {
		if i == 0 {
			l.Truncated = "value cut from 2000000 to 900000 bytes"
		}
	})...)
	dst := &memTarget{}
	park := &parkRecorder{}
	r, _ := NewReplayer(ReplayOptions{Rate: math.Inf(1), Allow: all, Park: park})
	rep, err := r.Run(context.Background(), q, dst)
	if err != nil || rep.Replayed != 1 || rep.Refused != 1 || !strings.Contains(park.reasons()["0"], "truncated") {
		t.Fatalf("%+v %v %v", rep, err, park.reasons())
	}
}
