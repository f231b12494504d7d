package otelsluice

import (
	"context"
	"errors"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
)

// Attributes sluice adds to the messaging conventions on its spans.
const (
	AttrRoute       = attribute.Key("sluice.route")
	AttrAttempt     = attribute.Key("sluice.attempt")     // delivery attempt, 1 for the first
	AttrCriticality = attribute.Key("sluice.criticality") // the message's class
	AttrOutcome     = attribute.Key("sluice.outcome")     // consumer.Outcome: "succeeded", "dead_lettered"...
	AttrSettlement  = attribute.Key("sluice.settlement")  // what the broker was told: "ack", "nak", "term", "none"
	AttrDeadline    = attribute.Key("sluice.deadline")    // RFC 3339, once the handler starts
	AttrStream      = attribute.Key("sluice.jetstream.stream")
	AttrSequence    = attribute.Key("sluice.jetstream.sequence")
	AttrWait        = attribute.Key("sluice.wait.seconds")        // on EventWindowWait, EventThrottled
	AttrQueued      = attribute.Key("sluice.queued.seconds")      // on EventHandlerStart: since the route took it in
	AttrHandlerTime = attribute.Key("sluice.handler.seconds")     // on EventHandlerEnd
	AttrShedReason  = attribute.Key("sluice.shed.reason")         // on EventShed: "queue_full", "near_deadline"
	AttrClass       = attribute.Key("sluice.dead_letter.class")   // on EventDeadLetter: "exhausted", "permanent"...
	AttrSink        = attribute.Key("sluice.dead_letter.sink")    // on EventDeadLetter: false when terminated without a sink
	AttrDelay       = attribute.Key("sluice.retry.delay.seconds") // on EventRetry, EventLetterFailed
	AttrReason      = attribute.Key("sluice.reason")              // on EventTerminated
	AttrReplayCount = attribute.Key("sluice.replay.count")        // on a replay span: this replay's number
	AttrLetterPos   = attribute.Key("sluice.dead_letter.position")
	AttrBatchSize   = attribute.Key("sluice.batch.size")           // on a batch span: messages given to the handler
	AttrBatchBytes  = attribute.Key("sluice.batch.bytes")          // on a batch span
	AttrBatchLinger = attribute.Key("sluice.batch.linger.seconds") // on a batch span: waited for more messages
	// AttrLinkRelation says what a link points to: "producer",
	// "dead_letter" (the processing that dead-lettered a replayed message)
	// or "replay_run".
	AttrLinkRelation = attribute.Key("sluice.link")
)

// Events sluice records on a message's span.
const (
	EventWindowWait   = "sluice.window_wait"        // the route waited for window capacity before the fetch
	EventThrottled    = "sluice.throttled"          // the route's Throttle held the pull back before the fetch
	EventHandlerStart = "sluice.handler.start"      // the handler starts
	EventHandlerEnd   = "sluice.handler.end"        // the handler returned
	EventShed         = "sluice.shed"               // shed before it ran
	EventDeadLetter   = "sluice.dead_letter"        // failed for good: written to the sink (or terminated)
	EventRetry        = "sluice.retry"              // nak'd, to be redelivered after a delay
	EventExpired      = "sluice.expired"            // its deadline passed
	EventReturned     = "sluice.returned"           // handed back on shutdown before it ran
	EventAbandoned    = "sluice.abandoned"          // left for the broker to redeliver
	EventTerminated   = "sluice.terminated"         // failed for good, no sink
	EventLetterFailed = "sluice.dead_letter.failed" // the dead-letter write failed; nak'd
	EventSettleFailed = "sluice.settle.failed"      // the broker refused or never confirmed the settlement
)

const (
	linkProducer   = "producer"
	linkDeadLetter = "dead_letter"
	linkReplayRun  = "replay_run"
	linkBatched    = "batched"
)

var (
	kindConsumer = trace.WithSpanKind(trace.SpanKindConsumer)
	childOpts    = []trace.SpanStartOption{kindConsumer}
	rootOpts     = []trace.SpanStartOption{kindConsumer, trace.WithNewRoot()}
)

// routeHook traces one route's messages: a consumer span per delivery,
// from when the route takes it in until its settlement is done.
type routeHook struct {
	t     *Tracer
	name  string // "process <route>"
	route attribute.KeyValue
}

