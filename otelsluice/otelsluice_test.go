package otelsluice_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/otelsluice"
	"github.com/sluice-go/sluice/sluicetest"
)

// runRoute runs one in-memory route with tc as its hook until done holds.
func runRoute(t *testing.T, ctx context.Context, tc *otelsluice.Tracer, r consumer.Route, done func(consumer.RouteStats) bool) {
	t.Helper()
	if r.Name == "" {
		r.Name = "orders"
	}
	c, err := consumer.New(consumer.Options{Hook: tc}, r)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := sluicetest.RunUntil(ctx, c, 10*time.Second, func(s []consumer.RouteStats) bool { return s[0].Held == 0 && done(s[0]) }); err != nil {
		t.Fatal(err)
	}
}

func spansByKey(tr *tracing) map[string]sdktrace.ReadOnlySpan {
	out := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range tr.Rec.Ended() {
		if k := attr(s, "test.key"); k != "" {
			out[k] = s
		} else {
			out[s.Name()] = s
		}
	}
	return out
}

// keyed tags each message's span with its key, for the tests to find it.
func keyed(h consumer.Handler) consumer.Handler {
	return func(ctx context.Context, m *consumer.Message) error {
		trace.SpanFromContext(ctx).SetAttributes(attribute.String("test.key", string(m.Key)))
		return h(ctx, m)
	}
}

// Decisions made without the handler have a span of their own, with the
// producer as parent: expired at fetch, shed near its deadline, and
// dead-lettered without running (oversize).
func TestDecisionsWithoutHandler(t *testing.T) {
	tr := newTracing(t)
	tc := tr.Tracer(otelsluice.Options{})
	h, producer := tr.Produce()
	with := func(k, v string) consumer.Headers {
		out := consumer.Headers{k: {v}}
		for k, v := range h {
			out[k] = v
		}
		return out
	}
	src := sluicetest.NewSource()
	src.Publish("expired", nil, with(expiry.DefaultHeader, expiry.FormatDeadline(time.Now().Add(-time.Minute))), time.Time{})
	src.Publish("rushed", nil, with(expiry.DefaultHeader, expiry.FormatDeadline(time.Now().Add(time.Minute))), time.Time{})
	src.PublishSized("huge", nil, with("x", "y"), time.Time{}, 2<<20)
	sink := &sluicetest.Sink{}
	runRoute(t, context.Background(), tc, consumer.Route{
		Source:     src,
		Handler:    func(context.Context, *consumer.Message) error { t.Error("the handler ran"); return nil },
		Window:     consumer.WindowPolicy{Bytes: 1 << 20},
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink, OnOversize: consumer.OversizeDeadLetter},
		Overload:   consumer.OverloadPolicy{ShedNearDeadline: time.Hour, OnShed: consumer.ShedAck},
	}, func(s consumer.RouteStats) bool { return s.Fetched == 3 })
	spans := tr.Rec.Ended()
	if len(spans) != 4 { // the producer's and three
		t.Fatalf("spans: %v", names(spans))
	}
	got := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range spans[1:] {
		got[attr(s, otelsluice.AttrOutcome)] = s
		if s.Parent().SpanID() != producer.SpanID() {
			t.Errorf("%s: parent %v", attr(s, otelsluice.AttrOutcome), s.Parent().SpanID())
		}
	}
	wantEvents(t, got["expired"], otelsluice.EventExpired)
	wantEvents(t, got["shed"], otelsluice.EventShed)
	if r := eventAttr(got["shed"], otelsluice.EventShed, otelsluice.AttrShedReason); r != "near_deadline" {
		t.Errorf("shed reason %q", r)
	}
	if c := eventAttr(got["shed"], otelsluice.EventShed, otelsluice.AttrCriticality); c != "SHEDDABLE" {
		t.Errorf("shed class %q", c)
	}
	wantEvents(t, got["dead_lettered"], otelsluice.EventDeadLetter)
	if c := eventAttr(got["dead_lettered"], otelsluice.EventDeadLetter, otelsluice.AttrClass); c != dlq.ClassOversize {
		t.Errorf("class %q", c)
	}
	if l := sink.Letters(); len(l) != 1 || l[0].Trace["traceparent"] == "" {
		t.Errorf("letters %v", l)
	} else if l[0].Headers["traceparent"][0] != h["traceparent"][0] {
		t.Errorf("the letter's headers lost the producer's traceparent: %v", l[0].Headers)
	}
}

