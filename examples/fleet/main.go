package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
)

// config is one instance's settings, from flags.
type config struct {
	broker  string // "kafka" or "nats"
	brokers string // Kafka bootstrap addresses, comma-separated
	topic   string
	group   string
	natsURL string
	stream  string
	durable string
	ackWait time.Duration
	pending int // the durable's MaxAckPending, shared by every instance

	workers  int
	window   int
	cost     time.Duration
	commit   time.Duration
	grace    time.Duration
	report   bool
	every    time.Duration
	instance string

	downstream string // call this URL per message instead of waiting cost
	adaptive   bool   // an AdaptiveLimit drives the window
	throttle   bool   // client-side throttling of the pull
}

func main() {
	var c config
	flag.StringVar(&c.broker, "broker", "kafka", "kafka or nats")
	flag.StringVar(&c.brokers, "brokers", os.Getenv("KAFKA_BROKERS"), "Kafka bootstrap addresses (comma-separated)")
	flag.StringVar(&c.topic, "topic", "fleet", "Kafka topic")
	flag.StringVar(&c.group, "group", "fleet", "Kafka consumer group")
	flag.StringVar(&c.natsURL, "nats", nats.DefaultURL, "NATS server URL")
	flag.StringVar(&c.stream, "stream", "FLEET", "JetStream stream")
	flag.StringVar(&c.durable, "durable", "fleet", "JetStream durable consumer, shared by every instance")
	flag.DurationVar(&c.ackWait, "ack-wait", 5*time.Second, "the durable's AckWait")
	flag.IntVar(&c.pending, "max-ack-pending", 1024, "the durable's MaxAckPending (room for every instance's window)")
	flag.IntVar(&c.workers, "workers", 4, "handler goroutines")
	flag.IntVar(&c.window, "window", 16, "the route window: messages held at once (queued, running, settling)")
	flag.DurationVar(&c.cost, "cost", 8*time.Millisecond, "what one message costs the handler (a wait, like a call to another service)")
	flag.DurationVar(&c.commit, "commit-interval", time.Second, "Kafka: how often settled offsets are committed")
	flag.DurationVar(&c.grace, "shutdown-grace", 5*time.Second, "how long running handlers get after SIGTERM")
	flag.BoolVar(&c.report, "report", false, "write the ledger protocol on stdout (see doc.go)")
	flag.DurationVar(&c.every, "report-every", 200*time.Millisecond, "how often -report writes the instance's window line")
	flag.StringVar(&c.instance, "instance", strconv.Itoa(os.Getpid()), "this instance's name in logs")
	flag.StringVar(&c.downstream, "downstream", "", "call this URL for each message instead of waiting -cost; 503 means overloaded")
	flag.BoolVar(&c.adaptive, "adaptive", false, "an AdaptiveLimit drives the window's limit (at most -window)")
	flag.BoolVar(&c.throttle, "throttle", false, "client-side adaptive throttling (SRE) of the route's pull")
	flag.Parse()
	log.SetPrefix("fleet[" + c.instance + "] ")

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	var out io.Writer = io.Discard
	if c.report {
		out = os.Stdout
	}
	if err := run(ctx, c, newReporter(out)); err != nil {
		log.Fatal(err)
	}
}

// member is what differs between the brokers: the route's Source, a
// readiness wait, a line about its assignment, and the closing.
type member struct {
	src    consumer.Source
	ready  func(ctx context.Context) error
	assign func() string
	close  func() error
}

func run(ctx context.Context, c config, rep *reporter) error {
	var m member
	var err error
	switch c.broker {
	case "kafka":
		m, err = kafkaMember(c)
	case "nats":
		m, err = natsMember(ctx, c)
	default:
		err = fmt.Errorf("-broker %q: want kafka or nats", c.broker)
	}
	if err != nil {
		return err
	}
	closed := false
	defer func() {
		if !closed {
			_ = m.close()
		}
	}()

	route := consumer.Route{
		Name: "work", Source: m.src, Workers: c.workers,
		Window: consumer.WindowPolicy{Messages: c.window, Bytes: 1 << 20},
		Expiry: expiry.Policy{IgnoreHeader: true},
		Handler: func(ctx context.Context, msg *consumer.Message) error {
			t := time.NewTimer(c.cost)
			defer t.Stop()
			select {
			case <-t.C:
			case <-ctx.Done():
				return ctx.Err()
			}
			rep.handled(msg)
			return nil
		},
	}
	if err := overloadControls(c, &route, rep); err != nil {
		return err
	}
	cons, err := consumer.New(consumer.Options{ShutdownGrace: c.grace, Hook: rep}, route)
	if err != nil {
		return err
	}
	runErr := make(chan error, 1)
	go func() { runErr <- cons.Run(ctx) }()

	readyCtx, cancel := context.WithTimeout(ctx, time.Minute)
	err = m.ready(readyCtx)
	cancel()
	if err != nil && ctx.Err() == nil {
		return fmt.Errorf("not ready: %w", err)
	}
	rep.line("ready")

	tick := time.NewTicker(c.every)
	defer tick.Stop()
	report := func() {
		st := cons.Stats()[0]
		rep.line(fmt.Sprintf("w %d %d %d %d %s", rep.peak.Load(), st.Window.Peak, st.Window.Limit, st.Held, m.assign()))
	}
	for {
		select {
		case <-tick.C:
			report()
			continue
		case err = <-runErr:
		}
		break
	}
	// Run drained the route; closing commits what it settled (Kafka) and
	// leaves the group.
	closed = true
	cerr := m.close()
	report()
	st := cons.Stats()[0]
	rep.line(fmt.Sprintf("x %d %d", st.Fetched, st.Settled[consumer.OutcomeSucceeded]))
	if errors.Is(err, context.Canceled) {
		err = nil
	}
	return errors.Join(err, cerr)
}

