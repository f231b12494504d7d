// Package memsource is a deterministic in-memory consumer.Source with a
// settlement ledger, for the core's unit tests and benchmarks only. It is a
// fixture like a fake clock: broker behaviour is tested against real
// brokers in the adapter packages.
package memsource
