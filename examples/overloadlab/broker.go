package main

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/twmb/franz-go/pkg/kfake"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

// errRejected is returned by a publish the queue refused because it is full
// (its limit uses DiscardNew).
var errRejected = errors.New("overloadlab: queue full, publish rejected")

// labMsg is what the producer sends. The payload carries the id, the
// publish time and the deadline, so both consumers measure the same way
// whatever the broker; the deadline also travels in expiry.DefaultHeader
// for sluice, and the class in consumer.CriticalityHeader.
type labMsg struct {
	id       uint64
	pub      time.Time
	deadline time.Time // zero: none
	crit     backpressure.Criticality
	// cost is what handling the message costs, declared by the producer
	// (cost mode); zero means the trial's handler cost.
	cost time.Duration
}

// costOr is m's declared cost, or def when it declares none.
func (m labMsg) costOr(def time.Duration) time.Duration {
	if m.cost > 0 {
		return m.cost
	}
	return def
}

// costHeader carries a message's declared cost in milliseconds.
const costHeader = "Sluice-Cost"

const headerLen = 33

func (m labMsg) encode(size int) []byte {
	b := make([]byte, max(size, headerLen))
	binary.BigEndian.PutUint64(b[0:], m.id)
	binary.BigEndian.PutUint64(b[8:], uint64(m.pub.UnixNano()))
	var dl int64
	if !m.deadline.IsZero() {
		dl = m.deadline.UnixNano()
	}
	binary.BigEndian.PutUint64(b[16:], uint64(dl))
	b[24] = byte(m.crit)
	binary.BigEndian.PutUint64(b[25:], uint64(m.cost))
	return b
}

func decode(b []byte) (labMsg, bool) {
	if len(b) < headerLen {
		return labMsg{}, false
	}
	m := labMsg{
		id:   binary.BigEndian.Uint64(b[0:]),
		pub:  time.Unix(0, int64(binary.BigEndian.Uint64(b[8:]))),
		crit: backpressure.Criticality(b[24]),
		cost: time.Duration(binary.BigEndian.Uint64(b[25:])),
	}
	if dl := int64(binary.BigEndian.Uint64(b[16:])); dl != 0 {
		m.deadline = time.Unix(0, dl)
	}
	return m, true
}

func (m labMsg) headers() map[string][]string {
	h := map[string][]string{consumer.CriticalityHeader: {m.crit.String()}}
	if !m.deadline.IsZero() {
		h[expiry.DefaultHeader] = []string{expiry.FormatDeadline(m.deadline)}
	}
	if m.cost > 0 {
		h[costHeader] = []string{strconv.FormatInt(max(1, m.cost.Milliseconds()), 10)}
	}
	return h
}

// limits bound a queue the way a broker can: at most maxMsgs messages not
// yet acked (0: unbounded); when full, reject the new one (tail-drop,
// dropNew) or discard the oldest (head-drop).
type limits struct {
	maxMsgs int
	dropNew bool
}

// srcOpts describe the sluice route a Source is made for: its window, and
// whether the Source gets the lab's tuned options or the defaults.
type srcOpts struct {
	messages int
	bytes    int64
	tuned    bool
}

// rawDelivery is one message handed to the unprotected baseline.
type rawDelivery struct {
	msg labMsg
	ack func()
}

// broker makes one fresh queue per trial.
type broker interface {
	name() string
	queue(ctx context.Context, name string, lim limits) (queue, error)
	close()
}

