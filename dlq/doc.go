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
//
// # Replay
//
// A Replayer moves letters from a Source (the adapters' dead-letter
// readers, or any backlog) to a Target (the origin topic by default) at a
// paced rate: letters go in batches of Burst, each batch on the grid of an
// x/time/rate token bucket plus a full-jitter delay, so the rate holds on
// coarse timers and replayers started together do not fire together. A
// letter is removed from the source only after the target confirmed its
// republish, so a replay stopped at any point resumes with what is left.
//
// The republished message is the original key, value and headers without
// the envelope, plus HeaderReplayCount (Sluice-Replay-Count) = Replays+1.
// That header is not part of the envelope, so a consumer that dead-letters
// the message again keeps it, and Decode reads it back into Replays: a
// letter replayed ReplayOptions.MaxReplays times goes to the Park sink
// instead of looping. The stale deadline header is replaced (or dropped)
// by ReplayOptions.Deadline so replayed work is not expired on arrival.
//
// Filter selects letters by last failure time, class, origin and route;
// ParseFilter reads the CLI's "class=permanent origin=orders.* since=2h".
// Tally counts letters by origin and class for listings.
//
// Backlog drain: the same Replayer drains any stream into a target at a
// paced rate when its Source yields plain messages as letters (the NATS
// adapter's LetterSource with Backlog set). To slow a route's own
// consumption of its backlog in place, wrap its consumer.Source with
// package drain instead.
package dlq
