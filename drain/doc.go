// Package drain paces a route's consumption of a backlog.
//
// After an outage a route's stream or topic holds hours of messages, and a
// consumer that is fast when healthy pulls them all at once: the handler's
// dependencies (a database, a downstream API) that just recovered get the
// whole backlog in seconds. Wrapping the route's consumer.Source in a
// drain.Source caps how many messages per second the route takes while it
// is behind, in small jittered batches, and lets it run at full speed again
// once it has caught up (the messages it fetches are younger than
// Options.CaughtUp) or when SetRate lifts the limit.
//
// Pacing happens in the fetch, so it is real backpressure: the messages
// stay in the broker, not in memory, and the route's window, workers and
// deadline checks work as before. To drain a backlog into another topic
// instead (or to replay dead letters), use dlq.Replayer. To make the
// drained route yield to live traffic, also give it a lower Criticality
// (backpressure.Sheddable) than the routes it must not starve.
package drain
