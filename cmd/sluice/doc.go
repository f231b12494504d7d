// Command sluice inspects and replays sluice dead letters on NATS
// JetStream and Kafka.
//
//	sluice dlq ls      counts by origin and error class
//	sluice dlq show    one letter with its metadata
//	sluice dlq replay  paced, jittered replay into origins --allow admits (or --to)
//	sluice dlq purge   delete letters (counts first; --yes --upto N deletes them)
//
// Run "sluice dlq replay --help" for the replay's flags. Every subcommand
// takes the same connection flags: for NATS the nats CLI's (--server,
// --creds, --nkey, --user/--password, --token, --tlscert/--tlskey/--tlsca,
// --tlsfirst, --js-domain, --js-api-prefix, --inbox-prefix, --timeout,
// --context and the NATS_* variables), for Kafka kcat's (-b, -X key=value,
// -F properties file). Secrets never appear in its output, and --output
// json makes ls, show and the replay summary machine-readable.
//
// Against the quick start's dead letters on a fresh clone:
//
//	go run ./examples/quickstart -store /tmp/qs
//	go run ./cmd/sluice dlq ls --nats-store /tmp/qs
//	go run ./cmd/sluice dlq replay --nats-store /tmp/qs --allow 'orders.>' --rate 5/s
//
// Exit status: 0 on success, 1 when the command failed, 2 for a bad flag or
// argument (also a replay without --allow or --to, dry run or not); a
// replay that ran to its end exits 3 when it replayed some of the letters
// it selected and parked or left others (refused, over --max-replays,
// malformed), 4 when it replayed none of them, and a dry run exits as the
// real run would. A signal exits 128 + its number: 130 for Ctrl-C
// (SIGINT), 143 for SIGTERM; an interrupted replay prints the command that
// resumes it on its own line, with secrets left out and a line saying how
// to give each back (the variable sluice reads it from, or the flag to
// add).
package main
