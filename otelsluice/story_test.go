package otelsluice_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/otelsluice"
	"github.com/sluice-go/sluice/sluicetest"
)

// tracing is an SDK provider recording every span in memory, with the W3C
// propagators.
type tracing struct {
	rec      *tracetest.SpanRecorder
	tp       *sdktrace.TracerProvider
	prop     propagation.TextMapPropagator
	producer trace.Tracer // the application's own tracer
}

func newTracing(t testing.TB) *tracing {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &tracing{rec: rec, tp: tp, prop: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		producer: tp.Tracer("app")}
}

func (tr *tracing) tracer(opts otelsluice.Options) *otelsluice.Tracer {
	opts.TracerProvider, opts.Propagator = tr.tp, tr.prop
	return otelsluice.New(opts)
}

// produce starts the application's producer span with baggage, writes its
// context into headers, and ends it: what an instrumented producer does.
func (tr *tracing) produce() (map[string][]string, trace.SpanContext) {
	m, _ := baggage.NewMember("tenant", "acme")
	b, _ := baggage.New(m)
	ctx := baggage.ContextWithBaggage(context.Background(), b)
	ctx, span := tr.producer.Start(ctx, "produce order", trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	h := map[string][]string{"app": {"1"}}
	tr.prop.Inject(ctx, otelsluice.HeaderCarrier(h))
	return h, span.SpanContext()
}

// broker is what the story needs of one broker.
type broker struct {
	system string // messaging.system
	topic  string // where the message is produced (and replayed to)
	// publish writes a message with headers to topic.
	publish func(ctx context.Context, h map[string][]string, value []byte) error
	source  consumer.Source
	sink    dlq.Sink
	// letters opens a pass over the dead letters; done closes it.
	letters func(ctx context.Context) (src dlq.Source, done func())
	target  dlq.Target
	// where checks the broker's own attributes of a process span.
	where func(t *testing.T, s sdktrace.ReadOnlySpan)
}

// handlerView is what a handler saw in its ctx.
type handlerView struct {
	span   trace.SpanContext
	tenant string
}

// story: a message produced with a traceparent fails twice and is
// dead-lettered (Retry.MaxAttempts 2), is replayed, and succeeds. It runs
// the story on b and checks that it makes one connected trace whose spans
// and events tell it.
func story(t *testing.T, tr *tracing, b broker) {
	tc := tr.tracer(otelsluice.Options{})
	var mu sync.Mutex
	seen := map[string]handlerView{} // "attempt N" or "replayed"
	c, err := consumer.New(consumer.Options{Hook: tc, ShutdownGrace: 5 * time.Second}, consumer.Route{
		Name: "orders", Source: b.source, Workers: 2,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			_, replayed := m.Headers[dlq.HeaderReplayCount]
			key := fmt.Sprint("attempt ", m.Attempt)
			if replayed {
				key = "replayed"
			}
			mu.Lock()
			seen[key] = handlerView{trace.SpanContextFromContext(ctx), baggage.FromContext(ctx).Member("tenant").Value()}
			mu.Unlock()
			if !replayed {
				return errors.New("downstream 503")
			}
			return nil
		},
		Window:     consumer.WindowPolicy{Messages: 16, Bytes: 1 << 20},
		Retry:      consumer.RetryPolicy{MaxAttempts: 2, BaseDelay: 50 * time.Millisecond, MaxDelay: 50 * time.Millisecond},
		DeadLetter: consumer.DeadLetterPolicy{Sink: b.sink},
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	settled := func(o consumer.Outcome) func() bool {
		return func() bool { return c.Stats()[0].Settled[o] >= 1 && c.Stats()[0].Held == 0 }
	}

	h, producer := tr.produce()
	if err := b.publish(ctx, h, []byte("order 1")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "the dead letter", settled(consumer.OutcomeDeadLettered))

	rp, err := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{b.topic}, Rate: 1000})
	if err != nil {
		t.Fatal(err)
	}
	letters, done := b.letters(ctx)
	p, err := tc.Replay(ctx, rp, letters, b.target)
	done()
	if err != nil || p.Replayed != 1 {
		t.Fatalf("replay: %v, %+v", err, p)
	}
	waitFor(t, ctx, "the replayed message", settled(consumer.OutcomeSucceeded))
	stop()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range tr.rec.Ended() {
		key := s.Name()
		if s.Name() == "process orders" {
			key = "process " + attr(s, otelsluice.AttrOutcome)
		}
		if _, dup := spans[key]; dup {
			t.Errorf("two %q spans", key)
		}
		spans[key] = s
	}
	first, dead, run, send, replayed := spans["process retried"], spans["process dead_lettered"], spans["replay"],
		spans["send "+b.topic], spans["process succeeded"]
	if first == nil || dead == nil || run == nil || send == nil || replayed == nil || len(spans) != 6 {
		t.Fatalf("spans: %v", names(tr.rec.Ended()))
	}

	// One trace: the producer's.
	for _, s := range []sdktrace.ReadOnlySpan{first, dead, send, replayed} {
		if s.SpanContext().TraceID() != producer.TraceID() {
			t.Errorf("%s (%s) is not in the producer's trace", s.Name(), attr(s, otelsluice.AttrOutcome))
		}
	}
	// Both attempts are children of the producer's span: the redelivery
	// (and on Kafka the retry-topic copy) carried the original context.
	for i, s := range []sdktrace.ReadOnlySpan{first, dead} {
		wantAttrs(t, s, map[attribute.Key]string{
			"messaging.system": b.system, "messaging.operation.type": "process", "messaging.destination.name": b.topic,
			otelsluice.AttrAttempt: fmt.Sprint(i + 1), otelsluice.AttrRoute: "orders", "error.type": "retryable",
		})
		if s.Parent().SpanID() != producer.SpanID() || s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("attempt %d: parent %v kind %v, want the producer's span %v, consumer", i+1, s.Parent().SpanID(), s.SpanKind(), producer.SpanID())
		}
		if s.Status().Code != codes.Error || s.Status().Description != "downstream 503" {
			t.Errorf("attempt %d: status %v", i+1, s.Status())
		}
		if b.where != nil {
			b.where(t, s)
		}
		mu.Lock()
		v := seen[fmt.Sprint("attempt ", i+1)]
		mu.Unlock()
		if !v.span.Equal(s.SpanContext()) || v.tenant != "acme" {
			t.Errorf("attempt %d: the handler's ctx had span %v and tenant %q, want %v and acme", i+1, v.span.SpanID(), v.tenant, s.SpanContext().SpanID())
		}
	}
	wantEvents(t, first, otelsluice.EventHandlerStart, otelsluice.EventHandlerEnd, "exception", otelsluice.EventRetry)
	wantAttrs(t, first, map[attribute.Key]string{otelsluice.AttrOutcome: "retried", otelsluice.AttrSettlement: "nak"})
	if d := eventAttr(first, otelsluice.EventRetry, otelsluice.AttrDelay); d == "" || d == "0" {
		t.Errorf("retry event delay %q", d)
	}
	wantEvents(t, dead, otelsluice.EventHandlerStart, otelsluice.EventHandlerEnd, "exception", otelsluice.EventDeadLetter)
	wantAttrs(t, dead, map[attribute.Key]string{otelsluice.AttrOutcome: "dead_lettered", otelsluice.AttrSettlement: "term"})
	if cl := eventAttr(dead, otelsluice.EventDeadLetter, otelsluice.AttrClass); cl != dlq.ClassExhausted {
		t.Errorf("dead-letter class %q", cl)
	}

	// The replay's republish continues the trace from the processing that
	// dead-lettered it, linked to the replay run and to the producer.
	if send.Parent().SpanID() != dead.SpanContext().SpanID() || send.SpanKind() != trace.SpanKindProducer {
		t.Errorf("replay span: parent %v kind %v, want the dead-lettering span %v", send.Parent().SpanID(), send.SpanKind(), dead.SpanContext().SpanID())
	}
	wantLinks(t, send, map[string]trace.SpanContext{"replay_run": run.SpanContext(), "producer": producer})
	wantAttrs(t, send, map[attribute.Key]string{otelsluice.AttrClass: dlq.ClassExhausted, otelsluice.AttrReplayCount: "1",
		"messaging.operation.type": "send", "messaging.destination.name": b.topic})
	wantAttrs(t, run, map[attribute.Key]string{"sluice.replay.replayed": "1"})
	if run.Parent().IsValid() {
		t.Errorf("replay run has parent %v", run.Parent())
	}
	// The replayed message's processing is the republish's child.
	if replayed.Parent().SpanID() != send.SpanContext().SpanID() {
		t.Errorf("replayed processing: parent %v, want the replay span %v", replayed.Parent().SpanID(), send.SpanContext().SpanID())
	}
	wantAttrs(t, replayed, map[attribute.Key]string{otelsluice.AttrAttempt: "1", otelsluice.AttrSettlement: "ack"})
	wantEvents(t, replayed, otelsluice.EventHandlerStart, otelsluice.EventHandlerEnd)
	if replayed.Status().Code != codes.Unset {
		t.Errorf("replayed: status %v", replayed.Status())
	}
	mu.Lock()
	v := seen["replayed"]
	mu.Unlock()
	if !v.span.Equal(replayed.SpanContext()) || v.tenant != "acme" {
		t.Errorf("replayed: the handler's ctx had span %v and tenant %q", v.span.SpanID(), v.tenant)
	}
	if t.Failed() || testing.Verbose() {
		for _, s := range tr.rec.Ended() {
			t.Logf("%s", describe(s))
		}
	}
}

