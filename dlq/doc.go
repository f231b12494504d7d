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
//	Sluice-Dlq-Park-Reason    why a replay parked it (loop guard, destination refused)
//	Sluice-Dlq-Truncated      what was cut to fit the store (never replayed then)
//	Sluice-Dlq-Packed-Headers original headers too large for the broker's header
//	                          limit: they take this many first bytes of the value
//	Sluice-Dlq-Trace-<field>  trace context of the processing that dead-lettered it
//	                          (Letter.Trace, set by a tracing hook: package otelsluice)
//
// Letter.EnvelopeHeaders encodes a Letter's headers; Letter.Encode makes
// the whole letter fit a broker's limits (a message that fit its origin
// must not be refused by the dead-letter store because of the envelope);
// Decode reads one back. The original headers are kept unchanged.
//
// The consumer acks (or terms) the original only after Sink.Write returned
// nil, that is after the broker confirmed the dead letter. If Write fails
// the original is nak'd and redelivered, so a dead letter is never lost.
//
// # Replay
//
// A Replayer moves letters from a Source (the adapters' dead-letter
// readers, or any backlog) to a Target at a paced rate: letters go in small
// batches (5 ms worth), each on the grid of an x/time/rate token bucket
// plus a full-jitter delay, so the pace is even at any scale one measures
// and replayers started together do not fire together; batches start on
// their slots while earlier ones are still in flight (up to Concurrency),
// so a target's latency does not lower the rate. A letter is removed from
// the source only after the target confirmed its republish, so a replay
// stopped at any point resumes with what is left.
//
// Where a replay publishes is the operator's decision, never the letter's:
// a letter's origin header is written by whoever can write the dead-letter
// store. ReplayOptions.Allow (patterns), Destination (a function) or Topic
// (one destination for all) say where replay may publish; without any of
// them Run moves nothing and names the destinations the letters ask for.
// CheckDestination refuses "$" subjects (the server's APIs), "_INBOX"
// subjects and Kafka's "__" topics whatever the policy. A refused letter
// (and one the target cannot take, ErrUndeliverable, and one truncated to
// fit its store) is parked with its reason, and the run goes on.
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
