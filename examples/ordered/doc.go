// Command ordered shows per-key ordering on a sluice route: account events
// (each carries its account's running sequence number) are applied by the
// same handler under three orderings, each on its own JetStream durable of
// one stream, with a downstream that fails 3% of first attempts:
//
//   - Unordered: all 8 workers in parallel, and a failed event is nak'd
//     and comes back after the account's later events: events apply out of
//     order.
//
//   - ByPartition: the stream's events one at a time: in order, slow.
//
//   - ByKey (the account is the key: the subject accounts.<id>): accounts
//     in parallel on all 8 workers, each account's events in order; a
//     failed event is retried in place while its account waits.
//
//     go run ./examples/ordered
//
// It starts an embedded NATS server unless $NATS_URL is set, and prints
// one line per ordering: time, events applied out of order, retries, and
// the most events its handler ran at once.
package main
