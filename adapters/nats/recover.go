package natsadapter

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-go/sluice/dlq"
)

// ClassMaxDeliveries is the dead-letter class of a message recovered after
// JetStream stopped delivering it (SourceOptions.Recover): its last
// delivery was never settled (the process stopped or was killed while it
// held it, or its dead-letter write failed until the shutdown).
const ClassMaxDeliveries = "max-deliveries"

// StoreMaxDeliveries is the StoreMetadataKey value of a stream that keeps
// a consumer's MAX_DELIVERIES advisories for SourceOptions.Recover.
const StoreMaxDeliveries = "max-deliveries"

// RecoveryStream is the stream that keeps the MAX_DELIVERIES advisories of
// consumer on stream for SourceOptions.Recover.
func RecoveryStream(stream, consumer string) string {
	return "SLUICE_MAXDELIVER_" + stream + "_" + consumer
}

// recoveryConsumer is the durable that reads a RecoveryStream.
const recoveryConsumer = "sluice-recover"

// maxDeliveriesAdvisory is the part of the server's
// io.nats.jetstream.advisory.v1.max_deliver event that recovery reads.
type maxDeliveriesAdvisory struct {
	Stream     string    `json:"stream"`
	Consumer   string    `json:"consumer"`
	StreamSeq  uint64    `json:"stream_seq"`
	Deliveries uint64    `json:"deliveries"`
	Time       time.Time `json:"timestamp"`
}

// recoverer dead-letters the messages JetStream gave up on (see
// "Last deliveries" in the package doc). It runs on its own goroutine from
// the Source's first Fetch until Close.
type recoverer struct {
	src  *Source
	sink dlq.Sink

	// acked are stream sequences whose Ack or Term on a last delivery the
	// server confirmed (an ack that arrives after the server gave up is
	// answered and ignored): their advisory is skipped.
	ackMu sync.Mutex
	acked map[uint64]struct{}
	order []uint64

	mu sync.Mutex // guards what follows
	// Set by start (the fetch loop), read by stop (Close, after Run).
	started bool
	// retryAt: a failed start is tried again from then on; Fetch goes on
	// meanwhile (the route must not stop because recovery cannot start).
	retryAt time.Time
	iter    jetstream.MessagesContext
	cancel  context.CancelFunc
	done    chan struct{}

	recovered, skipped, gone, failed atomic.Uint64
}

// maxAckedRemembered bounds recoverer.acked.
const maxAckedRemembered = 4096

// remember notes that the server confirmed an Ack or Term of seq's last
// delivery.
func (r *recoverer) remember(seq uint64) {
	r.ackMu.Lock()
	defer r.ackMu.Unlock()
	if _, ok := r.acked[seq]; ok {
		return
	}
	if len(r.order) == maxAckedRemembered {
		delete(r.acked, r.order[0])
		r.order = r.order[1:]
	}
	r.acked[seq] = struct{}{}
	r.order = append(r.order, seq)
}

func (r *recoverer) wasAcked(seq uint64) bool {
	r.ackMu.Lock()
	defer r.ackMu.Unlock()
	_, ok := r.acked[seq]
	return ok
}

// start makes the advisory stream and its consumer (once) and starts the
// goroutine that processes what they hold, including advisories that
// fired while no process ran. Called by Fetch before its first pull, so
// the stream exists before anything this Source is delivered can reach
// MaxDeliver. When that fails (no permission to create streams, a stream
// already capturing the subject), Fetch returns the error once and goes on
// pulling; the start is tried again every startRetry.
func (r *recoverer) start(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started || time.Now().Before(r.retryAt) {
		return nil
	}
	if err := r.startLocked(ctx); err != nil {
		r.retryAt = time.Now().Add(startRetry)
		return err
	}
	return nil
}

// startRetry is how long Fetch waits before it tries again to start
// recovery after a failure.
const startRetry = 10 * time.Second