// Options.Link: the consumer span starts a trace of its own, linked to the
// producer, and the handler still gets the producer's baggage.
func TestLinkMode(t *testing.T) {
	tr := newTracing(t)
	tc := tr.Tracer(otelsluice.Options{Link: true})
	h, producer := tr.Produce()
	src := sluicetest.NewSource()
	src.Publish("a", nil, h, time.Time{})
	tenant := make(chan string, 1)
	runRoute(t, context.Background(), tc, consumer.Route{Source: src,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			tenant <- baggage.FromContext(ctx).Member("tenant").Value()
			return nil
		}}, func(s consumer.RouteStats) bool { return s.Settled[consumer.OutcomeSucceeded] == 1 })
	s := tr.Rec.Ended()[1]
	if s.Parent().IsValid() || s.SpanContext().TraceID() == producer.TraceID() {
		t.Errorf("linked span has parent %v in trace %v", s.Parent(), s.SpanContext().TraceID())
	}
	wantLinks(t, s, map[string]trace.SpanContext{"producer": producer})
	if got := <-tenant; got != "acme" {
		t.Errorf("baggage tenant %q", got)
	}
}

// A message without trace context starts a trace of its own, even when the
// consumer's Run ctx carries a span (the application's, alive for hours).
func TestNoProducerContext(t *testing.T) {
	tr := newTracing(t)
	tc := tr.Tracer(otelsluice.Options{})
	ctx, app := tr.Producer.Start(context.Background(), "app")
	defer app.End()
	src := sluicetest.NewSource()
	src.Publish("a", nil, consumer.Headers{"traceparent": {"garbage"}}, time.Time{})
	src.Publish("b", nil, nil, time.Time{})
	runRoute(t, ctx, tc, consumer.Route{Source: src, Handler: func(context.Context, *consumer.Message) error { return nil }},
		func(s consumer.RouteStats) bool { return s.Settled[consumer.OutcomeSucceeded] == 2 })
	if n := len(tr.Rec.Ended()); n != 2 {
		t.Fatalf("%d spans ended, want 2", n)
	}
	for _, s := range tr.Rec.Ended() {
		if s.Parent().IsValid() {
			t.Errorf("%s has parent %v", s.Name(), s.Parent().SpanID())
		}
	}
}

// The handler's error classes and a panic end up as error.type and status.
func TestHandlerErrors(t *testing.T) {
	tr := newTracing(t)
	tc := tr.Tracer(otelsluice.Options{})
	src := sluicetest.NewSource()
	src.Publish("permanent", nil, nil, time.Time{})
	src.Publish("panic", nil, nil, time.Time{})
	runRoute(t, context.Background(), tc, consumer.Route{Source: src, Retry: consumer.RetryPolicy{MaxAttempts: 1},
		Handler: keyed(func(ctx context.Context, m *consumer.Message) error {
			if string(m.Key) == "panic" {
				panic("boom\nwith a second line")
			}
			return consumer.Permanent(errors.New("cannot decode"))
		})}, func(s consumer.RouteStats) bool { return s.Settled[consumer.OutcomeTerminated] == 2 })
	spans := spansByKey(tr)
	for key, want := range map[string][2]string{"permanent": {"permanent", "permanent: cannot decode"}, "panic": {"panic", "sluice: handler panicked: boom"}} {
		s := spans[key]
		if s == nil {
			t.Fatalf("no span for %s: %v", key, names(tr.Rec.Ended()))
		}
		wantAttrs(t, s, map[attribute.Key]string{"error.type": want[0], otelsluice.AttrOutcome: "terminated", otelsluice.AttrSettlement: "term"})
		if s.Status().Code != codes.Error || s.Status().Description != want[1] {
			t.Errorf("%s: status %v", key, s.Status())
		}
		if cl := eventAttr(s, otelsluice.EventDeadLetter, otelsluice.AttrSink); cl != "false" {
			t.Errorf("%s: dead-letter event without a sink: sink=%q", key, cl)
		}
	}
}

