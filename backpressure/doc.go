// Package backpressure holds sluice's admission primitives: the Window that
// bounds one route's in-flight work by message count and by bytes, the
// process-wide Budget that sits above route windows, and the Criticality
// classes used to decide what is shed first.
//
// The model is a lifecycle budget, not a worker limit. Capacity is taken
// before a message is fetched from the broker (the fetch asks only for what is
// free) and given back exactly once, when the message is settled: acked after
// success, dead-lettered, expired, shed, or returned on shutdown. A caller that
// merely stops waiting for a result does not give capacity back, because the
// work it started is still running and still holds memory.
//
// A Window never waits for something that cannot happen: a request for more
// messages than the whole window refuses at once with ErrTooLarge, and a
// single message larger than the whole byte budget is admitted alone, when the
// window is otherwise empty, so an oversized message is a slow path rather
// than a deadlock.
package backpressure