// The story on the in-memory Source: the core and this package alone.
func TestStoryInMemory(t *testing.T) {
	tr := newTracing(t)
	src := sluicetest.NewSource()
	src.HonorDelay = true
	sink := &sluicetest.Sink{}
	story(t, tr, broker{
		topic:  "mem", // sluicetest's topic
		source: src,
		sink:   sink,
		publish: func(_ context.Context, h map[string][]string, v []byte) error {
			src.Publish("order-1", v, h, time.Now())
			return nil
		},
		letters: func(context.Context) (dlq.Source, func()) {
			given := false
			return dlq.SourceFunc(func(context.Context, int) ([]*dlq.Pending, error) {
				if given {
					return nil, dlq.ErrDrained
				}
				given = true
				var out []*dlq.Pending
				for i, l := range sink.Letters() {
					// As a broker stores and reads it back.
					k, v, h := l.Encode(dlq.Limits{})
					back, err := dlq.Decode(k, v, h)
					out = append(out, &dlq.Pending{Letter: back, Err: err, Pos: fmt.Sprint("mem#", i)})
				}
				return out, nil
			}), func() {}
		},
		target: dlq.TargetFunc(func(_ context.Context, m *dlq.Outgoing) error {
			src.Publish("order-1-replayed", m.Value, m.Headers, time.Now())
			return nil
		}),
	})
}