// queue is one trial's stream (or topic) with its consumers.
type queue interface {
	// publish sends m; it may return before the broker confirmed it.
	// errRejected means the queue was full.
	publish(ctx context.Context, m labMsg) error
	// put is a blocking put's single try: it returns once the broker
	// accepted m, or errRejected when the queue is full.
	put(ctx context.Context, m labMsg) error
	// flush waits for unconfirmed publishes and returns how many the
	// broker rejected since the last flush.
	flush(ctx context.Context) int
	// source returns a sluice Source for a route with the given window.
	source(ctx context.Context, o srcOpts) (consumer.Source, error)
	// raw starts the unprotected consumer: every message the broker has is
	// pulled at once and pushed to deliver, without any bound. Stop it with
	// the returned function.
	raw(ctx context.Context, deliver func(rawDelivery)) (stop func(), err error)
	// depth is the number of messages not yet acked (in the broker or held
	// by a consumer).
	depth(ctx context.Context) (int, error)
	close()
}

// newBroker starts the broker named by kind. "nats" uses url, or an
// embedded nats-server when url is "" (in a child process unless
// inProcess). "kafka" runs kfake in process, or uses $KAFKA_BROKERS.
func newBroker(kind, url string, inProcess bool, payload int) (broker, error) {
	switch kind {
	case "nats":
		return newNATSBroker(url, inProcess, payload)
	case "memory":
		return &memBroker{payload: payload}, nil
	case "kafka", "kfake":
		return newKafkaBroker(inProcess, payload)
	}
	return nil, fmt.Errorf("overloadlab: unknown broker %q (nats, memory, kafka)", kind)
}

// ---- NATS JetStream ----

type natsBroker struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	stop    func()
	payload int
}

func newNATSBroker(url string, inProcess bool, payload int) (*natsBroker, error) {
	b := &natsBroker{payload: payload, stop: func() {}}
	if url == "" && !inProcess {
		u, stop, err := startServerProcess()
		if err != nil {
			return nil, err
		}
		url, b.stop = u, stop
	}
	if url == "" {
		dir, err := os.MkdirTemp("", "sluice-overloadlab")
		if err != nil {
			return nil, err
		}
		srv, err := natstest.Run(dir)
		if err != nil {
			os.RemoveAll(dir)
			return nil, err
		}
		url = srv.ClientURL()
		b.stop = func() {
			srv.Shutdown()
			srv.WaitForShutdown()
			os.RemoveAll(dir)
		}
	}
	nc, err := nats.Connect(url)
	if err != nil {
		b.stop()
		return nil, err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1<<14))
	if err != nil {
		nc.Close()
		b.stop()
		return nil, err
	}
	b.nc, b.js = nc, js
	return b, nil
}

func (b *natsBroker) name() string { return "nats" }

// serveEnv makes this program a NATS server instead of the lab: the lab
// runs its embedded broker in a child process of itself, so the peak heap
// it reports is the consumer's and the producer's, not the broker's.
const serveEnv = "OVERLOADLAB_SERVE_NATS_DIR"

// kfakeEnv makes this program a kfake Kafka cluster instead of the lab,
// for the same reason.
const kfakeEnv = "OVERLOADLAB_SERVE_KFAKE"

// serveIfChild runs the child server when serveEnv or kfakeEnv is set and
// reports whether it did; the caller then exits with the returned code.
// The child prints its address(es) on one line and stops when its stdin
// closes.
func serveIfChild() (bool, int) {
	if os.Getenv(kfakeEnv) != "" {
		c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(0))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return true, 1
		}
		fmt.Println(strings.Join(c.ListenAddrs(), ","))
		_, _ = io.Copy(io.Discard, os.Stdin)
		c.Close()
		return true, 0
	}
	dir := os.Getenv(serveEnv)
	if dir == "" {
		return false, 0
	}
	srv, err := natstest.Run(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return true, 1
	}
	fmt.Println(srv.ClientURL())
	_, _ = io.Copy(io.Discard, os.Stdin) // the parent closes stdin to stop us
	srv.Shutdown()
	srv.WaitForShutdown()
	return true, 0
}

