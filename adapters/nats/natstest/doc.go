// Package natstest starts an in-process NATS server with JetStream for
// tests and examples.
package natstest
