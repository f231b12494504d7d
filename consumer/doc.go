// Package consumer runs broker consumers under bounded, lifecycle-exact
// admission so they degrade gracefully instead of collapsing under overload.
//
// A Consumer runs one or more Routes. Each Route has its own Source (a
// subscription an adapter provides: see adapters/nats and adapters/kafka),
// a Window bounding the messages and bytes it holds, a fixed pool of
// Workers, and its own retry, expiry, criticality and dead-letter policies.
// One route cannot take another's workers or window.
//
// The pull is blocking: a route's fetch loop waits until its window has room,
// asks the Source for at most what is free, and charges what arrives. So a
// slow handler shows up as broker lag, not as process memory. Capacity comes
// back exactly once per message, when it is settled.
//
// Every fetched message ends in exactly one Outcome:
//
//   - Succeeded: the handler returned nil; acked.
//   - Expired: its deadline passed, at fetch or right before the handler (or
//     while the handler ran out of time); settled by Route.OnExpired and
//     never (re)run.
//   - Retried: a retryable error with attempts left; nak'd with jittered
//     exponential backoff, so the broker redelivers it.
//   - Overloaded: the handler said "overloaded, do not retry"
//     (Overloaded(err)); nak'd with backoff but not retried in process.
//   - DeadLettered: Permanent(err), out of attempts, or oversize by policy;
//     written to Route.DeadLetter, and terminated only after the write was
//     confirmed. DLQFailed: that write failed, so it was nak'd instead.
//   - Terminated: as DeadLettered, for a route without a dead-letter sink.
//   - Returned: nak'd on shutdown before it could run or finish.
//
// RouteStats keeps the ledger: Fetched equals the sum of outcomes plus what
// is in flight. A handler panic is recovered and treated as a retryable
// error. The handler's ctx carries the message deadline; no context,
// timer or goroutine is created per message for routes without a deadline.
//
// Run owns every goroutine and stops within ShutdownGrace (plus a second for
// handlers that honour ctx cancellation).
package consumer