// overloadControls sets up the -downstream handler and the per-instance
// overload controls: each instance's AdaptiveLimit and Throttle work on
// what its own calls to the shared downstream see.
func overloadControls(c config, r *consumer.Route, rep *reporter) error {
	if c.adaptive {
		al, err := backpressure.NewAdaptiveLimit(backpressure.AdaptiveLimitOptions{Max: c.window, Interval: 500 * time.Millisecond})
		if err != nil {
			return err
		}
		r.Overload.AdaptiveLimit = al
	}
	if c.throttle {
		th, err := backpressure.NewThrottle(backpressure.ThrottleOptions{Window: 10 * time.Second})
		if err != nil {
			return err
		}
		r.Overload.Throttle = th
	}
	if c.downstream == "" {
		return nil
	}
	// A refused call is handed back to the broker (with the retry
	// backoff) as often as it takes: the demo counts calls, not letters.
	r.Retry = consumer.RetryPolicy{MaxAttempts: 1000, BaseDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: c.workers}}
	url := c.downstream + "?instance=" + c.instance
	r.Handler = func(ctx context.Context, msg *consumer.Message) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return consumer.Permanent(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		_ = resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
			rep.handled(msg)
			return nil
		case http.StatusServiceUnavailable:
			return backpressure.Overloaded(errors.New("downstream: 503"))
		}
		return fmt.Errorf("downstream: %s", resp.Status)
	}
	return nil
}

func kafkaMember(c config) (member, error) {
	var brokers []string
	for _, b := range strings.Split(c.brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if len(brokers) == 0 {
		return member{}, errors.New("no Kafka brokers: set -brokers or KAFKA_BROKERS")
	}
	src, err := kafkaadapter.NewSource(kafkaadapter.Config{
		Cluster: &kafkaadapter.Cluster{Brokers: brokers}, GroupID: c.group, Topics: []string{c.topic},
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
		CommitInterval: c.commit, PollWait: 250 * time.Millisecond, FetchMaxWait: 250 * time.Millisecond,
	})
	if err != nil {
		return member{}, err
	}
	return member{
		src:   src,
		ready: src.Ready,
		assign: func() string {
			n := 0
			for _, ps := range src.Assigned() {
				n += len(ps)
			}
			return fmt.Sprintf("%d %d", src.Stats().Generation, n)
		},
		close: src.Close,
	}, nil
}

func natsMember(ctx context.Context, c config) (member, error) {
	nc, err := nats.Connect(c.natsURL, nats.Name("fleet-"+c.instance), nats.MaxReconnects(-1))
	if err != nil {
		return member{}, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return member{}, err
	}
	// Every instance states the same durable: the first creates it, the
	// others find it unchanged, and the server spreads the durable's
	// messages over their pull requests.
	src, err := natsadapter.NewSourceFor(ctx, js, c.stream, jetstream.ConsumerConfig{
		Durable: c.durable, AckWait: c.ackWait, MaxAckPending: c.pending,
	}, natsadapter.SourceOptions{PollWait: 250 * time.Millisecond})
	if err != nil {
		nc.Close()
		return member{}, err
	}
	return member{
		src:    src,
		ready:  func(context.Context) error { return nil },
		assign: func() string { return "0 0" },
		close: func() error {
			// Run has waited for every settlement's confirmation, so
			// nothing is in doubt when the Source and connection go.
			err := src.Close()
			nc.Close()
			return err
		},
	}, nil
}

// reporter writes the ledger protocol: one line per event, each written
// with one write call so a SIGKILL loses no line that was written.
//
//	ready                  the instance has joined (Kafka: its first assignment)
//	h ID ATTEMPT           the handler finished message ID, delivered for the
//	                       ATTEMPTth time (before it is settled)
//	s ID                   the broker has message ID's ack (Kafka: marked for the next commit)
//	w HOOK PEAK LIMIT HELD GEN PARTS
//	                       every -report-every: the most messages held at once
//	                       counted by this hook, the route's own Window.Peak, its
//	                       window limit, what it holds now, and (Kafka) its
//	                       generation and number of assigned partitions
//	x FETCHED SUCCEEDED    at a graceful exit
type reporter struct {
	mu   sync.Mutex
	out  io.Writer
	held atomic.Int64
	peak atomic.Int64
}

func newReporter(out io.Writer) *reporter { return &reporter{out: out} }

func (r *reporter) line(s string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	_, _ = io.WriteString(r.out, s+"\n")
}

func (r *reporter) handled(m *consumer.Message) {
	r.line("h " + string(m.Value) + " " + strconv.Itoa(m.Attempt))
}

// HookRoute implements consumer.Hook: the reporter counts what the route
// holds from outside the route's own stats.
func (r *reporter) HookRoute(consumer.RouteInfo) consumer.MessageHook { return r }

func (r *reporter) Held(ctx context.Context, m *consumer.Message, w consumer.Waits) context.Context {
	n := r.held.Add(1)
	for {
		p := r.peak.Load()
		if n <= p || r.peak.CompareAndSwap(p, n) {
			break
		}
	}
	return ctx
}

func (r *reporter) Event(ctx context.Context, m *consumer.Message, e consumer.Event) {
	if e.Kind != consumer.EventSettled {
		return
	}
	r.held.Add(-1)
	if e.Settlement.Op == consumer.SettleAck && e.Err == nil {
		r.line("s " + string(m.Value))
	}
}
