// Command quickstart runs two sluice routes over NATS JetStream under a
// burst far above their capacity: critical orders and sheddable reports,
// each with its own window and workers, dead letters to a JetStream stream.
//
//	go run ./examples/quickstart
//
// It starts an embedded NATS server unless $NATS_URL is set, keeping its
// JetStream store in -store DIR if given (so the dead letters outlive the
// run: "go run ./cmd/sluice dlq ls --nats-store DIR"), else in a temporary
// directory removed at exit. It serves
// Prometheus metrics on $METRICS_ADDR (default 127.0.0.1:0, printed), and
// prints a table per route when orders are all settled or after 20 s.
package main
