// Package adaptertest is the one suite every broker adapter must pass (the
// idea of Watermill's tests.TestPubSub): the same cases, run on each broker
// through a small Broker interface, so "works on NATS" and "works on Kafka"
// mean the same thing. The cases check the lifecycle invariant end to end:
// every published message is handled and settled, dead-lettered or counted
// expired, none is lost across a consumer restart, and the route's window
// bounds what is held while a backlog waits in the broker.
package adaptertest
