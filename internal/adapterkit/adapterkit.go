// Package adapterkit lets sluice's own adapters reach what the core keeps
// from handlers: the Acker a Message was built with (natsadapter.MetadataOf
// needs its delivery back). It is internal, so user code cannot settle a
// message behind the consumer's back.
package adapterkit

// AckerOf returns the consumer.Acker a *consumer.Message was built with, or
// nil. The consumer package sets it at init; it is typed with any so that
// this package does not import consumer.
var AckerOf func(m any) any
