package storytest

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
)

// Tracing is an SDK provider recording every span in memory, with the W3C
// propagators.
type Tracing struct {
	Rec      *tracetest.SpanRecorder
	TP       *sdktrace.TracerProvider
	Prop     propagation.TextMapPropagator
	Producer trace.Tracer // the application's own tracer
}

// NewTracing starts a provider that t shuts down.
func NewTracing(t testing.TB) *Tracing {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec), sdktrace.WithSampler(sdktrace.AlwaysSample()))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return &Tracing{Rec: rec, TP: tp, Prop: propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}),
		Producer: tp.Tracer("app")}
}

// Tracer is an otelsluice.Tracer on this provider and propagators.
func (tr *Tracing) Tracer(opts otelsluice.Options) *otelsluice.Tracer {
	opts.TracerProvider, opts.Propagator = tr.TP, tr.Prop
	return otelsluice.New(opts)
}

// Produce starts the application's producer span with baggage, writes its
// context into headers, and ends it: what an instrumented producer does.
func (tr *Tracing) Produce() (map[string][]string, trace.SpanContext) {
	m, _ := baggage.NewMember("tenant", "acme")
	b, _ := baggage.New(m)
	ctx := baggage.ContextWithBaggage(context.Background(), b)
	ctx, span := tr.Producer.Start(ctx, "produce order", trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	h := map[string][]string{"app": {"1"}}
	tr.Prop.Inject(ctx, otelsluice.HeaderCarrier(h))
	return h, span.SpanContext()
}

// Broker is what the story needs of one broker.
type Broker struct {
	System string // messaging.system
	Topic  string // where the message is produced (and replayed to)
	// Publish writes a message with headers to Topic.
	Publish func(ctx context.Context, h map[string][]string, value []byte) error
	Source  consumer.Source
	Sink    dlq.Sink
	// Letters opens a pass over the dead letters; done closes it.
	Letters func(ctx context.Context) (src dlq.Source, done func())
	Target  dlq.Target
	// Where checks the broker's own attributes of a process span.
	Where func(t *testing.T, s sdktrace.ReadOnlySpan)
}

// handlerView is what a handler saw in its ctx.
type handlerView struct {
	span   trace.SpanContext
	tenant string
}

// Run tells the story: a message produced with a traceparent fails twice
// and is dead-lettered (Retry.MaxAttempts 2), is replayed, and succeeds. It
// runs the story on b and checks that it makes one connected trace whose spans
// and events tell it.
func Run(t *testing.T, tr *Tracing, b Broker) {
	tc := tr.Tracer(otelsluice.Options{})
	var mu sync.Mutex
	seen := map[string]handlerView{} // "attempt N" or "replayed"
	c, err := consumer.New(consumer.Options{Hook: tc, ShutdownGrace: 5 * time.Second}, consumer.Route{
		Name: "orders", Source: b.Source, Workers: 2,
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
		DeadLetter: consumer.DeadLetterPolicy{Sink: b.Sink},
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

	h, producer := tr.Produce()
	if err := b.Publish(ctx, h, []byte("order 1")); err != nil {
		t.Fatal(err)
	}
	WaitFor(t, ctx, "the dead letter", settled(consumer.OutcomeDeadLettered))

	rp, err := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{b.Topic}, Rate: 1000})
	if err != nil {
		t.Fatal(err)
	}
	letters, done := b.Letters(ctx)
	p, err := tc.Replay(ctx, rp, letters, b.Target)
	done()
	if err != nil || p.Replayed != 1 {
		t.Fatalf("replay: %v, %+v", err, p)
	}
	WaitFor(t, ctx, "the replayed message", settled(consumer.OutcomeSucceeded))
	stop()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range tr.Rec.Ended() {
		key := s.Name()
		if s.Name() == "process orders" {
			key = "process " + Attr(s, otelsluice.AttrOutcome)
		}
		if _, dup := spans[key]; dup {
			t.Errorf("two %q spans", key)
		}
		spans[key] = s
	}
	first, dead, run, send, replayed := spans["process retried"], spans["process dead_lettered"], spans["replay"],
		spans["send "+b.Topic], spans["process succeeded"]
	if first == nil || dead == nil || run == nil || send == nil || replayed == nil || len(spans) != 6 {
		t.Fatalf("spans: %v", Names(tr.Rec.Ended()))
	}

	// One trace: the producer's.
	for _, s := range []sdktrace.ReadOnlySpan{first, dead, send, replayed} {
		if s.SpanContext().TraceID() != producer.TraceID() {
			t.Errorf("%s (%s) is not in the producer's trace", s.Name(), Attr(s, otelsluice.AttrOutcome))
		}
	}
	// Both attempts are children of the producer's span: the redelivery
	// (and on Kafka the retry-topic copy) carried the original context.
	for i, s := range []sdktrace.ReadOnlySpan{first, dead} {
		WantAttrs(t, s, map[attribute.Key]string{
			"messaging.system": b.System, "messaging.operation.type": "process", "messaging.destination.name": b.Topic,
			otelsluice.AttrAttempt: fmt.Sprint(i + 1), otelsluice.AttrRoute: "orders", "error.type": "retryable",
		})
		if s.Parent().SpanID() != producer.SpanID() || s.SpanKind() != trace.SpanKindConsumer {
			t.Errorf("attempt %d: parent %v kind %v, want the producer's span %v, consumer", i+1, s.Parent().SpanID(), s.SpanKind(), producer.SpanID())
		}
		if s.Status().Code != codes.Error || s.Status().Description != "downstream 503" {
			t.Errorf("attempt %d: status %v", i+1, s.Status())
		}
		if b.Where != nil {
			b.Where(t, s)
		}
		mu.Lock()
		v := seen[fmt.Sprint("attempt ", i+1)]
		mu.Unlock()
		if !v.span.Equal(s.SpanContext()) || v.tenant != "acme" {
			t.Errorf("attempt %d: the handler's ctx had span %v and tenant %q, want %v and acme", i+1, v.span.SpanID(), v.tenant, s.SpanContext().SpanID())
		}
	}
	WantEvents(t, first, otelsluice.EventHandlerStart, otelsluice.EventHandlerEnd, "exception", otelsluice.EventRetry)
	WantAttrs(t, first, map[attribute.Key]string{otelsluice.AttrOutcome: "retried", otelsluice.AttrSettlement: "nak"})
	if d := EventAttr(first, otelsluice.EventRetry, otelsluice.AttrDelay); d == "" || d == "0" {
		t.Errorf("retry event delay %q", d)
	}
	WantEvents(t, dead, otelsluice.EventHandlerStart, otelsluice.EventHandlerEnd, "exception", otelsluice.EventDeadLetter)
	WantAttrs(t, dead, map[attribute.Key]string{otelsluice.AttrOutcome: "dead_lettered", otelsluice.AttrSettlement: "term"})
	if cl := EventAttr(dead, otelsluice.EventDeadLetter, otelsluice.AttrClass); cl != dlq.ClassExhausted {
		t.Errorf("dead-letter class %q", cl)
	}

	// The replay's republish continues the trace from the processing that
	// dead-lettered it, linked to the replay run and to the producer.
	if send.Parent().SpanID() != dead.SpanContext().SpanID() || send.SpanKind() != trace.SpanKindProducer {
		t.Errorf("replay span: parent %v kind %v, want the dead-lettering span %v", send.Parent().SpanID(), send.SpanKind(), dead.SpanContext().SpanID())
	}
	WantLinks(t, send, map[string]trace.SpanContext{"replay_run": run.SpanContext(), "producer": producer})
	WantAttrs(t, send, map[attribute.Key]string{otelsluice.AttrClass: dlq.ClassExhausted, otelsluice.AttrReplayCount: "1",
		"messaging.operation.type": "send", "messaging.destination.name": b.Topic})
	WantAttrs(t, run, map[attribute.Key]string{"sluice.replay.replayed": "1"})
	if run.Parent().IsValid() {
		t.Errorf("replay run has parent %v", run.Parent())
	}
	// The replayed message's processing is the republish's child.
	if replayed.Parent().SpanID() != send.SpanContext().SpanID() {
		t.Errorf("replayed processing: parent %v, want the replay span %v", replayed.Parent().SpanID(), send.SpanContext().SpanID())
	}
	WantAttrs(t, replayed, map[attribute.Key]string{otelsluice.AttrAttempt: "1", otelsluice.AttrSettlement: "ack"})
	WantEvents(t, replayed, otelsluice.EventHandlerStart, otelsluice.EventHandlerEnd)
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
		for _, s := range tr.Rec.Ended() {
			t.Logf("%s", Describe(s))
		}
	}
}

