package otelsluice

import (
	"context"
	"strings"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
)

// ScopeName is the instrumentation scope of the spans this package starts.
const ScopeName = "github.com/sluice-go/sluice/otelsluice"

// Options configure a Tracer. The zero value uses OpenTelemetry's global
// tracer provider and propagator, and makes each consumer span a child of
// the producer's span.
type Options struct {
	// TracerProvider starts the spans. nil means otel.GetTracerProvider()
	// (which follows a provider set globally later).
	TracerProvider trace.TracerProvider
	// Propagator reads the producer's context (W3C traceparent, baggage...)
	// from message headers, and writes contexts into dead letters and
	// replayed messages. nil means otel.GetTextMapPropagator(), which is a
	// no-op until the application sets one, for example
	//
	//	otel.SetTextMapPropagator(propagation.NewCompositeTextMapPropagator(
	//		propagation.TraceContext{}, propagation.Baggage{}))
	Propagator propagation.TextMapPropagator
	// Link starts each consumer span as the root of a trace of its own,
	// linked to the producer's span, instead of as its child. Use it when
	// one producer trace fans out to so many messages that a child per
	// message would make it unreadable. Baggage is carried either way.
	Link bool
	// System is messaging.system. "" means it is told from the message's
	// (or the dead letter's) origin: "nats" for a JetStream stream,
	// "kafka" for a partition read by a consumer group; else it is left
	// out.
	System string
	// ReplayNewTrace makes each replayed message's span a child of the
	// replay run (one trace per replay), linked to the original trace and
	// to the processing that dead-lettered it, instead of continuing the
	// original trace, linked to the run.
	ReplayNewTrace bool
}

// Tracer traces messages through sluice: it is a consumer.Hook (set it as
// consumer.Options.Hook), and wraps replays (Replay, ReplayTarget). It is
// safe for concurrent use; one Tracer serves any number of consumers and
// replays.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
	opts   Options
}

// New returns a Tracer.
func New(opts Options) *Tracer {
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	prop := opts.Propagator
	if prop == nil {
		prop = otel.GetTextMapPropagator()
	}
	return &Tracer{
		tracer: tp.Tracer(ScopeName, trace.WithInstrumentationVersion(dlq.Version)),
		prop:   prop,
		opts:   opts,
	}
}

var _ consumer.Hook = (*Tracer)(nil)

// Inject writes the trace context of ctx (its span, and its baggage) into
// h through the Tracer's propagator: what a handler does to the headers of
// a message it publishes, so the next consumer continues the trace.
func (t *Tracer) Inject(ctx context.Context, h consumer.Headers) {
	t.prop.Inject(ctx, HeaderCarrier(h))
}

// Extract returns ctx with the trace context carried by h (a producer's
// span, baggage) through the Tracer's propagator.
func (t *Tracer) Extract(ctx context.Context, h consumer.Headers) context.Context {
	return t.prop.Extract(ctx, HeaderCarrier(h))
}

// HeaderCarrier lets a propagator read and write sluice's message headers
// (consumer.Headers, dlq.Letter.Headers, nats.Header: all
// map[string][]string). Get takes the first value of a key, and falls back
// to a case-insensitive match: HTTP-minded producers write "Traceparent".
// Set replaces the key's values.
type HeaderCarrier map[string][]string

var _ propagation.TextMapCarrier = HeaderCarrier(nil)

// Get returns the first value of key, or "".
func (c HeaderCarrier) Get(key string) string {
	if v := c[key]; len(v) > 0 {
		return v[0]
	}
	for k, v := range c {
		if len(v) > 0 && strings.EqualFold(k, key) {
			return v[0]
		}
	}
	return ""
}

// Set sets key to value alone, replacing any key that differs only in case.
func (c HeaderCarrier) Set(key, value string) {
	for k := range c {
		if k != key && strings.EqualFold(k, key) {
			delete(c, k)
		}
	}
	c[key] = []string{value}
}

// Keys lists the keys.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// system is messaging.system for a delivery from o.
func (t *Tracer) system(o dlq.Origin) string {
	switch {
	case t.opts.System != "":
		return t.opts.System
	case o.Stream != "":
		return "nats"
	case o.Partition >= 0 && o.Topic != "" && o.Group != "":
		return "kafka"
	}
	return ""
}

// firstLine cuts s at its first newline (a panic's stack trace).
func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
