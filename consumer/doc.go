// Package consumer runs broker consumers under bounded, lifecycle-exact
// admission so they degrade gracefully instead of collapsing under overload.
//
// A Consumer runs one or more Routes. Each Route has its own Source (a
// subscription an adapter provides: see adapters/nats and adapters/kafka),
// a window bounding the messages and bytes it holds, a fixed pool of
// Workers, and its own retry, expiry, dead-letter and overload policies.
// One route cannot take another's workers or window. The minimal route is
//
//	consumer.Route{Name: "orders", Source: src, Handler: handle}
//
// and every other field has a documented default (see Route).
//
// The pull is blocking: a route's fetch loop waits until its window has room,
// asks the Source for at most what is free, and charges what arrives. So a
// slow handler shows up as broker lag, not as process memory. Capacity comes
// back exactly once per message, when its settlement is done.
//
// # Predictive expiry
//
// A message with a deadline (the Sluice-Deadline header by default, see
// expiry.Policy) is started only if it is predicted to finish in time. The
// route learns its handler's latency from its own recent runs on messages
// with a deadline (their mean and 99th percentile, plus a tenth of it and
// a millisecond of margin) and checks each message three times: when it
// is fetched (now + its expected wait for a worker + the handler's p99
// must fit before the deadline), while it is queued (the moment it could
// no longer start in time, it is settled without waiting for a worker),
// and when a worker picks it, right before the handler. A message that
// would finish late is settled as Expired (counted in
// OverloadStats.ExpiredEarly) at once, so it frees its window capacity and
// its broker slot and no worker spends time on a result nobody waits for.
// Under a sustained backlog this keeps goodput at the handler's capacity
// whatever the window: the route drains the stale part of the backlog at
// fetch and runs what can still make it. Before the first run with a
// deadline the route checks deadlines only; messages without a deadline
// are never affected. Overload.ShedNearDeadline stays available as an
// explicit floor.
//
// # Short queues under overload
//
// Admitting everything that can still make its deadline would let a
// sustained overload build a standing queue (mostly in the broker, whose
// FIFO a pull cannot reorder) until every success finishes just before its
// deadline. The route keeps the queue short instead, the way CoDel does. It
// looks, per interval (100 ms, or two targets if longer), at the messages
// with a deadline: a burst leaves some message that waited little, while a
// standing queue makes every one that starts wait longer than the target
// since its publish (Overload.Queue.Target: by default two of the handler's
// learned p99 latencies plus 20 ms), or makes the route settle at once
// (expired, or predicted late) a quarter of what it fetched, as a deadline
// short next to the backlog does. In that state, until neither holds and
// some message starts half its allowance early, a message with a deadline is
// admitted only if it is predicted to finish within 60 % of its time to the
// deadline (its publish to its deadline) and, when Target is set (> 0),
// within Target (plus its own run) of its publish; the
// others are settled as Expired at fetch or, once queued, by the reaper
// (counted in OverloadStats.Stale, not ExpiredEarly), which drains the old
// part of the backlog to its fresh end. So the successes finish with margin
// while the workers stay busy. The automatic target only detects the state:
// the bound that settles messages is relative to each deadline, so a
// backlog whose deadlines leave ample time (a burst produced before the
// consumer started, a replay) drains in full. At or under capacity the
// queue empties and nothing is settled this way; messages without a deadline never are, and
// keep FIFO. A negative Target turns the rule off. On a batch route a
// message's run is its batch's: the rule plans with the learned time of a
// full batch.
//
// The default window (WindowPolicy.Messages 0) sizes itself from the same
// signals: it grows while a stale backlog drains (most of what it fetches
// is dropped at once) and while the broker has a backlog the window
// starves the workers of (a fetch came back full and a worker found the
// queue empty), so without deadlines a backlog drains at the handlers'
// pace rather than a window per round trip; it shrinks back once drops
// stop and fetches come back short.
//
// # The settlement contract
//
// Every message a Source hands over is counted in RouteStats.Fetched and
// held by the route (kept alive with InProgress when the Source reports an
// AckWait, whatever it waits for) until it ends in exactly one Outcome. The
// table says what the broker is told and when:
//
//	Outcome        when                                          broker sees
//	Succeeded      the handler returned nil (a BatchHandler:      Ack
//	                 nil, and Batch.Fail did not mark it)
//	Expired        deadline passed (or would, before it ends)    DeadLetter.OnExpired: Ack (default), Term,
//	                 at fetch, in the queue, before or during      or a dead letter then Term
//	                 the handler; it is never (re)run
//	Retried        retryable error (a batch's: its Fail mark,    Nak(backoff)
//	                 else the BatchHandler's), attempts left
//	Overloaded     backpressure.Overloaded(err), attempts left   Nak(backoff); no retry in process
//	DeadLettered   Permanent(err), out of attempts (retryable    the sink's write first, then Term
//	                 or overloaded), oversize by policy, or a
//	                 shed/overloaded last delivery
//	DLQFailed      that write failed                             Nak(backoff); the redelivery is written
//	                                                               again, the handler is not run again
//	Terminated     as DeadLettered, on a route without a sink    Term(reason)
//	Shed           an overload policy dropped it before it ran   Overload.OnShed: Nak(ShedDelay) (default)
//	                                                               or Ack
//	Returned       shutdown before it ran                        Nak(0)
//	Abandoned      left on purpose for the broker to redeliver   nothing
//	                 after its ack deadline (below)
//
// The broker's last delivery (SourceInfo.MaxDeliver, JetStream MaxDeliver):
// a Nak there would lose the message, so the route never naks it. New
// refuses Retry.MaxAttempts above MaxDeliver, so a failing last delivery is
// out of attempts and dead-lettered; a shed or overloaded one is
// dead-lettered as well (class "shed", "overloaded"). When the dead-letter
// write fails on a last delivery, the message is kept (and kept alive) and
// the write retried in process with backoff until it succeeds or the
// shutdown grace ends; then it is abandoned. The retry holds the message's
// window slot but no worker: one goroutine per route retries every kept
// letter, probing a store that is down with one write per backoff, so
// poison messages on their last delivery do not stop the route's other
// work while the store is down (they stop it only once they fill the
// window). At shutdown a last delivery is not handed back either: on an
// Unordered route a worker still runs it within the grace; one that does
// not run (on an ordered route, once the grace is over, or whose handler
// the shutdown cancelled) is dead-lettered with class ClassShutdown. Only
// when that letter cannot be written before the grace ends (or the route
// has no sink, or the handler is stuck) is a last delivery abandoned, and
// RouteStats.LastAbandoned counts it apart: JetStream does not deliver a
// message again once it was delivered MaxDeliver times, so it stays in the
// stream, where only a recovery from the stream finds it: the NATS
// adapter's Source does that by default (JetStream's max-deliveries
// advisory names the message; see "Last deliveries" in adapters/nats),
// writing its letter into the route's sink once the sink answers, also
// after a kill. With MaxDeliver unlimited (-1, the default) and
// Retry.MaxAttempts capping attempts, no delivery is ever the last.
// An ordered route keeps a failed dead letter the same way (see Ordering),
// whatever the delivery, and abandons the message when the grace ends; the
// broker redelivers it after its ack deadline.
//
// Shutdown (Run's ctx ends): the pull stops; messages not started are
// returned (last deliveries: above); running handlers get
// Options.ShutdownGrace, then their ctx is cancelled; a handler still
// running ShutdownSlack later is abandoned (its message is not settled:
// settling it would let another consumer run it while it still runs here)
// and Run returns ErrStuckHandlers. Settlements
// and dead-letter writes get a ctx that ends at ShutdownGrace +
// ShutdownSlack/2; a settlement the broker has not confirmed by ShutdownGrace
// + ShutdownSlack is abandoned (RouteStats.Errors.Settle counts it). A
// handler cancelled by the shutdown that returns its ctx's error has its
// message returned, not counted as a failure. So Run returns within
// ShutdownGrace + ShutdownSlack, whatever a handler, sink or broker does.
//
// A settlement the broker refused or never confirmed is counted in
// RouteStats.Errors.Settle; the message keeps the outcome decided for it,
// and the broker redelivers it (at-least-once: a duplicate, never a loss).
// Adapters may confirm settlements asynchronously (Acker.Settle returns
// ErrPending, then Confirm): the message keeps its window capacity until
// the broker's answer arrives, and no worker waits for it.
//
// RouteStats keeps the ledger: Fetched equals the sum of Settled plus Held,
// and counters never go backwards. A handler panic is recovered and
// treated as a retryable error (class "panic" once out of attempts). The
// handler's ctx carries the message deadline and criticality; no context,
// timer or goroutine is created per message for routes without a deadline.
//
// In short, the contract is these rules; the simulation (TestSimulation:
// one seed, one reproducible run of whole routes with a random
// configuration, traffic and faults, in virtual time) checks each by name
// after every run:
//
//   - every fetched message ends in exactly one outcome;
//   - the broker is told at most one settlement per delivery, the one the
//     outcome table names;
//   - a last delivery is never nak'd;
//   - no handler starts on a message past its deadline;
//   - a settled message is never run later;
//   - no message runs twice at once;
//   - an ordered route runs one message of a key at a time, in delivery
//     order (a batch: a key's messages in delivery order, see Batches);
//   - a message of a batch is not acked ahead of an earlier message of its
//     key in the batch;
//   - a batch holds at most MaxMessages messages and MaxBytes bytes (a
//     larger message alone), and its ctx ends by its earliest deadline;
//   - an ordered route runs a held-back message again only after its delay;
//   - the window and the Budget are never exceeded, and capacity comes back
//     exactly once;
//   - nothing is lost: a message is abandoned only where the contract says so;
//   - a dead letter is written before its original is settled;
//   - a held message is kept alive;
//   - Run returns within ShutdownGrace + ShutdownSlack;
//   - Run returns the error the contract names;
//   - no goroutine outlives Run;
//   - Fetched equals the sum of Settled plus Held, and counters never go
//     backwards.
//
// CI runs 2,000 seeds (go test ./consumer -run TestSimulation -v; 600
// under -race); SLUICE_SIM_SEEDS=100000 (with -timeout 1h) runs more, and a
// failing seed prints the command that replays it and its shrunk
// configuration.
//
// # Ordering
//
// Route.Ordering says which messages may run at the same time. Unordered
// (the default) runs any message on any free worker. ByKey never runs two
// messages with the same key at once and runs them in delivery order,
// different keys in parallel on all the route's workers: a partition's
// messages need no more partitions to go faster, and an account's debits
// still apply in order. ByPartition runs a partition's messages one at a
// time. The key is Message.Key within its stream or topic: Kafka's record
// key, the NATS adapter's KeyHeader or the subject; a message without a key
// keeps no order.
//
// A key's messages wait in the route, charged to the window, behind the
// one that runs (RouteStats.Order.Waiting); Window.MaxPerKey (default half
// the window) bounds how many one key holds: while a key is full the route
// takes in nothing more, so a hot key cannot fill the window. An ordered
// route composes with the rest like this:
//
//   - Retries: a message that fails with attempts left is not nak'd (the
//     broker's redelivery would come after the key's later messages): it
//     keeps its window slot, is kept alive, and runs again in place after
//     the backoff with Attempt + 1, while its key waits
//     (RouteStats.Order.Retries; OutcomeRetried is never counted). The same
//     goes for "overloaded" hand-backs and for sheds settled by ShedNak
//     (held back Overload.ShedDelay). A dead-letter write that fails is
//     retried in place. So a key's later message never runs before an
//     earlier one has succeeded, been dead-lettered, expired or been shed
//     by ShedAck, in this process.
//   - Expiry: a message whose deadline passes, waiting or at the head of
//     its key, is settled as expired without running and frees its slot
//     at once; the key goes on. Dead letters and ShedAck release the key
//     the same way: a settled message is never run later. A message
//     dead-lettered without running (expired, oversize) releases its key
//     when that is decided: if the write fails, the route's letter
//     retrier keeps it apart from its key, since it never runs here.
//   - Shutdown: messages not started are handed back (Nak) in key order, a
//     key's later message after its earlier ones, so a broker that
//     redelivers in nak order (a JetStream durable: nak'd messages first,
//     oldest nak first) or from the last commit (Kafka) delivers them in
//     order again.
//   - Rebalances: a worker does not start a message its Source lost (an
//     Acker that is Revocable: a revoked Kafka partition); it is handed
//     back, and the partition's next owner continues from the final
//     commit. Kafka gives a partition, and so each key, to one member at a
//     time, so order holds across a rebalance as long as handlers finish
//     within the adapter's revoke grace.
//
// What ByKey does not promise: order across processes sharing one JetStream
// durable (the server spreads a subject's messages over them; give each
// process its own filter subjects); order across a crash on JetStream (what
// the dead process held comes back after AckWait, behind newer messages;
// Kafka replays from the last commit, in order); nor the order of a
// duplicate: a message redelivered after a lost acknowledgement
// (at-least-once) may run again after its key's later messages.
//
// # Batches
//
// A route with a BatchHandler (instead of a Handler) runs messages in
// batches, for work that is fast in bulk: one COPY of 500 rows instead of
// 500 INSERTs. A batch is messages that travel together; each keeps the
// contract above on its own:
//
//   - Outcome: the handler's nil settles each message as succeeded, its
//     error is applied to each, and Batch.Fail marks single messages
//     (Permanent, backpressure.Overloaded, or retryable), each then settled
//     through the table above with its own attempts, dead letter (written
//     before the Term) and last-delivery rules. A panic is ErrPanic for
//     each message not marked.
//   - Checks: right before the handler runs, each message of the batch
//     gets a Handler's checks (claimed, revoked, shutdown, awaiting its
//     dead letter, expired, shed near its deadline, predicted late); one
//     that fails them is settled and left out. Settling one may take long
//     (a dead-letter write), so the others are checked again after it: a
//     batch never runs a message past its deadline or after the shutdown
//     took it.
//   - Redeliveries: a batch never holds two deliveries of one message
//     (the same Message.Origin: the broker redelivered it while the first
//     was held); the second waits for a later batch, so a bulk upsert
//     never touches one row twice in one statement. Sources that leave
//     Origin empty cannot be told apart this way.
//   - Window: messages in a forming or a running batch hold their window
//     slots until each is settled; each worker runs one batch at a time.
//   - Deadlines: a message that cannot finish in time is settled as
//     expired before its batch runs (0 handler runs for it), by the worker
//     that found it once it has let the other workers form their batches
//     (a slow dead-letter write holds up that worker only); a batch is cut
//     so that its predicted end (learned per route as a fixed cost plus a
//     cost per message: RouteStats.Batch) comes before its earliest
//     deadline, which the handler's ctx carries. Under overload (the
//     window three quarters full) a batch takes the messages that make a
//     full batch in time, leaving staler ones to a smaller batch or to
//     expiry, so batches stay full.
//   - Order: with ByKey or ByPartition a batch holds each key's messages in
//     delivery order. When one fails, its key's later messages in the
//     batch are held, not settled: never acked ahead of it, they run again
//     in a later batch once it is settled (retried in place, dead-lettered
//     or expired), without counting an attempt. A handler that writes them
//     anyway sees them again: write idempotently. The same holds when a
//     key's message is left out of the run by the checks and still holds
//     its key (held back after a shed, its dead letter being retried): its
//     key's later messages in the batch are put back and run after it. A
//     held message whose deadline passes while it waits again is expired
//     like any waiting message (see Ordering, "Expiry"), though the handler
//     saw it once.
//
// See BatchPolicy for the sizes and the linger, and examples/bulkinsert for
// PostgreSQL.
//
// # Overload control
//
// Every OverloadPolicy option is off at its zero value and then costs
// nothing on the message path (BenchmarkCorePath):
//
//   - Criticality: the handler ctx carries the message's class
//     (backpressure.CriticalityFrom); PropagateCriticality copies it to
//     outgoing headers. Slots shares a downstream among routes by class;
//     Options.Budget shares memory.
//   - RetryBudget: retries only while they stay within 10% of first
//     attempts; refused ones are dead-lettered as ClassRetryBudget.
//     DeadLetter.OnOverloaded: OverloadedDeadLetter keeps "do not retry"
//     from being retried by broker redelivery either. backpressure.Retrier
//     does the same for a handler's own downstream calls.
//   - Throttle: client-side adaptive throttling of the pull, so the
//     backlog waits in the broker while the downstream refuses work.
//   - AdaptiveLimit: AIMD on the window's message limit.
//   - Queue (Order, MaxLength, DropWhenFull), ShedNearDeadline, OnShed:
//     which fetched messages run first and which are shed (tail, head,
//     LIFO with oldest-drop, random, lowest criticality).
//
// Errors a route cannot return (fetch, settlement, dead-letter write) are
// counted, kept as RouteStats.Errors.Last, and logged through
// Options.Logger at a bounded rate.
//
// # Following each message
//
// Options.Hook follows every message through its route: Held when the
// route takes it in (with the time the route waited for its window and its
// Throttle before that fetch), then Events: the handler's start and end,
// shed, the dead letter with its class, and exactly one EventSettled with
// the outcome and what the broker was told. The context Held returns
// becomes the handler's. Package otelsluice builds OpenTelemetry traces on
// it; a logger or per-message metrics can use it the same way. Without a
// Hook the route makes none of these calls (BenchmarkCorePath,
// BenchmarkCorePathHook).
package consumer
