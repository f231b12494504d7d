package otelsluice_test

import (
	"testing"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/otelsluice"
	"github.com/sluice-go/sluice/sluicetest"
)

// BenchmarkCorePath is consumer's BenchmarkCorePath (no hook), for pairs
// with the traced variants below in one binary.
func BenchmarkCorePath(b *testing.B) {
	sluicetest.BenchCorePath(b, consumer.Options{}, nil, nil)
}

// BenchmarkCorePathNoopTracer: tracing on, with OpenTelemetry's no-op
// tracer provider and the global propagator (a no-op until set): what an
// application pays for wiring tracing it has not switched on.
func BenchmarkCorePathNoopTracer(b *testing.B) {
	tc := otelsluice.New(otelsluice.Options{TracerProvider: noop.NewTracerProvider()})
	sluicetest.BenchCorePath(b, consumer.Options{Hook: tc}, nil, nil)
}

// BenchmarkCorePathUnsampled: the SDK with a sampler that records nothing
// (the common case of a low sampling ratio).
func BenchmarkCorePathUnsampled(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.NeverSample()))
	tc := otelsluice.New(otelsluice.Options{TracerProvider: tp})
	sluicetest.BenchCorePath(b, consumer.Options{Hook: tc}, nil, nil)
}

// BenchmarkCorePathSampled: the SDK recording every span, with no
// exporter: the cost of the spans, attributes and events themselves.
func BenchmarkCorePathSampled(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithSampler(sdktrace.AlwaysSample()))
	tc := otelsluice.New(otelsluice.Options{TracerProvider: tp})
	sluicetest.BenchCorePath(b, consumer.Options{Hook: tc}, nil, nil)
}