// startServerProcess starts this executable as a NATS server (see
// serveEnv) and returns its URL.
func startServerProcess() (string, func(), error) {
	dir, err := os.MkdirTemp("", "sluice-overloadlab")
	if err != nil {
		return "", nil, err
	}
	url, stop, err := startChild(serveEnv + "=" + dir)
	if err != nil {
		os.RemoveAll(dir)
		return "", nil, err
	}
	return url, func() { stop(); os.RemoveAll(dir) }, nil
}

// startChild starts this executable with env added and returns the line
// it prints and a function that stops it.
func startChild(env string) (string, func(), error) {
	exe, err := os.Executable()
	if err != nil {
		return "", nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), env)
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return "", nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, err
	}
	stop := func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		stop()
		return "", nil, fmt.Errorf("overloadlab: server process: %w", err)
	}
	return strings.TrimSpace(line), stop, nil
}

func (b *natsBroker) close() {
	b.nc.Close()
	b.stop()
}

func (b *natsBroker) queue(ctx context.Context, name string, lim limits) (queue, error) {
	stream := "LAB_" + name
	cfg := jetstream.StreamConfig{
		Name:      stream,
		Subjects:  []string{"lab." + name},
		Retention: jetstream.WorkQueuePolicy, // acked messages leave: MaxMsgs bounds the unacked
		Storage:   jetstream.MemoryStorage,
	}
	if lim.maxMsgs > 0 {
		cfg.MaxMsgs = int64(lim.maxMsgs)
		cfg.Discard = jetstream.DiscardOld
		if lim.dropNew {
			cfg.Discard = jetstream.DiscardNew
		}
	}
	_ = b.js.DeleteStream(ctx, stream) // a fresh run against a shared server
	if _, err := b.js.CreateStream(ctx, cfg); err != nil {
		return nil, err
	}
	q := &natsQueue{b: b, stream: stream, subject: "lab." + name, futs: make(chan jetstream.PubAckFuture, 1<<16), done: make(chan struct{})}
	go q.checkAcks()
	return q, nil
}

type natsQueue struct {
	b        *natsBroker
	stream   string
	subject  string
	futs     chan jetstream.PubAckFuture
	done     chan struct{}
	pending  sync.WaitGroup
	rejected atomic.Int64
	closeMu  sync.Once
}

func (q *natsQueue) checkAcks() {
	defer close(q.done)
	for f := range q.futs {
		select {
		case <-f.Ok():
		case <-f.Err():
			q.rejected.Add(1)
		}
		q.pending.Done()
	}
}

func (q *natsQueue) msg(m labMsg) *nats.Msg {
	return &nats.Msg{Subject: q.subject, Data: m.encode(q.b.payload), Header: nats.Header(m.headers())}
}

func (q *natsQueue) publish(ctx context.Context, m labMsg) error {
	f, err := q.b.js.PublishMsgAsync(q.msg(m))
	if err != nil {
		return err
	}
	q.pending.Add(1)
	select {
	case q.futs <- f:
	case <-ctx.Done():
		q.pending.Done()
		return ctx.Err()
	}
	return nil
}

func (q *natsQueue) put(ctx context.Context, m labMsg) error {
	_, err := q.b.js.PublishMsg(ctx, q.msg(m))
	if err != nil && ctx.Err() == nil {
		// A full DiscardNew stream answers "maximum messages exceeded".
		return fmt.Errorf("%w: %w", errRejected, err)
	}
	return err
}

