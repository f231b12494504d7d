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
//   - Shed: dropped by an overload policy before it ran (queue over
//     Route.ShedQueueLength, or too close to its deadline); nak'd with
//     Route.ShedDelay by default so the broker keeps it, or acked as a
//     counted drop (ShedAck). RouteStats.Shed splits it by reason and class.
//   - Returned: nak'd on shutdown before it could run or finish.
//
// RouteStats keeps the ledger: Fetched equals the sum of outcomes plus what
// is in flight. A handler panic is recovered and treated as a retryable
// error. The handler's ctx carries the message deadline; no context,
// timer or goroutine is created per message for routes without a deadline.
//
// # Overload control
//
// Every Route option below is off at its zero value and then costs nothing
// on the message path (BenchmarkCorePath):
//
//   - Criticality: the handler ctx carries the message's class
//     (backpressure.CriticalityFrom); PropagateCriticality copies it to
//     outgoing headers. Route.Slots shares a downstream among routes by
//     class; Options.Budget shares memory.
//   - Route.RetryBudget: retries only while they stay within 10% of first
//     attempts; refused ones are dead-lettered as ClassRetryBudget.
//     Route.OnOverloaded: OverloadedDeadLetter keeps "do not retry" from
//     being retried by broker redelivery either. backpressure.Retrier does
//     the same for a handler's own downstream calls.
//   - Route.Throttle: client-side adaptive throttling of the pull, so the
//     backlog waits in the broker while the downstream refuses work.
//   - Route.AdaptiveLimit: AIMD on the window's message limit.
//   - Route.QueueOrder, ShedQueueLength, Drop, ShedNearDeadline, OnShed:
//     which fetched messages run first and which are shed (tail, head,
//     LIFO with oldest-drop, random, lowest criticality).
//
// Run owns every goroutine and stops within ShutdownGrace (plus a second for
// handlers that honour ctx cancellation).
package consumer
