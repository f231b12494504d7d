// Package brokerstory holds only tests: otelsluice's traced story (see
// otelsluice/internal/storytest) on the embedded NATS server and on kfake
// (or $KAFKA_BROKERS). It is a module of its own so that otelsluice's
// go.mod does not require the adapters, nats-server and kfake: a user of
// otelsluice gets OpenTelemetry and the core. The module is never published;
// `go test work` runs it.
package brokerstory
