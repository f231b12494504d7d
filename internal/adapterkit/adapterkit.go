package adapterkit

// AckerOf returns the consumer.Acker a *consumer.Message was built with, or
// nil. The consumer package sets it at init; it is typed with any so that
// this package does not import consumer.
var AckerOf func(m any) any
