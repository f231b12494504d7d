package otelsluice_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/otelsluice"
	"github.com/sluice-go/sluice/sluicetest"
)

// A message produced inside a span fails once and succeeds on its second
// delivery: both attempts are children of the producer's span, and their
// events tell what sluice did.
func Example() {
	rec := tracetest.NewSpanRecorder() // an exporter in real use
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	defer tp.Shutdown(context.Background())
	tc := otelsluice.New(otelsluice.Options{
		TracerProvider: tp, // nil: otel.GetTracerProvider()
		Propagator:     propagation.TraceContext{},
	})

	// The producer writes its span's context into the message headers.
	ctx, send := tp.Tracer("app").Start(context.Background(), "send order")
	h := consumer.Headers{}
	tc.Inject(ctx, h)
	send.End()
	src := sluicetest.NewSource() // adapters/nats or adapters/kafka in real use
	src.Publish("order-1", []byte("{}"), h, time.Now())

	c, err := consumer.New(consumer.Options{Hook: tc}, consumer.Route{
		Name: "orders", Source: src,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			if m.Attempt == 1 {
				return errors.New("downstream 503")
			}
			return nil
		},
		Retry: consumer.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
	})
	if err != nil {
		panic(err)
	}
	sluicetest.RunUntil(context.Background(), c, 10*time.Second, func(s []consumer.RouteStats) bool {
		return s[0].Settled[consumer.OutcomeSucceeded] == 1
	})
	// The retried attempt's span may end after the second attempt's (it
	// ends when its retry is settled): print them in attempt order.
	spans := slices.DeleteFunc(rec.Ended(), func(s sdktrace.ReadOnlySpan) bool { return s.Name() == "send order" })
	slices.SortFunc(spans, func(a, b sdktrace.ReadOnlySpan) int { return attempt(a) - attempt(b) })
	for _, s := range spans {
		attrs := map[attribute.Key]string{}
		for _, a := range s.Attributes() {
			attrs[a.Key] = a.Value.Emit()
		}
		var events []string
		for _, e := range s.Events() {
			events = append(events, e.Name)
		}
		fmt.Println(s.Name(), attrs[otelsluice.AttrAttempt], attrs[otelsluice.AttrOutcome],
			"child of send:", s.Parent().SpanID() == send.SpanContext().SpanID())
		fmt.Println("  ", events)
	}
	// Output:
	// process orders 1 retried child of send: true
	//    [sluice.handler.start sluice.handler.end exception sluice.retry]
	// process orders 2 succeeded child of send: true
	//    [sluice.handler.start sluice.handler.end]
}

// attempt is the span's delivery attempt.
func attempt(s sdktrace.ReadOnlySpan) int {
	for _, a := range s.Attributes() {
		if a.Key == otelsluice.AttrAttempt {
			return int(a.Value.AsInt64())
		}
	}
	return 0
}
