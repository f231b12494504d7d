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
// Each pull request asks for exactly what the route's window has free, by
// count and by bytes, with no_wait and an expiry (PollWait): the server
// answers as soon as it has a message and ends the request when it has no
// more, so a small batch is handed over at once and an idle route waits at
// most PollWait per request. Deliveries are handed to the route as they
// arrive. At most one request is open, and it was sized from capacity that
// stays free until its messages arrive, so the client holds nothing the
// window does not cover: no prefetch buffer, nothing waiting locally past
// AckWait. NewSourceFor sets MaxAckPending to at least the window. On
// shutdown, what already arrived is handed back (nak'd at once); a delivery
// the server sends for the open pull after the route stopped reading is
// redelivered after AckWait.
//
// # Settlement
//
// Settlements (Ack, Nak with a delay, Term with a reason) are
// server-confirmed by default: each is sent with a reply subject on the
// Source's own inbox, and a delivery is settled only when the server's
// answer arrives; at-least-once processing wants to know the settlement
// landed (a lost plain ack becomes a redelivery after AckWait, a duplicate
// nobody saw coming). Workers hand settlements to one writer per Source,
// which publishes everything queued back to back, so many settlements share
// one write whatever the number of workers. An answer that does not come
// (its connection dropped, the server restarted) is handled: Ack and Term
// are re-sent at once after a reconnect, or after AckTimeout (both are
// idempotent on the server), at most twice; a Nak is not re-sent (the
// broker redelivers a message whose nak was lost anyway). A settlement
// still unanswered completes with ErrAckUnconfirmed: it is never counted
// settled on a guess. SourceOptions.AckAsync sends plain acks instead.
// Retries are NakWithDelay with the route's jittered backoff; dead letters
// are written to the DLQ stream and only then is the original terminated
// (+TERM with the reason); long handlers are kept alive with InProgress at a
// third of AckWait. The delivery attempt comes from the delivery's metadata
// (NumDelivered), so it survives process restarts. Keep the consumer's
// MaxDeliver unlimited (-1) or above the route's Retry.MaxAttempts, so the
// last attempt is dead-lettered before the server gives up on it.
//
// # Faults
//
// A delivery that is not a pull status (it carries a JetStream ack
// subject) reaches the route even when it has an empty payload and a
// header named Status. When the consumer is deleted on the server while
// the route runs, a Source made by NewSourceFor recreates it, delivering
// again from the last ack floor it read (at most a second or 1,024
// deliveries old: duplicates, never a gap) and reports ErrConsumerDeleted
// once as a fetch error; a Source over a consumer the user created stops
// the route with ErrConsumerDeleted (wrapping consumer.ErrClosed).
//
// # Dead letters
//
// DeadLetterSink publishes one message per letter to a stream (default
// SLUICE_DLQ, subjects sluice.dlq.<route>, file storage, limits retention)
// with the original payload and headers plus the dlq envelope headers, and
// Nats-Msg-Id <stream>:<sequence>:<attempts>, so a retried write is
// deduplicated by the server. The producer's own Nats-Msg-Id is kept in
// Sluice-Dlq-Original-Msg-Id.
package natsadapter
