// Package otelsluice traces messages through sluice with OpenTelemetry:
// from the producer's span, through every attempt, the decisions sluice
// makes without the handler, the dead letter and the replay, to the run
// that finally succeeds, in one connected trace.
//
// A Tracer is a consumer.Hook:
//
//	tc := otelsluice.New(otelsluice.Options{}) // the global provider and propagator
//	c, err := consumer.New(consumer.Options{Hook: tc}, routes...)
//
// The core (consumer, dlq) imports no OpenTelemetry package; without a
// Hook it does nothing for tracing and costs nothing. With this package on
// and OpenTelemetry's no-op tracer provider, a message costs one extra
// allocation (BenchmarkCorePathNoopTracer).
//
// # Consumer spans
//
// Each delivery gets one span, "process <route>" (SpanKindConsumer), from
// the moment the route takes it in until its settlement is done, so its
// length is the time sluice held the message: queued, waiting for a slot,
// running, settling. The producer's context is read from the message
// headers through Options.Propagator (W3C traceparent and baggage with the
// usual composite propagator): the span is the producer span's child, or
// with Options.Link the root of a trace of its own linked to it. A message
// without a context starts a new trace (never a child of the span the
// consumer's Run ctx may carry). The handler's ctx carries the span and
// the producer's baggage, so the handler's own spans nest under it; Inject
// writes that context into a message the handler publishes.
//
// Attributes follow the OpenTelemetry messaging conventions (semconv
// v1.40.0): messaging.system ("nats", "kafka"), messaging.operation.type
// "process", messaging.destination.name (subject or topic),
// messaging.consumer.group.name (group or durable),
// messaging.destination.partition.id and messaging.kafka.offset on Kafka,
// messaging.message.body.size; with sluice's own: sluice.route,
// sluice.attempt (the delivery attempt), sluice.criticality,
// sluice.jetstream.stream and sluice.jetstream.sequence on JetStream, and
// when it ends sluice.outcome (consumer.Outcome) and sluice.settlement
// (what the broker was told: ack, nak, term, none).
//
// A route with a consumer.BatchHandler also gets one span per batch run,
// "process <route> batch", the root of a trace of its own linked to each
// of its messages' spans (sluice.link "batched"), with
// messaging.batch.message_count, sluice.batch.size, sluice.batch.bytes,
// sluice.batch.linger.seconds and sluice.handler.seconds; the batch
// handler's ctx carries it. Each message's span records the handler's
// start and end and its own outcome as with a Handler.
//
// sluice's decisions are span events: sluice.window_wait and
// sluice.throttled (how long the route waited for its window, or was held
// back by its Throttle, before the fetch that brought the message),
// sluice.handler.start (with the time queued) and sluice.handler.end (with
// the handler's time), sluice.shed (reason and class), sluice.retry (the
// nak's delay), sluice.dead_letter (class; sink false when the route has
// none and terminates), sluice.dead_letter.failed, sluice.expired (with no
// sluice.handler.start before it: expired without running),
// sluice.returned, sluice.abandoned, sluice.settle.failed. A handler error
// is recorded as an exception with error.type ("retryable", "permanent",
// "overloaded", "panic", "deadline", "canceled") and sets the span's
// status to Error; so do a failed dead-letter write and a settlement the
// broker refused.
//
// # Retries, dead letters, replay
//
// A redelivery (NATS nak) and a Kafka retry-topic copy keep the original
// headers, so every attempt is a child of the same producer span, told
// apart by sluice.attempt. A dead letter keeps the original headers (the
// producer's context) and carries the context of the span that
// dead-lettered it in its envelope (dlq.Letter.Trace, the
// Sluice-Dlq-Trace-* headers).
//
// Replay runs a dlq.Replayer inside a "replay" span (the replay run).
// Each republish is a "send <destination>" span (SpanKindProducer),
// written into the republished message's headers (its traceparent is
// replaced, its baggage kept): a child of the span that dead-lettered the
// letter (else of the producer's), linked to the replay run and to the
// producer. So the replayed message's processing continues the original
// trace. Options.ReplayNewTrace makes the republish a child of the replay
// run instead, linked to both. ReplayTarget wraps a Target alone, for
// replays run without Replay.
//
// Trace contexts read from messages and letters are untrusted input like
// any header: they choose which trace a span joins, nothing else.
package otelsluice
