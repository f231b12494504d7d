// Command fleet is one instance of a sluice consumer meant to run as many
// processes on one Kafka consumer group or one JetStream durable: the
// brokers' groups spread the work, each instance keeps its own window.
//
// Its handler costs a fixed wait (-cost) on each of -workers goroutines, so
// one instance's capacity is known: workers / cost messages per second
// (4 / 8 ms = 500 msg/s by default). SIGTERM (or Ctrl-C) stops it
// gracefully: running handlers finish within -shutdown-grace, their
// settlements are committed (Kafka) or confirmed (NATS), and it leaves the
// group.
//
//	go run ./examples/fleet -broker kafka -brokers 127.0.0.1:9092 -topic orders -group fleet
//	go run ./examples/fleet -broker nats -nats nats://127.0.0.1:4222 -stream ORDERS -durable fleet
//
// With -downstream URL the handler calls that URL instead of waiting, and a
// 503 answer is an overloaded error; -adaptive and -throttle give the route
// an AdaptiveLimit and a Throttle, so each instance controls its own load
// on a downstream the whole fleet shares (docs/fleet.md).
//
// With -report it writes a line protocol on stdout that the fleet harness
// (internal/fleet, docs/fleet.md) reads to keep its ledger: which message
// each instance handled and settled, and the most it held at once.
package main