// With ReplayNewTrace each republish is a child of the replay run, linked
// to the failure and the producer; the wrapper keeps a BatchTarget a
// BatchTarget.
func TestReplayNewTrace(t *testing.T) {
	tr := newTracing(t)
	tc := tr.Tracer(otelsluice.Options{ReplayNewTrace: true})
	h, producer := tr.Produce()
	_, failed := tr.Producer.Start(context.Background(), "failed processing")
	failed.End()
	tp := "00-" + failed.SpanContext().TraceID().String() + "-" + failed.SpanContext().SpanID().String() + "-01"
	letter := &dlq.Letter{Class: dlq.ClassExhausted, Headers: h, Origin: dlq.Origin{Topic: "orders", Partition: -1},
		Trace: map[string]string{"traceparent": tp}}
	var out []*dlq.Outgoing
	target := batchTarget(func(ms []*dlq.Outgoing) { out = append(out, ms...) })
	wrapped := tc.ReplayTarget(target)
	if _, ok := wrapped.(dlq.BatchTarget); !ok {
		t.Fatal("the wrapper of a BatchTarget is not one")
	}
	rp, err := dlq.NewReplayer(dlq.ReplayOptions{Topic: "orders", Rate: 1000})
	if err != nil {
		t.Fatal(err)
	}
	given := false
	src := dlq.SourceFunc(func(context.Context, int) ([]*dlq.Pending, error) {
		if given {
			return nil, dlq.ErrDrained
		}
		given = true
		return []*dlq.Pending{{Letter: letter, Pos: "dlq#1"}}, nil
	})
	if p, err := tc.Replay(context.Background(), rp, src, target); err != nil || p.Replayed != 1 {
		t.Fatalf("replay: %v %+v", err, p)
	}
	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range tr.Rec.Ended() {
		spans[s.Name()] = s
	}
	run, send := spans["replay"], spans["send orders"]
	if run == nil || send == nil {
		t.Fatalf("spans %v", names(tr.Rec.Ended()))
	}
	if send.Parent().SpanID() != run.SpanContext().SpanID() {
		t.Errorf("send: parent %v, want the run", send.Parent().SpanID())
	}
	wantLinks(t, send, map[string]trace.SpanContext{"dead_letter": failed.SpanContext(), "producer": producer})
	if len(out) != 1 || !tracepartOf(out[0].Headers, send.SpanContext()) {
		t.Fatalf("republished headers %v, want the send span's traceparent", out)
	}
	if out[0].Headers["baggage"][0] != h["baggage"][0] {
		t.Errorf("baggage %v, want %v", out[0].Headers["baggage"], h["baggage"])
	}
	if len(letter.Headers["traceparent"]) != 1 || letter.Headers["traceparent"][0] != h["traceparent"][0] {
		t.Errorf("the letter's own headers changed: %v", letter.Headers)
	}
}

func TestHeaderCarrier(t *testing.T) {
	c := otelsluice.HeaderCarrier{"Traceparent": {"a", "b"}, "x": {}}
	if c.Get("traceparent") != "a" || c.Get("x") != "" || c.Get("none") != "" {
		t.Fatalf("Get: %q %q", c.Get("traceparent"), c.Get("x"))
	}
	c.Set("traceparent", "c")
	if len(c["Traceparent"]) != 0 || c.Get("traceparent") != "c" || len(c.Keys()) != 2 {
		t.Fatalf("Set: %v", c)
	}
}