func (q *natsQueue) flush(ctx context.Context) int {
	done := make(chan struct{})
	go func() { q.pending.Wait(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
	}
	return int(q.rejected.Swap(0))
}

func (q *natsQueue) source(ctx context.Context, o srcOpts) (consumer.Source, error) {
	var so natsadapter.SourceOptions
	if o.tuned {
		so = natsadapter.SourceOptions{PollWait: 100 * time.Millisecond, Confirm: natsadapter.ConfirmNone}
	}
	cfg := jetstream.ConsumerConfig{Durable: "sluice"}
	if o.tuned && o.messages > 0 {
		cfg.MaxAckPending = o.messages
	}
	return natsadapter.NewSourceFor(ctx, q.b.js, q.stream, cfg, so)
}

func (q *natsQueue) raw(ctx context.Context, deliver func(rawDelivery)) (func(), error) {
	cons, err := q.b.js.CreateOrUpdateConsumer(ctx, q.stream, jetstream.ConsumerConfig{
		Durable: "raw", AckPolicy: jetstream.AckExplicitPolicy, MaxAckPending: -1, // unlimited
	})
	if err != nil {
		return nil, err
	}
	cc, err := cons.Consume(func(m jetstream.Msg) {
		lm, ok := decode(m.Data())
		if !ok {
			_ = m.Term()
			return
		}
		deliver(rawDelivery{msg: lm, ack: func() { _ = m.Ack() }})
	}, jetstream.PullMaxMessages(4096))
	if err != nil {
		return nil, err
	}
	return func() {
		cc.Stop()
		<-cc.Closed()
	}, nil
}

func (q *natsQueue) depth(ctx context.Context) (int, error) {
	s, err := q.b.js.Stream(ctx, q.stream)
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return int(info.State.Msgs), nil
}

func (q *natsQueue) close() {
	q.closeMu.Do(func() {
		close(q.futs)
		<-q.done
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = q.b.js.DeleteStream(ctx, q.stream)
	})
}

// ---- in-memory (sluicetest) ----

// memBroker runs the lab without a broker round trip: the handler model
// alone. It supports tail-drop limits, not head-drop.
type memBroker struct{ payload int }

func (*memBroker) name() string { return "memory" }
func (*memBroker) close()       {}

func (b *memBroker) queue(_ context.Context, _ string, lim limits) (queue, error) {
	if lim.maxMsgs > 0 && !lim.dropNew {
		return nil, fmt.Errorf("%w: no head-drop limit in memory", errUnsupported)
	}
	return &memQueue{src: sluicetest.NewSource(), lim: lim, payload: b.payload}, nil
}

type memQueue struct {
	src       *sluicetest.Source
	lim       limits
	payload   int
	published atomic.Int64
	rejected  atomic.Int64
}

func (q *memQueue) publish(_ context.Context, m labMsg) error {
	if q.lim.maxMsgs > 0 && q.published.Load()-int64(q.src.Settled()) >= int64(q.lim.maxMsgs) {
		q.rejected.Add(1)
		return errRejected
	}
	q.published.Add(1)
	q.src.Publish(strconv.FormatUint(m.id, 10), m.encode(q.payload), consumer.Headers(m.headers()), m.pub)
	return nil
}

func (q *memQueue) put(ctx context.Context, m labMsg) error {
	if err := q.publish(ctx, m); err != nil {
		q.rejected.Add(-1) // a blocking put retries: not a drop
		return err
	}
	return nil
}

func (q *memQueue) flush(context.Context) int { return int(q.rejected.Swap(0)) }

func (q *memQueue) source(context.Context, srcOpts) (consumer.Source, error) { return q.src, nil }

func (q *memQueue) raw(ctx context.Context, deliver func(rawDelivery)) (func(), error) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			msgs, err := q.src.Fetch(ctx, 1<<16, 1<<40)
			if err != nil {
				return
			}
			for _, m := range msgs {
				lm, ok := decode(m.Value)
				if !ok {
					_ = sluicetest.Settle(ctx, m, consumer.Settlement{Op: consumer.SettleTerm, Reason: "undecodable"})
					continue
				}
				deliver(rawDelivery{msg: lm, ack: func() {
					_ = sluicetest.Settle(context.Background(), m, consumer.Settlement{Op: consumer.SettleAck})
				}})
			}
		}
	}()
	return func() { cancel(); <-done }, nil
}

func (q *memQueue) depth(context.Context) (int, error) {
	return int(q.published.Load()) - q.src.Settled(), nil
}

func (q *memQueue) close() {}