func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func attr(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value.Emit()
		}
	}
	return ""
}

func eventAttr(s sdktrace.ReadOnlySpan, event string, k attribute.Key) string {
	for _, e := range s.Events() {
		if e.Name == event {
			for _, a := range e.Attributes {
				if a.Key == k {
					return a.Value.Emit()
				}
			}
		}
	}
	return ""
}

func wantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[attribute.Key]string) {
	t.Helper()
	for k, v := range want {
		if got := attr(s, k); got != v {
			t.Errorf("%s: %s = %q, want %q", s.Name(), k, got, v)
		}
	}
}

// wantEvents checks the span's events are exactly these, in order (waits
// for the window are allowed before them).
func wantEvents(t *testing.T, s sdktrace.ReadOnlySpan, want ...string) {
	t.Helper()
	var got []string
	for _, e := range s.Events() {
		if e.Name != otelsluice.EventWindowWait {
			got = append(got, e.Name)
		}
	}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("%s (%s): events %v, want %v", s.Name(), attr(s, otelsluice.AttrOutcome), got, want)
	}
}

func wantLinks(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]trace.SpanContext) {
	t.Helper()
	got := map[string]trace.SpanContext{}
	for _, l := range s.Links() {
		for _, a := range l.Attributes {
			if a.Key == otelsluice.AttrLinkRelation {
				got[a.Value.AsString()] = l.SpanContext
			}
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s: links %v, want %v", s.Name(), got, want)
	}
	for rel, sc := range want {
		if got[rel].SpanID() != sc.SpanID() || got[rel].TraceID() != sc.TraceID() {
			t.Errorf("%s: %s link %v, want %v", s.Name(), rel, got[rel], sc)
		}
	}
}

func names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name()+" "+attr(s, otelsluice.AttrOutcome))
	}
	return out
}

func describe(s sdktrace.ReadOnlySpan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s [%s] trace %s span %s parent %s status %v\n", s.Name(), s.SpanKind(), s.SpanContext().TraceID(),
		s.SpanContext().SpanID(), s.Parent().SpanID(), s.Status())
	for _, a := range s.Attributes() {
		fmt.Fprintf(&b, "    %s=%s\n", a.Key, a.Value.Emit())
	}
	for _, e := range s.Events() {
		fmt.Fprintf(&b, "    event %s %v\n", e.Name, e.Attributes)
	}
	for _, l := range s.Links() {
		fmt.Fprintf(&b, "    link %s/%s %v\n", l.SpanContext.TraceID(), l.SpanContext.SpanID(), l.Attributes)
	}
	return b.String()
}
