// Command bulkinsert writes orders from a broker into PostgreSQL, one bulk
// write per batch: a sluice route with a BatchHandler that COPYs a batch
// into a staging table and moves it with INSERT … ON CONFLICT DO NOTHING,
// so a redelivered order is written once (the table's primary key makes
// every write idempotent). An order that cannot be decoded is marked with
// Batch.Fail and dead-lettered alone; the rest of its batch is acked after
// the commit.
//
//	go run ./examples/bulkinsert                  # batch route, embedded NATS and PostgreSQL
//	go run ./examples/bulkinsert -mode single     # the same with one INSERT per message
//	go run ./examples/bulkinsert -mode compare    # interleaved pairs of both: the throughput ratio
//	go run ./examples/bulkinsert -dsn postgres://user:pass@host/db
//
// Without -dsn it starts an embedded PostgreSQL (fergusstrange/
// embedded-postgres; the binaries are fetched once from Maven Central into
// SLUICE_PG_CACHE, default ~/.cache/sluice-postgres). PostgreSQL refuses to
// run as root, so as root the server runs as the user nobody (see pg.go).
// The broker is an embedded NATS JetStream server; the tests also run the
// route on Kafka (kfake).
package main