func (r *recoverer) startLocked(ctx context.Context) error {
	s := r.src
	if info := s.info(); info == nil || info.Config.Durable == "" {
		// An ephemeral consumer goes with its process: the next one
		// delivers the stream again, nothing is lost, and a stream per
		// ephemeral would pile up.
		r.started, r.done = true, make(chan struct{})
		close(r.done)
		r.cancel, r.iter = func() {}, nil
		return nil
	}
	name := RecoveryStream(s.stream, s.name)
	subject := "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES." + s.stream + "." + s.name
	st, err := s.js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = s.js.CreateStream(ctx, jetstream.StreamConfig{
			Name:        name,
			Description: "sluice: MAX_DELIVERIES advisories of " + s.stream + " > " + s.name + ", dead-lettered by the route's Source",
			Subjects:    []string{subject},
			Storage:     jetstream.FileStorage,
			Retention:   jetstream.WorkQueuePolicy,
			Metadata:    map[string]string{StoreMetadataKey: StoreMaxDeliveries},
		})
	}
	if err != nil {
		return fmt.Errorf("natsadapter: max-deliveries advisory stream %q: %w", name, err)
	}
	cons, err := st.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:   recoveryConsumer,
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   time.Minute,
	})
	if err != nil {
		return fmt.Errorf("natsadapter: max-deliveries advisory consumer on %q: %w", name, err)
	}
	iter, err := cons.Messages(jetstream.PullMaxMessages(16), jetstream.PullExpiry(max(s.opts.PollWait, time.Second)))
	if err != nil {
		return fmt.Errorf("natsadapter: max-deliveries advisory consumer on %q: %w", name, err)
	}
	stream, err := s.js.Stream(ctx, s.stream)
	if err != nil {
		iter.Stop()
		return fmt.Errorf("natsadapter: stream %q: %w", s.stream, err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	r.iter, r.cancel, r.done, r.started = iter, cancel, make(chan struct{}), true
	go r.run(rctx, stream)
	return nil
}

func (r *recoverer) run(ctx context.Context, stream jetstream.Stream) {
	defer close(r.done)
	for {
		m, err := r.iter.Next()
		if err != nil {
			if errors.Is(err, jetstream.ErrMsgIteratorClosed) || errors.Is(err, nats.ErrConnectionClosed) || ctx.Err() != nil {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(time.Second):
			}
			continue
		}
		r.handle(ctx, stream, m)
	}
}

// handle dead-letters the message one advisory names, then acks the
// advisory; when the sink refuses, the advisory is nak'd with a backoff
// and handled again.
func (r *recoverer) handle(ctx context.Context, stream jetstream.Stream, m jetstream.Msg) {
	var a maxDeliveriesAdvisory
	if err := json.Unmarshal(m.Data(), &a); err != nil || a.StreamSeq == 0 {
		_ = m.Term() // not an advisory this code can read
		return
	}
	if r.wasAcked(a.StreamSeq) {
		r.skipped.Add(1)
		_ = m.Ack()
		return
	}
	retry := func() {
		r.failed.Add(1)
		n := uint64(1)
		if md, err := m.Metadata(); err == nil {
			n = md.NumDelivered
		}
		_ = m.NakWithDelay(min(time.Duration(1<<min(n, 6))*time.Second, time.Minute))
	}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	raw, err := stream.GetMsg(wctx, a.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		r.gone.Add(1) // removed from the stream since: nothing to keep
		_ = m.Ack()
		return
	}
	if err != nil {
		retry()
		return
	}
	s := r.src
	s.mu.Lock()
	route := s.route
	s.mu.Unlock()
	at := a.Time
	if at.IsZero() {
		at = time.Now()
	}
	h := map[string][]string(raw.Header)
	if h == nil {
		h = map[string][]string{}
	}
	l := &dlq.Letter{
		Value:   raw.Data,
		Headers: h,
		Route:   route,
		Class:   ClassMaxDeliveries,
		Err: fmt.Sprintf("JetStream stopped delivering the message after %d deliveries (MaxDeliver) without a settlement; recovered from its MAX_DELIVERIES advisory",
			a.Deliveries),
		Attempts:     int(a.Deliveries),
		FirstFailure: at,
		LastFailure:  at,
		Origin:       dlq.Origin{Topic: raw.Subject, Stream: s.stream, Sequence: a.StreamSeq, Group: s.name, Partition: -1},
	}
	if err := r.sink.Write(wctx, l); err != nil {
		retry()
		return
	}
	r.recovered.Add(1)
	_ = m.Ack()
}

// stop ends the goroutine and waits for it.
func (r *recoverer) stop() {
	r.mu.Lock()
	started := r.started
	r.started = false
	r.mu.Unlock()
	if !started {
		return
	}
	r.cancel()
	if r.iter != nil {
		r.iter.Stop()
	}
	<-r.done
}
