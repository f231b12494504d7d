// Package natsadapter connects sluice to NATS JetStream: a Source over a
// durable (or ephemeral) pull consumer and a dead-letter Sink that
// publishes to a stream.
//
// The directory is named nats, but the package is natsadapter so it does
// not collide with github.com/nats-io/nats.go. Import it as
//
//	natsadapter "github.com/sluice-go/sluice/adapters/nats"
//
// # Pulls sized by the window
//
// The route states its window once (consumer.Route.Window); the Source
// learns it in Attach. Each pull request asks for exactly what the window
// has free, by count and by bytes, with no_wait and an expiry (PollWait):
// the server answers as soon as it has a message and ends the request when
// it has no more, so a small batch is handed over at once and an idle
// route waits at most PollWait per request. Deliveries are handed to the
// route as they arrive. At most one request is open, and it was sized from
// capacity that stays free until its messages arrive, so the client holds
// nothing the window does not cover: no prefetch buffer, nothing waiting
// locally past AckWait. The replies arrive on a channel of 2×window+8
// slots (nats.go's SubscribeSync would allocate 65,536, 512 KiB, per
// route), so an idle route costs about 10 KiB and, with one worker, four
// goroutines (three of the route's, one for the Source's settlement
// answers). On shutdown, what already arrived is handed back (nak'd at
// once); a delivery the server sends for the open pull after the route
// stopped reading is redelivered after AckWait.
//
// # MaxAckPending and delayed naks
//
// JetStream keeps a message nak'd with a delay ack-pending until it is
// redelivered, so delayed work (retry backoff, shed messages nak'd with
// ShedDelay, failed dead-letter writes) takes MaxAckPending slots the
// route's window does not see. With MaxAckPending equal to the window, 64
// poison messages cycling through backoff while the dead-letter stream was
// down stopped all other delivery. NewSourceFor with MaxAckPending 0 (the
// default) therefore sizes it itself: the window plus a reserve of
// max(window, 256), and raises it on the server (never lowers it) when
// delayed naks take half of the reserve, up to 65,536 above the window.
// SourceStats.DelayedNaks and MaxAckPending show where it stands. A
// MaxAckPending you set (or one on a consumer you wrap with NewSource) is
// kept; Attach refuses one below the window, and it should leave room for
// the delayed naks the route produces.
//
// # Settlement
//
// Settlements (Ack, Nak with a delay, Term with a reason) are
// server-confirmed and pipelined by default: Settle returns
// consumer.ErrPending at once (no worker and no fetch loop waits for a
// round trip), and the server's confirmation reaches the route through
// consumer.Confirm; until then the message keeps its window slot.
// At-least-once processing wants to know the settlement landed (a lost
// plain ack becomes a redelivery after AckWait, a duplicate nobody saw
// coming). Workers hand settlements to one writer per Source, which yields
// once and then publishes everything queued back to back, so many
// settlements share one write syscall whatever the number of workers
// (0.02-0.03 writes per message at 1 to 64 workers). By default
// (ConfirmBatch) only the last Ack or Term of each such batch carries a
// reply subject on the Source's own inbox: the consumer processes its acks
// in order, so the server's answer to it confirms the plain ones before it
// on the same connection (see ConfirmBatch for the guards: a reconnect in
// between, a consumer not yet loaded after a restart). An answer that does
// not come (its connection dropped, the server restarted) is handled: Ack
// and Term are re-sent at once after a reconnect, or after AckTimeout
// (both are idempotent on the server), at most twice; a Nak is not re-sent
// (the broker redelivers a message whose nak was lost anyway). A
// settlement still unanswered completes with ErrAckUnconfirmed: it is
// never counted confirmed on a guess, and the route counts it as a settle
// error. A redelivery of a message whose Ack or Term is still unanswered
// (a server that read the ack and went down before applying it redelivers
// after its restart) is settled the same way by the Source and not handed
// to the route: its handler already ran to the end
// (SourceStats.RedeliveriesSettled). SourceOptions.Confirm chooses the
// mode: ConfirmBatch (the default, above), ConfirmReply (an answer per
// settlement: the strictest, and the costliest) or ConfirmNone (plain
// acks; Settle returns nil once the settlement is queued).
//
// Retries are naks with the route's jittered backoff; dead letters are
// written to the DLQ stream and only then is the original terminated
// (+TERM with the reason); long handlers are kept alive with InProgress at
// a third of AckWait. The delivery attempt comes from the delivery's
// metadata (NumDelivered), so it survives process restarts. The route
// refuses Retry.MaxAttempts above the consumer's MaxDeliver (Attach
// reports it); with a MaxDeliver, set SourceOptions.Recover (below).
//
// # Last deliveries
//
// JetStream never delivers a message again once it was delivered
// MaxDeliver times. The route never naks a last delivery (it
// dead-letters it instead), but a last delivery can still end unsettled:
// the process stops while it holds one and cannot run or dead-letter it
// in time (the dead-letter store is down), or the process is killed. The
// server then gives up on the message when its AckWait passes and
// publishes a MAX_DELIVERIES advisory
// ($JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.<stream>.<consumer>) naming
// its stream sequence. By default, on a durable with MaxDeliver whose
// route has a dead-letter sink (SourceOptions.Recover names another sink,
// NoRecover turns it off; an ephemeral goes with its process, and the
// next one delivers the stream again), the Source keeps those advisories in a work-queue stream of its
// own (RecoveryStream(stream, consumer), created by the first Fetch, file
// storage), so an advisory that fires while no process runs is kept too,
// and from its first Fetch until Close it reads them with a durable
// (sluice-recover): for each, it reads the message from the stream by
// sequence and writes its dead letter (class ClassMaxDeliveries, the
// original payload and headers, origin stream, sequence and durable), and
// only once the sink took it is the advisory acked; a refused write is
// retried with backoff (up to a minute apart) until the sink answers. The
// letter's Nats-Msg-Id is the route's own for that message (DedupID), so
// a message recovered twice, or one the route had dead-lettered before
// its Term was lost, is stored once within the store's duplicate window.
// An advisory for a message whose Ack or Term of the last delivery this
// Source saw confirmed (it arrived after the server gave up) is skipped
// (SourceStats.RecoverySkipped); one for a message no longer in the stream
// is dropped (RecoveryGone). What is not covered: a message acked by
// another process after the server gave up on it gets a letter too (a
// duplicate, never a loss), and advisories that fired before the first
// Fetch of a recovering Source ever created the stream were not kept.
// When the stream cannot be made (no permission to create streams,
// another stream capturing the subject), Fetch returns that error once,
// goes on pulling, and tries again every 10 s: the route is not stopped
// for it.
// The advisory only fires when the server next looks for messages to
// deliver on the consumer, which a running route does all the time. Who
// may publish on the advisory subject can make the Source copy a stream
// message into the dead-letter store (never remove one): keep
// $JS.EVENT.> to the server and trusted operators, as JetStream advises.
//
// # Message key
//
// Message.Key, the key a keyed route orders by, is the subject by default;
// SourceOptions.KeyHeader names a header to use instead (a message without
// it keeps its subject). Deliveries in a row with the same key share the
// Key's bytes (the Source copies the key once, not per message): treat Key,
// like Value, as read-only. Before 1.0 the key was the Nats-Msg-Id header,
// which is unique per message and so orders nothing.
//
// On a route ordered consumer.ByKey (the key within the stream) or
// consumer.ByPartition (the whole stream), a failed message is retried in
// place, not nak'd, so no redelivery overtakes the key's later messages;
// the route keeps it alive with InProgress meanwhile. Messages handed back
// on shutdown are nak'd in key order, and JetStream redelivers nak'd
// messages before new ones, oldest nak first, so the next run sees them in
// order. After a crash it is weaker: what the dead process held comes back
// only after AckWait (in stream order), while the next process on the
// durable is already served newer messages, so a key's newer message can
// run before an older one the dead process never finished. Start the
// replacement after AckWait, or keep AckWait short (the route keeps held
// messages alive), where that matters. Order holds within one process:
// several processes on one durable each get part of a key's messages; give
// each its own filter subjects instead.
//
// # Faults
//
// A delivery that is not a pull status (it carries a JetStream ack
// subject) reaches the route even when it has an empty payload and a
// header named Status (SourceStats.StatusHeaderDeliveries counts them).
// When the consumer is deleted on the server while the route runs, a
// Source made by NewSourceFor recreates it, delivering again from the last
// ack floor it read (at most a second or 1,024 deliveries old: duplicates,
// never a gap) and reports ErrConsumerDeleted once as a fetch error; a
// Source over a consumer the user created stops the route with
// ErrConsumerDeleted (wrapping consumer.ErrClosed).
//
// # Dead letters
//
// DeadLetterSink publishes one message per letter to a stream (default
// SLUICE_DLQ, subjects sluice.dlq.<route>, file storage, limits retention)
// with the original payload and headers plus the dlq envelope headers. The
// letter's Nats-Msg-Id (DedupID) is the same for every retry of one
// message's letter, so a write the stream stored but whose PubAck was lost
// is not stored twice. The producer's own Nats-Msg-Id is kept in
// Sluice-Dlq-Original-Msg-Id. Original headers NATS cannot store as they
// are (from a Kafka record: a name that is empty or holds a space, a
// colon or a control byte; a value with a CR, LF or another control byte,
// or leading or trailing blanks) are packed into the stored value
// (dlq.HeaderPackedHeaders), and dlq.Decode (show, replay) restores them
// byte for byte.
package natsadapter
