// Command sluice inspects and replays sluice dead letters on NATS
// JetStream and Kafka.
//
//	sluice dlq ls      counts by origin and error class
//	sluice dlq show    one letter with its metadata
//	sluice dlq replay  paced, jittered replay into the origin (or --to)
//	sluice dlq purge   delete letters (asks for --yes)
//
// Run "sluice dlq replay --help" for the replay's flags.
//
// Against the quick start's dead letters on a fresh clone:
//
//	go run ./examples/quickstart -store /tmp/qs
//	go run ./cmd/sluice dlq ls --nats-store /tmp/qs
//	go run ./cmd/sluice dlq replay --nats-store /tmp/qs --rate 5/s
//
// Exit status: 0 on success, 1 when the command failed, 2 for a bad flag or
// argument.
package main
