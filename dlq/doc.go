// Package dlq defines sluice's dead-letter envelope, the same on every
// broker, and the Sink interface a consumer writes dead letters through.
//
// A dead letter is the original message untouched (key, value, headers)
// plus why it died, carried in headers that start with "Sluice-Dlq-" so they
// never collide with the application's own:
//
//	Sluice-Dlq-Error          error text (truncated to 1 KiB)
//	Sluice-Dlq-Class          error class: "permanent", "exhausted", "oversize", "malformed"...
//	Sluice-Dlq-Attempts       delivery attempts made
//	Sluice-Dlq-First-Failure  RFC 3339 time of the first failure
//	Sluice-Dlq-Last-Failure   RFC 3339 time of the last failure
//	Sluice-Dlq-Origin-Topic   topic or subject it was consumed from
//	Sluice-Dlq-Origin-Stream  JetStream stream (NATS only)
//	Sluice-Dlq-Origin-Partition, Sluice-Dlq-Origin-Offset  (Kafka only)
//	Sluice-Dlq-Origin-Sequence  stream sequence (NATS only)
//	Sluice-Dlq-Group          consumer group or durable name
//	Sluice-Dlq-Route          sluice route name
//	Sluice-Dlq-Version        sluice version that wrote it
//	Sluice-Dlq-Replays        how many times it was replayed already
//
// Letter.Headers encodes a Letter; Decode reads one back. The original
// message's order is kept: the original headers come first, unchanged.
//
// The consumer acks (or terms) the original only after Sink.Write returned
// nil, that is after the broker confirmed the dead letter. If Write fails
// the original is nak'd and redelivered, so a dead letter is never lost.
package dlq
