// Package adapterkit lets sluice's own adapters reach what the core keeps
// from handlers: the Acker a Message was built with (natsadapter.MetadataOf
// needs its delivery back). It is internal, so user code cannot settle a
// message behind the consumer's back.
package adapterkit