// WaitFor polls cond until it holds or ctx ends (then t fails).
func WaitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %s: %v", what, ctx.Err())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Attr is the span attribute k, emitted as a string ("" when absent).
func Attr(s sdktrace.ReadOnlySpan, k attribute.Key) string {
	for _, a := range s.Attributes() {
		if a.Key == k {
			return a.Value.Emit()
		}
	}
	return ""
}

// EventAttr is attribute k of the span's event named event.
func EventAttr(s sdktrace.ReadOnlySpan, event string, k attribute.Key) string {
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

// WantAttrs checks the span's attributes include want.
func WantAttrs(t *testing.T, s sdktrace.ReadOnlySpan, want map[attribute.Key]string) {
	t.Helper()
	for k, v := range want {
		if got := Attr(s, k); got != v {
			t.Errorf("%s: %s = %q, want %q", s.Name(), k, got, v)
		}
	}
}

// WantEvents checks the span's events are exactly these, in order (waits
// for the window are allowed before them).
func WantEvents(t *testing.T, s sdktrace.ReadOnlySpan, want ...string) {
	t.Helper()
	var got []string
	for _, e := range s.Events() {
		if e.Name != otelsluice.EventWindowWait {
			got = append(got, e.Name)
		}
	}
	if strings.Join(got, ", ") != strings.Join(want, ", ") {
		t.Errorf("%s (%s): events %v, want %v", s.Name(), Attr(s, otelsluice.AttrOutcome), got, want)
	}
}

// WantLinks checks the span's links by their sluice.link.relation.
func WantLinks(t *testing.T, s sdktrace.ReadOnlySpan, want map[string]trace.SpanContext) {
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

// Names lists the spans by name and outcome.
func Names(spans []sdktrace.ReadOnlySpan) []string {
	var out []string
	for _, s := range spans {
		out = append(out, s.Name()+" "+Attr(s, otelsluice.AttrOutcome))
	}
	return out
}

// Describe is a span in full, for a failure message.
func Describe(s sdktrace.ReadOnlySpan) string {
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