// HookRoute implements consumer.Hook: each route's spans are named
// "process <route name>" (a low-cardinality name, as the messaging
// conventions ask; the subject or topic is messaging.destination.name).
func (t *Tracer) HookRoute(info consumer.RouteInfo) consumer.MessageHook {
	return &routeHook{t: t, name: "process " + info.Name, route: AttrRoute.String(info.Name)}
}

// Held starts m's span: a child of the producer's span found in m's
// headers (or linked to it, Options.Link), else the root of a new trace.
func (h *routeHook) Held(ctx context.Context, m *consumer.Message, w consumer.Waits) context.Context {
	base := trace.SpanContextFromContext(ctx)
	pctx := h.t.prop.Extract(ctx, HeaderCarrier(m.Headers))
	psc := trace.SpanContextFromContext(pctx)
	fromProducer := psc.IsValid() && !psc.Equal(base)
	var span trace.Span
	switch {
	case fromProducer && h.t.opts.Link:
		pctx, span = h.t.tracer.Start(pctx, h.name, kindConsumer, trace.WithNewRoot(),
			trace.WithLinks(trace.Link{SpanContext: psc, Attributes: []attribute.KeyValue{AttrLinkRelation.String(linkProducer)}}))
	case fromProducer:
		pctx, span = h.t.tracer.Start(pctx, h.name, childOpts...)
	default:
		// No producer context: a trace of its own, never a child of
		// whatever span the consumer's Run ctx carries.
		pctx, span = h.t.tracer.Start(pctx, h.name, rootOpts...)
	}
	if !span.IsRecording() {
		return pctx
	}
	o := m.Origin
	attrs := make([]attribute.KeyValue, 0, 14)
	if sys := h.t.system(o); sys != "" {
		attrs = append(attrs, semconv.MessagingSystemKey.String(sys))
	}
	attrs = append(attrs, semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"),
		semconv.MessagingDestinationName(m.Topic), semconv.MessagingMessageBodySize(len(m.Value)),
		h.route, AttrAttempt.Int(max(m.Attempt, 1)), AttrCriticality.String(m.Criticality().String()))
	if o.Group != "" {
		attrs = append(attrs, semconv.MessagingConsumerGroupName(o.Group))
	}
	switch {
	case o.Stream != "":
		attrs = append(attrs, AttrStream.String(o.Stream), AttrSequence.Int64(int64(min(o.Sequence, 1<<63-1))))
	case o.Partition >= 0 && o.Topic != "":
		attrs = append(attrs, semconv.MessagingDestinationPartitionID(strconv.Itoa(int(o.Partition))),
			semconv.MessagingKafkaOffset(int(o.Offset)))
	}
	span.SetAttributes(attrs...)
	if w.Window > 0 {
		span.AddEvent(EventWindowWait, trace.WithAttributes(AttrWait.Float64(w.Window.Seconds())))
	}
	if w.Throttle > 0 {
		span.AddEvent(EventThrottled, trace.WithAttributes(AttrWait.Float64(w.Throttle.Seconds())))
	}
	return pctx
}

// Event records the route's decisions on m's span, and ends it with the
// settlement.
func (h *routeHook) Event(ctx context.Context, m *consumer.Message, e consumer.Event) {
	span := trace.SpanFromContext(ctx)
	if e.Kind == consumer.EventLetter && e.Letter != nil {
		if sc := span.SpanContext(); sc.IsValid() {
			// Only the span: the baggage is in the letter's original headers.
			c := propagation.MapCarrier{}
			h.t.prop.Inject(trace.ContextWithSpanContext(context.Background(), sc), c)
			if len(c) > 0 {
				e.Letter.Trace = c
			}
		}
	}
	if !span.IsRecording() {
		if e.Kind == consumer.EventSettled {
			span.End()
		}
		return
	}
	switch e.Kind {
	case consumer.EventStart:
		if d, ok := m.Deadline(); ok {
			span.SetAttributes(AttrDeadline.String(d.UTC().Format(time.RFC3339Nano)))
		}
		span.AddEvent(EventHandlerStart, trace.WithAttributes(AttrQueued.Float64(e.Elapsed.Seconds())))
	case consumer.EventEnd:
		span.AddEvent(EventHandlerEnd, trace.WithAttributes(AttrHandlerTime.Float64(e.Elapsed.Seconds())))
		if e.Err != nil {
			span.RecordError(e.Err)
			span.SetAttributes(semconv.ErrorTypeKey.String(errorType(e.Err)))
			span.SetStatus(codes.Error, firstLine(e.Err.Error()))
		}
	case consumer.EventShed:
		span.AddEvent(EventShed, trace.WithAttributes(AttrShedReason.String(e.Shed.String()),
			AttrCriticality.String(m.Criticality().String())))
	case consumer.EventLetter:
		attrs := []attribute.KeyValue{AttrClass.String(e.Class), AttrSink.Bool(e.Letter != nil)}
		if e.Err != nil {
			attrs = append(attrs, semconv.ExceptionMessage(firstLine(e.Err.Error())))
		}
		span.AddEvent(EventDeadLetter, trace.WithAttributes(attrs...))
	case consumer.EventSettled:
		h.settled(span, e)
	}
}