// batchTarget is a dlq.BatchTarget recording what it publishes.
type batchTarget func([]*dlq.Outgoing)

func (f batchTarget) Publish(_ context.Context, m *dlq.Outgoing) error {
	f([]*dlq.Outgoing{m})
	return nil
}
func (f batchTarget) PublishBatch(_ context.Context, ms []*dlq.Outgoing) []error {
	f(ms)
	return nil
}

func tracepartOf(h map[string][]string, sc trace.SpanContext) bool {
	v := h["traceparent"]
	return len(v) == 1 && v[0] == "00-"+sc.TraceID().String()+"-"+sc.SpanID().String()+"-01"
}

// Time the route waited for its window before the fetch is an event on the
// span of each message that fetch brought: here one slot, held 50 ms by
// each handler run.
func TestWindowWaitEvent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		tr := newTracing(t)
		tc := tr.Tracer(otelsluice.Options{})
		src := sluicetest.NewSource()
		src.Publish("first", nil, nil, time.Time{})
		src.Publish("second", nil, nil, time.Time{})
		runRoute(t, context.Background(), tc, consumer.Route{Source: src, Workers: 1, Window: consumer.WindowPolicy{Messages: 1},
			Handler: keyed(func(context.Context, *consumer.Message) error { time.Sleep(50 * time.Millisecond); return nil })},
			func(s consumer.RouteStats) bool { return s.Settled[consumer.OutcomeSucceeded] == 2 })
		spans := spansByKey(tr)
		wantEvents(t, spans["first"], otelsluice.EventHandlerStart, otelsluice.EventHandlerEnd)
		if w := eventAttr(spans["second"], otelsluice.EventWindowWait, otelsluice.AttrWait); w != "0.05" {
			t.Errorf("second: window wait %q s, want 0.05", w)
		}
	})
}

// A batch handler's run is one span, linked to each of its messages'
// spans; each message keeps its own span with the handler's start and end.
func TestBatchSpanLinksMessages(t *testing.T) {
	tr := newTracing(t)
	tc := tr.Tracer(otelsluice.Options{})
	src := sluicetest.NewSource()
	for _, k := range []string{"a", "b", "c"} {
		src.Publish(k, []byte("v"), nil, time.Time{})
	}
	runRoute(t, context.Background(), tc, consumer.Route{
		Source: src, Workers: 1,
		BatchHandler: func(ctx context.Context, b *consumer.Batch) error { return nil },
	}, func(s consumer.RouteStats) bool { return s.Settled[consumer.OutcomeSucceeded] == 3 })
	var batches []sdktrace.ReadOnlySpan
	msgs := map[trace.SpanID]bool{}
	for _, s := range tr.Rec.Ended() {
		switch s.Name() {
		case "process orders batch":
			batches = append(batches, s)
		case "process orders":
			msgs[s.SpanContext().SpanID()] = true
			if len(s.Events()) < 2 {
				t.Fatalf("message span events %v", s.Events())
			}
		}
	}
	links, size := 0, 0
	for _, b := range batches {
		n, _ := strconv.Atoi(attr(b, otelsluice.AttrBatchSize))
		size += n
		if len(b.Links()) != n || b.Parent().IsValid() {
			t.Fatalf("batch span of %d with %d links, parent %v", n, len(b.Links()), b.Parent())
		}
		for _, l := range b.Links() {
			links++
			if !msgs[l.SpanContext.SpanID()] {
				t.Fatalf("link to %v, not a message span", l.SpanContext.SpanID())
			}
		}
	}
	if len(batches) == 0 || len(msgs) != 3 || size != 3 || links != 3 {
		t.Fatalf("%d batch spans (%d messages, %d links), %d message spans", len(batches), size, links, len(msgs))
	}
}
