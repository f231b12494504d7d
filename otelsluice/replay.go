package otelsluice

import (
	"context"
	"errors"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluice-go/sluice/dlq"
)

// Replay runs r from src to dst (dlq.Replayer.Run) inside a "replay" span,
// the replay run, with every republish traced by ReplayTarget. The run's
// span ends with what the replay did (sluice.replay.* counts) and, when it
// failed, its error.
func (t *Tracer) Replay(ctx context.Context, r *dlq.Replayer, src dlq.Source, dst dlq.Target) (dlq.Progress, error) {
	ctx, span := t.tracer.Start(ctx, "replay", trace.WithSpanKind(trace.SpanKindInternal))
	defer span.End()
	p, err := r.Run(ctx, src, t.ReplayTarget(dst))
	span.SetAttributes(
		attribute.Int("sluice.replay.replayed", p.Replayed),
		attribute.Int("sluice.replay.parked", p.Parked),
		attribute.Int("sluice.replay.refused", p.Refused),
		attribute.Int("sluice.replay.held", p.Held),
		attribute.Int("sluice.replay.skipped", p.Skipped),
		attribute.Int("sluice.replay.malformed", p.Malformed),
		attribute.Int("sluice.replay.unremoved", p.Unremoved),
	)
	if err != nil && !errors.Is(err, context.Canceled) {
		span.RecordError(err)
		span.SetStatus(codes.Error, firstLine(err.Error()))
	}
	return p, err
}

// ReplayTarget wraps dst so each republish is a producer span ("send
// <destination>") whose context the republished message carries (its
// traceparent is replaced, its baggage kept): the consumer that takes the
// replayed message continues from it.
//
// The span continues the original trace: a child of the processing that
// dead-lettered the letter (dlq.Letter.Trace) or, for a letter without
// one, of the producer's span in its headers; it links to the replay run
// (the span in Publish's ctx: see Replay) and to the producer. With
// Options.ReplayNewTrace it is a child of the replay run instead, linked
// to both. A letter that carries no context at all starts from the run.
//
// The wrapper is a dlq.BatchTarget when dst is one.
func (t *Tracer) ReplayTarget(dst dlq.Target) dlq.Target {
	w := &replayTarget{t: t, dst: dst}
	if bt, ok := dst.(dlq.BatchTarget); ok {
		return &replayBatchTarget{replayTarget: w, bt: bt}
	}
	return w
}

type replayTarget struct {
	t   *Tracer
	dst dlq.Target
}

type replayBatchTarget struct {
	*replayTarget
	bt dlq.BatchTarget
}

// Publish traces one republish.
func (w *replayTarget) Publish(ctx context.Context, m *dlq.Outgoing) error {
	span := w.start(ctx, m)
	err := w.dst.Publish(trace.ContextWithSpan(ctx, span), m)
	end(span, err)
	return err
}

// PublishBatch traces each republish of a batch.
func (w *replayBatchTarget) PublishBatch(ctx context.Context, ms []*dlq.Outgoing) []error {
	spans := make([]trace.Span, len(ms))
	for i, m := range ms {
		spans[i] = w.start(ctx, m)
	}
	errs := w.bt.PublishBatch(ctx, ms)
	for i, s := range spans {
		var err error
		if errs != nil {
			err = errs[i]
		}
		end(s, err)
	}
	return errs
}

func end(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, firstLine(err.Error()))
	}
	span.End()
}

// start starts m's replay span and writes its context into m.Headers.
func (w *replayTarget) start(ctx context.Context, m *dlq.Outgoing) trace.Span {
	t := w.t
	run := trace.SpanContextFromContext(ctx)
	var orig context.Context = context.Background()
	var failed trace.SpanContext
	if l := m.Letter; l != nil {
		orig = t.prop.Extract(orig, HeaderCarrier(l.Headers))
		if len(l.Trace) > 0 {
			failed = trace.SpanContextFromContext(t.prop.Extract(context.Background(), propagation.MapCarrier(l.Trace)))
		}
	}
	producer := trace.SpanContextFromContext(orig)
	parent := run
	if !t.opts.ReplayNewTrace {
		switch {
		case failed.IsValid():
			parent = failed
		case producer.IsValid():
			parent = producer
		}
	}
	var links []trace.Link
	link := func(sc trace.SpanContext, rel string) {
		if sc.IsValid() && !sc.Equal(parent) {
			links = append(links, trace.Link{SpanContext: sc, Attributes: []attribute.KeyValue{AttrLinkRelation.String(rel)}})
		}
	}
	link(run, linkReplayRun)
	link(failed, linkDeadLetter)
	link(producer, linkProducer)

	// The span's parent context, with the original baggage (injected into
	// the republished message with the span).
	pctx := baggage.ContextWithBaggage(context.Background(), baggage.FromContext(orig))
	opts := []trace.SpanStartOption{trace.WithSpanKind(trace.SpanKindProducer), trace.WithLinks(links...)}
	if parent.IsValid() {
		pctx = trace.ContextWithSpanContext(pctx, parent)
	} else {
		opts = append(opts, trace.WithNewRoot())
	}
	attrs := []attribute.KeyValue{
		semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("send"),
		semconv.MessagingDestinationName(m.Topic), semconv.MessagingMessageBodySize(len(m.Value)),
		AttrLetterPos.String(m.Pos),
	}
	if l := m.Letter; l != nil {
		if sys := t.system(l.Origin); sys != "" {
			attrs = append(attrs, semconv.MessagingSystemKey.String(sys))
		}
		attrs = append(attrs, AttrClass.String(l.Class), AttrReplayCount.Int(l.Replays+1))
	}
	opts = append(opts, trace.WithAttributes(attrs...))
	sctx, span := t.tracer.Start(pctx, "send "+m.Topic, opts...)
	if m.Headers != nil {
		t.prop.Inject(sctx, HeaderCarrier(m.Headers))
	}
	return span
}