func (h *routeHook) settled(span trace.Span, e consumer.Event) {
	defer span.End()
	span.SetAttributes(AttrOutcome.String(e.Outcome.String()), AttrSettlement.String(e.Settlement.Op.String()))
	switch e.Outcome {
	case consumer.OutcomeRetried, consumer.OutcomeOverloaded:
		span.AddEvent(EventRetry, trace.WithAttributes(AttrDelay.Float64(e.Settlement.Delay.Seconds()),
			AttrOutcome.String(e.Outcome.String())))
	case consumer.OutcomeExpired:
		span.AddEvent(EventExpired)
	case consumer.OutcomeReturned:
		span.AddEvent(EventReturned)
	case consumer.OutcomeAbandoned:
		span.AddEvent(EventAbandoned)
	case consumer.OutcomeTerminated:
		span.AddEvent(EventTerminated, trace.WithAttributes(AttrReason.String(e.Settlement.Reason)))
	case consumer.OutcomeDLQFailed:
		span.AddEvent(EventLetterFailed, trace.WithAttributes(AttrDelay.Float64(e.Settlement.Delay.Seconds())))
		span.SetStatus(codes.Error, "dead-letter write failed")
	}
	if e.Err != nil {
		span.AddEvent(EventSettleFailed, trace.WithAttributes(semconv.ExceptionMessage(firstLine(e.Err.Error()))))
		span.SetStatus(codes.Error, "settlement failed: "+firstLine(e.Err.Error()))
	}
}

// BatchStart implements consumer.BatchHook: a batch handler's run is a
// span of its own, "process <route> batch", the root of a new trace (it
// is not the child of any one message), linked to the span of each of its
// messages (sluice.link "batched"); each message's span records the
// handler's start and end as for a Handler.
func (h *routeHook) BatchStart(ctx context.Context, b *consumer.Batch, msgCtxs []context.Context) context.Context {
	links := make([]trace.Link, 0, len(msgCtxs))
	for _, c := range msgCtxs {
		if sc := trace.SpanContextFromContext(c); sc.IsValid() {
			links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{AttrLinkRelation.String(linkBatched)}})
		}
	}
	ctx, _ = h.t.tracer.Start(ctx, h.name+" batch", kindConsumer, trace.WithNewRoot(), trace.WithLinks(links...),
		trace.WithAttributes(h.route, semconv.MessagingOperationTypeProcess, semconv.MessagingBatchMessageCount(b.Len()),
			AttrBatchSize.Int(b.Len()), AttrBatchBytes.Int64(b.Bytes())))
	return ctx
}

// BatchEnd implements consumer.BatchHook: it ends the batch's span.
func (h *routeHook) BatchEnd(ctx context.Context, info consumer.BatchInfo) {
	span := trace.SpanFromContext(ctx)
	defer span.End()
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(AttrBatchLinger.Float64(info.Linger.Seconds()), AttrHandlerTime.Float64(info.Latency.Seconds()))
	if info.Err != nil {
		span.RecordError(info.Err)
		span.SetAttributes(semconv.ErrorTypeKey.String(errorType(info.Err)))
		span.SetStatus(codes.Error, firstLine(info.Err.Error()))
	}
}

// errorType is error.type for a handler's error: how sluice treats it.
func errorType(err error) string {
	switch {
	case errors.Is(err, consumer.ErrPanic):
		return "panic"
	case consumer.IsPermanent(err):
		return "permanent"
	case backpressure.IsOverloaded(err):
		return "overloaded"
	case errors.Is(err, context.DeadlineExceeded):
		return "deadline"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return "retryable"
}
