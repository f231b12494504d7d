// Command service is sluice as a long-running service, shaped to be run as
// several instances side by side: every instance joins the same JetStream
// durables ("orders", "reports") and, with $KAFKA_BROKERS set, the same
// Kafka consumer group ("sluice-service" on topic "payments", 6
// partitions), so the brokers share the work among the instances. Each
// instance also produces a steady load of its own into both brokers
// (-rate orders per second, a fifth as many reports, as many payments), so
// starting more instances adds load and capacity together.
//
//	NATS_URL=nats://127.0.0.1:4222 METRICS_ADDR=127.0.0.1:9466 go run ./examples/service
//	NATS_URL=nats://127.0.0.1:4222 KAFKA_BROKERS=127.0.0.1:9092 METRICS_ADDR=127.0.0.1:9467 go run ./examples/service
//
// Without $NATS_URL it starts an embedded NATS server of its own (then the
// instance is alone). It serves Prometheus metrics on $METRICS_ADDR
// (default 127.0.0.1:0; the address is printed), and there too the health
// a platform probes (package health): /healthz, 503 once a route has been
// stuck or failed for -liveness-grace, and /readyz, 503 while a route is
// not ready (-stuck-after sets when a route counts as stuck). With
// -healthcheck it only probes a running instance's /healthz on
// $METRICS_ADDR and exits 0 or 1 (the compose file's healthcheck). It runs
// until SIGINT or SIGTERM (or -run D), then shuts down gracefully and
// prints a table per route.
//
// The routes: orders (critical, 8 workers, a poison order in 200 goes to
// the dead-letter stream, 1% fail once and are retried), reports
// (sheddable, slow: 2 workers of 20 ms under an adaptive concurrency
// limit; their 2 s deadlines expire when reports pile up) and payments
// (Kafka, 4 workers, a retry budget).
//
// The docker-compose stack runs three replicas of it (docker compose
// --profile fleet up -d); Prometheus finds them by DNS and the Grafana
// dashboard shows one series per instance. docs/stack.md tells more.
package main
