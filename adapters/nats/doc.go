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
// Success is acked with a server-confirmed ack (the double ack of nats.go)
// by default: the consumer returns window capacity only once a delivery is
// settled, and at-least-once processing wants to know the ack landed (a
// lost plain ack becomes a redelivery after AckWait, a duplicate nobody saw
// coming). A confirmed ack costs a round trip per message; set
// SourceOptions.AckAsync for the plain ack when duplicates are cheap.
// Retries are NakWithDelay with the route's jittered backoff; dead letters
// are written to the DLQ stream and only then is the original terminated
// (+TERM with the reason); long handlers are kept alive with InProgress at a
// third of AckWait. The delivery attempt comes from the delivery's metadata
// (NumDelivered), so it survives process restarts. Keep the consumer's
// MaxDeliver unlimited (-1) or above the route's Retry.MaxAttempts, so the
// last attempt is dead-lettered before the server gives up on it.
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
