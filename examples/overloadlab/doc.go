// Command overloadlab shows, on a real broker, what sluice does for a
// consumer offered more than it can handle: it runs the same handler (a
// sleep of -cost per message, so capacity is emulated honestly on a small
// machine: an I/O-bound handler, not one competing for CPU with the broker)
// behind four consumers and prints one table row for each per load step.
//
//	go run ./examples/overloadlab -out docs/lab          # ~4 min: steps 0.5,1,2,5,10 × capacity
//	go run ./examples/overloadlab -quick                 # ~40 s smoke run
//	go run ./examples/overloadlab -mode all -out docs/lab
//	go run ./examples/overloadlab -broker kafka          # the same on Kafka (kfake)
//	go run ./examples/overloadlab -mode grid -quick      # the grid's short form (CI)
//	go run ./examples/overloadlab -mode grid -out docs/lab/grid   # the full grid, ~1 h per broker
//
// The four consumers, side by side in every table and plot:
//
//   - unprotected: what a plain client gives: nats.go's jetstream Consume
//     (or a kafka-go Reader) pulling everything the broker has into an
//     unbounded in-process FIFO, no expiry check, the same workers and cost.
//   - plain bounded queue: seed 002's protected consumer without sluice: the
//     same client into a queue of -queue (50) messages that drops an
//     arrival when full (tail drop, acked) and checks the deadline before
//     running a message. The best simple alternative, in forty lines.
//   - sluice minimal: one route with the least configuration the API takes
//     (Name, Source, Handler, the deadline header, and the numbers the
//     README's "Use" section shows where the API requires them).
//   - sluice tuned: the minimal route plus what the documentation advises
//     an experienced user to set: the window left to find its size (as
//     Window.Messages's godoc advises; -window fixes one), no
//     ShedNearDeadline (predictive expiry decides; -margin sets the
//     explicit floor), shed and expired messages acked, one attempt,
//     CriticalPlus, and the Source's throughput options (NATS: a 100 ms
//     poll wait, unconfirmed acks; Kafka: shorter fetch, poll and commit
//     intervals). Until 2026-12-03 it held a fixed window of 2×workers and
//     a start-by margin of max(2×cost, deadline/5), which the grid found
//     worse than the minimal route (docs/lab.md).
//
// First the lab measures capacity (the raw consumer draining a backlog
// without deadlines), then for each step it offers load × capacity msg/s
// open loop for -step-duration to each consumer in turn, on a fresh stream,
// and reports goodput (successes within the deadline that finished after a
// warm-up, -warmup, and while the load was offered, per second: the steady
// state), p50/p99 latency of successful runs
// (publish to done), handler runs started on already-expired messages, runs
// that finished late or were cut off, messages expired without a run,
// drops, what was left in the queue, peak in-flight and peak heap (the
// lab process; the broker runs in a child process). With -out it writes the
// tables and steps.png (goodput and p99 against offered load, drawn with
// gonum/plot).
//
// -mode drop compares drop policies (tail, head, LIFO + drop oldest,
// random, by criticality; on the route's local queue and, on NATS, as
// stream limits) in the shape of seed 002's table, with 20% of the messages
// CRITICAL; -mode backpressure offers 500 msg/s to a ~150 msg/s consumer
// through an unbounded stream and through a stream bounded at 100 with a
// blocking put; -mode isolation measures a critical route's latency while
// a sheddable route's handler is stuck; -mode all runs those four.
//
// -mode grid runs every consumer at every load of -grid-loads for every
// handler (-grid-workers × -grid-costs, each with its measured capacity)
// and deadline (-grid-deadlines), and writes grid.txt (goodput as % of
// capacity and p99 per cell, and whether sluice's minimal route meets issue
// 11's target), grid.csv and grid.png (a heat map per consumer). -quick is
// its short form. -mode degrade offers 5× and then 0.5× to a handler with a
// 20 ms full path and a 4 ms degraded one; -mode cpu runs a CPU-bound
// handler (a calibrated busy loop) at 3× and reports process CPU; -mode
// cost offers a mix of 1 ms and 100 ms messages that declare their cost in
// the Sluice-Cost header; -mode loadstep offers 1× capacity, then 5×, then
// 1× again (-ls-*) and plots each consumer's sojourn (publish to handler
// start) and p99 over time (issue 26), by default for the unprotected
// consumer, the plain bounded queue and the minimal route.
//
// -broker nats (default) starts nats-server in a child process of the lab
// (-nats-in-process embeds it), or uses -nats-url / $NATS_URL (for example
// the docker-compose NATS at nats://127.0.0.1:4222). -broker kafka starts
// kfake the same way, or uses $KAFKA_BROKERS (the docker-compose Kafka at
// 127.0.0.1:9092); sluice reads through adapters/kafka, the unprotected
// consumer through a plain kafka-go Reader. -broker memory runs the
// handler model on sluicetest without a broker round trip. With
// -metrics-addr / $METRICS_ADDR the lab serves every sluice route's
// Prometheus metrics (each trial is its own route).
package main
