// Package sluicetest helps test code that runs on sluice without a broker:
// an in-memory Source with a settlement ledger, an in-memory dead-letter
// Sink with failure injection, and helpers to run a Consumer until its
// routes have settled what you expect.
//
// The Source is deterministic: it hands out messages in order, and a Nak
// puts the message back at the tail (after its delay only with HonorDelay)
// with its attempt increased, so redelivery is reproducible. It plays the
// broker features the core reacts to: an ack deadline (AckWait), a delivery
// limit (MaxDeliver, dropping a message nak'd on its last delivery the way
// JetStream does), and settlements confirmed later (Confirm).
//
// For a consumer.BatchHandler, RunBatch runs the handler once on messages
// built with Messages and reports how each would settle (its Batch.Fail
// mark or the handler's error); the route around it (window, deadlines,
// retries) is tested by running a Consumer on the Source, as for a Handler.
//
// For the framework's own cost, BenchCorePath benchmarks the consumer's
// path without a broker, and AllocsPerMessage counts what that path
// allocates per message (consumer's TestCorePathAllocatesNothingPerMessage
// holds it at zero).
//
// Broker behaviour itself is tested against real brokers: see
// adapters/nats/natstest (an embedded nats-server) and
// adapters/kafka/kafkatest (an in-process kfake cluster or a real Kafka).
package sluicetest
