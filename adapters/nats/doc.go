// Package natsadapter connects sluice to NATS JetStream: a Source over a
// pull consumer and a dead-letter Sink that publishes to a stream.
//
// The directory is named nats, but the package is natsadapter so it does
// not collide with github.com/nats-io/nats.go. Import it as
//
//	natsadapter "github.com/sluice-go/sluice/adapters/nats"
//
// Acks are confirmed by the server (DoubleAck) by default. The consumer
// returns window capacity only after a delivery is settled, and
// at-least-once processing needs to know the ack really landed: a plain Ack
// that is lost leads to a redelivery the consumer cannot see coming. Set
// SourceOptions.AckAsync to trade that confirmation for throughput.
package natsadapter
