package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/health"
	"github.com/sluice-go/sluice/metrics"
	"github.com/sluice-go/sluice/sluicetest"
)

// What every instance shares: the durables, the group and the topic.
const (
	ordersStream    = "ORDERS"
	reportsStream   = "REPORTS"
	paymentsTopic   = "payments"
	paymentsParts   = 6
	kafkaGroup      = "sluice-service"
	poisonEvery     = 200 // one order in poisonEvery is poison: dead-lettered
	failOnceEvery   = 100 // one order in failOnceEvery fails its first attempt
	produceInterval = 100 * time.Millisecond
)

// config is what an instance is told by its flags and environment.
type config struct {
	natsURL     string        // $NATS_URL; "" starts an embedded server
	brokers     []string      // $KAFKA_BROKERS; none: no payments route
	metricsAddr string        // $METRICS_ADDR; "" means 127.0.0.1:0
	rate        float64       // orders per second this instance produces
	runFor      time.Duration // 0: until ctx ends
	// stuckAfter is consumer.HealthPolicy.StuckAfter, grace the liveness
	// grace of /healthz (health.Options.Grace).
	stuckAfter, grace time.Duration
	// beforeOrder, when set, runs before each order is handled (tests: a
	// handler that hangs).
	beforeOrder func(ctx context.Context)
	// until, when set, ends the run as soon as it holds for the routes'
	// stats (tests: run until the work they check is done, with runFor as
	// the bound, not for a fixed time a busy machine may spend elsewhere).
	until func([]consumer.RouteStats) bool
}

func main() {
	rate := flag.Float64("rate", 200, "orders per second this instance produces (reports: a fifth of it, payments: as many); 0 consumes only")
	runFor := flag.Duration("run", 0, "stop after `D` (0: run until SIGINT or SIGTERM)")
	stuckAfter := flag.Duration("stuck-after", 30*time.Second, "a route holding messages that settles none for `D` is stuck (/readyz 503)")
	grace := flag.Duration("liveness-grace", 30*time.Second, "/healthz answers 503 once a route has been stuck or failed for `D`")
	check := flag.Bool("healthcheck", false, "probe the running instance's /healthz on $METRICS_ADDR and exit 0 if it answers 200, else 1 (a container healthcheck: the image has no curl)")
	flag.Parse()
	if *check {
		os.Exit(healthcheck(os.Stdout, os.Getenv("METRICS_ADDR")))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cfg := config{
		natsURL:     os.Getenv("NATS_URL"),
		brokers:     splitList(os.Getenv("KAFKA_BROKERS")),
		metricsAddr: os.Getenv("METRICS_ADDR"),
		rate:        *rate,
		runFor:      *runFor,
		stuckAfter:  *stuckAfter,
		grace:       *grace,
	}
	if err := run(ctx, os.Stdout, cfg); err != nil {
		log.Fatal(err)
	}
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func run(ctx context.Context, out io.Writer, cfg config) error {
	if cfg.rate < 0 {
		return fmt.Errorf("service: -rate %v is negative", cfg.rate)
	}
	if cfg.runFor > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.runFor)
		defer cancel()
	}
	// Setup gets its own deadline: a broker that is not there fails the
	// start instead of hanging it.
	setup, cancelSetup := context.WithTimeout(ctx, 30*time.Second)
	defer cancelSetup()

	if cfg.natsURL == "" {
		dir, err := os.MkdirTemp("", "sluice-service")
		if err != nil {
			return err
		}
		defer os.RemoveAll(dir)
		srv, err := natstest.Run(dir)
		if err != nil {
			return err
		}
		defer srv.WaitForShutdown()
		defer srv.Shutdown()
		cfg.natsURL = srv.ClientURL()
		fmt.Fprintln(out, "embedded NATS server at", cfg.natsURL)
	}
	nc, err := nats.Connect(cfg.natsURL, nats.MaxReconnects(-1))
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	// CreateOrUpdate: the instances start in any order, and a restart
	// keeps what the streams hold.
	for name, subj := range map[string]string{ordersStream: "orders.>", reportsStream: "reports.>"} {
		if _, err := js.CreateOrUpdateStream(setup, jetstream.StreamConfig{Name: name, Subjects: []string{subj}, MaxAge: time.Hour}); err != nil {
			return fmt.Errorf("service: stream %s: %w", name, err)
		}
	}
	sink, err := natsadapter.NewDeadLetterSink(setup, js, natsadapter.SinkOptions{})
	if err != nil {
		return err
	}
	// MaxAckPending is set, not learned: every instance pulls from the same
	// durable, so it leaves room for all their windows and delayed naks.
	durable := func(name string) jetstream.ConsumerConfig {
		return jetstream.ConsumerConfig{Durable: name, MaxAckPending: 4096}
	}
	srcOpts := natsadapter.SourceOptions{PollWait: 250 * time.Millisecond}
	ordersSrc, err := natsadapter.NewSourceFor(setup, js, ordersStream, durable("orders"), srcOpts)
	if err != nil {
		return err
	}
	reportsSrc, err := natsadapter.NewSourceFor(setup, js, reportsStream, durable("reports"), srcOpts)
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", cmp.Or(cfg.metricsAddr, "127.0.0.1:0"))
	if err != nil {
		return err
	}
	// /metrics, and the health a platform probes: /healthz (liveness) and
	// /readyz (readiness). The consumer is made below; until then both
	// answer 503.
	var probe atomic.Pointer[consumer.Consumer]
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	for _, path := range []string{"/healthz", "/readyz"} {
		mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
			c := probe.Load()
			if c == nil {
				http.Error(w, "starting", http.StatusServiceUnavailable)
				return
			}
			health.Handler(c, health.Options{Grace: cfg.grace}).ServeHTTP(w, r)
		})
	}
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: time.Second}
	go hs.Serve(ln)
	defer hs.Close()
	fmt.Fprintf(out, "metrics at http://%s/metrics\n", ln.Addr())
	fmt.Fprintf(out, "health at http://%[1]s/healthz (liveness) and http://%[1]s/readyz (readiness)\n", ln.Addr())

	adaptive, err := backpressure.NewAdaptiveLimit(backpressure.AdaptiveLimitOptions{Min: 1, Max: 16})
	if err != nil {
		return err
	}
	routes := []consumer.Route{{
		Name: "orders", Source: ordersSrc, Workers: 8,
		Window:     consumer.WindowPolicy{Messages: 64, Bytes: 1 << 20},
		Retry:      consumer.RetryPolicy{BaseDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond},
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
		Overload:   consumer.OverloadPolicy{Criticality: backpressure.Critical},
		Handler:    orderHandler,
	}, {
		Name: "reports", Source: reportsSrc, Workers: 2,
		Window:     consumer.WindowPolicy{Messages: 16, Bytes: 256 << 10},
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
		Overload:   consumer.OverloadPolicy{Criticality: backpressure.Sheddable, AdaptiveLimit: adaptive},
		Handler: func(ctx context.Context, m *consumer.Message) error {
			return sleep(ctx, 20*time.Millisecond)
		},
	}}

	var kc *kafkaadapter.Cluster
	if len(cfg.brokers) > 0 {
		kc = &kafkaadapter.Cluster{Brokers: cfg.brokers}
		if err := createTopic(setup, cfg.brokers, paymentsTopic, paymentsParts); err != nil {
			return err
		}
		paymentsSrc, err := kafkaadapter.NewSource(kafkaadapter.Config{
			Cluster: kc, GroupID: kafkaGroup, Topics: []string{paymentsTopic},
			SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
			PollWait: 250 * time.Millisecond, RevokeGrace: time.Second,
		})
		if err != nil {
			return err
		}
		defer paymentsSrc.Close()
		budget, err := backpressure.NewRetryBudget(backpressure.RetryBudgetOptions{})
		if err != nil {
			return err
		}
		routes = append(routes, consumer.Route{
			Name: "payments", Source: paymentsSrc, Workers: 4,
			Window:   consumer.WindowPolicy{Messages: 32, Bytes: 1 << 20},
			Retry:    consumer.RetryPolicy{BaseDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond},
			Overload: consumer.OverloadPolicy{Criticality: backpressure.Critical, RetryBudget: budget},
			Handler: func(ctx context.Context, m *consumer.Message) error {
				return sleep(ctx, 3*time.Millisecond)
			},
		})
	}
	if cfg.beforeOrder != nil {
		routes[0].Handler = func(ctx context.Context, m *consumer.Message) error {
			cfg.beforeOrder(ctx)
			return orderHandler(ctx, m)
		}
	}
	c, err := consumer.New(consumer.Options{Observer: obs, ShutdownGrace: 2 * time.Second,
		Health: consumer.HealthPolicy{StuckAfter: cfg.stuckAfter}}, routes...)
	if err != nil {
		return err
	}
	probe.Store(c)
	cancelSetup()

	// The load this instance adds, until ctx ends.
	prodCtx, stopProducing := context.WithCancel(ctx)
	defer stopProducing()
	prodErr := make(chan error, 2)
	nProducers := 0
	produce := func(f func(context.Context) error) {
		nProducers++
		go func() {
			err := f(prodCtx)
			if prodCtx.Err() != nil {
				err = nil // stopped, not failed
			} else {
				fmt.Fprintf(out, "producer stopped: %v\n", err)
			}
			prodErr <- err
		}()
	}
	if cfg.rate > 0 {
		produce(func(ctx context.Context) error { return produceNATS(ctx, js, cfg.rate) })
		if kc != nil {
			produce(func(ctx context.Context) error { return produceKafka(ctx, cfg.brokers, cfg.rate) })
		}
	}

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	if cfg.until != nil {
		go func() {
			t := time.NewTicker(50 * time.Millisecond)
			defer t.Stop()
			for {
				select {
				case <-runCtx.Done():
					return
				case <-t.C:
					if cfg.until(c.Stats()) {
						stopRun()
						return
					}
				}
			}
		}()
	}
	start := time.Now()
	err = c.Run(runCtx)
	stopProducing()
	for range nProducers {
		if perr := <-prodErr; perr != nil {
			err = errors.Join(err, fmt.Errorf("service: producer: %w", perr))
		}
	}
	fmt.Fprintf(out, "\nran %v\n", time.Since(start).Round(time.Second))
	sluicetest.WriteTable(out, c.Stats())
	if errors.Is(err, consumer.ErrStuckHandlers) {
		err = nil // a handler still sleeping at the end of the grace: harmless here
	}
	return err
}

// healthcheck probes the instance serving on addr ($METRICS_ADDR; an
// unspecified host is this machine) at /healthz, prints its answer and
// returns the exit code: 0 for 200, 1 otherwise.
func healthcheck(out io.Writer, addr string) int {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		fmt.Fprintf(out, "healthcheck: METRICS_ADDR %q: %v\n", addr, err)
		return 1
	}
	if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	cl := &http.Client{Timeout: 5 * time.Second}
	res, err := cl.Get("http://" + net.JoinHostPort(host, port) + "/healthz")
	if err != nil {
		fmt.Fprintf(out, "healthcheck: %v\n", err)
		return 1
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(res.Body, 64<<10))
	fmt.Fprintf(out, "healthcheck: %s\n%s", res.Status, body)
	if res.StatusCode != http.StatusOK {
		return 1
	}
	return 0
}

// orderHandler stands in for real work: 2 ms of I/O; poison orders are
// permanent failures (dead-lettered), and some fail their first attempt.
func orderHandler(ctx context.Context, m *consumer.Message) error {
	n, _ := strconv.Atoi(string(m.Value))
	switch {
	case m.Headers.Get("Poison") != "":
		return consumer.Permanent(errors.New("order cannot be parsed"))
	case n%failOnceEvery == 1 && m.Attempt <= 1:
		return errors.New("inventory service timed out")
	}
	return sleep(ctx, 2*time.Millisecond)
}

// produceNATS publishes rate orders per second (deadline 5 s, one poison in
// poisonEvery) and a fifth as many reports (deadline 2 s) until ctx ends.
func produceNATS(ctx context.Context, js jetstream.JetStream, rate float64) error {
	var orders, reports int
	return every(ctx, rate, func(now time.Time, n int) error {
		for range n {
			h := nats.Header{}
			h.Set(expiry.DefaultHeader, expiry.FormatDeadline(now.Add(5*time.Second)))
			if orders%poisonEvery == poisonEvery-1 {
				h.Set("Poison", "1")
			}
			if _, err := js.PublishMsgAsync(&nats.Msg{Subject: "orders.new", Data: []byte(strconv.Itoa(orders)), Header: h}); err != nil {
				return err
			}
			if orders%5 == 0 {
				h := nats.Header{}
				h.Set(expiry.DefaultHeader, expiry.FormatDeadline(now.Add(2*time.Second)))
				if _, err := js.PublishMsgAsync(&nats.Msg{Subject: "reports.daily", Data: []byte(strconv.Itoa(reports)), Header: h}); err != nil {
					return err
				}
				reports++
			}
			orders++
		}
		select {
		case <-js.PublishAsyncComplete():
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
}

// produceKafka writes rate payments per second to the payments topic until
// ctx ends.
func produceKafka(ctx context.Context, brokers []string, rate float64) error {
	w := &kafka.Writer{
		Addr: kafka.TCP(brokers...), Topic: paymentsTopic, Balancer: &kafka.Hash{},
		RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond, BatchSize: 1000,
		Transport: &kafka.Transport{},
	}
	defer w.Transport.(*kafka.Transport).CloseIdleConnections()
	defer w.Close()
	var payments int
	return every(ctx, rate, func(now time.Time, n int) error {
		msgs := make([]kafka.Message, n)
		for i := range msgs {
			key := strconv.Itoa(payments)
			msgs[i] = kafka.Message{Key: []byte(key), Value: []byte(key), Headers: []kafka.Header{
				{Key: expiry.DefaultHeader, Value: []byte(expiry.FormatDeadline(now.Add(5 * time.Second)))},
			}}
			payments++
		}
		return w.WriteMessages(ctx, msgs...)
	})
}

// every calls send each produceInterval with the number of messages due at
// rate per second since the start, until ctx ends or send fails.
func every(ctx context.Context, rate float64, send func(now time.Time, n int) error) error {
	t := time.NewTicker(produceInterval)
	defer t.Stop()
	start, sent := time.Now(), 0
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case now := <-t.C:
			due := int(rate*now.Sub(start).Seconds()) - sent
			if due <= 0 {
				continue
			}
			if err := send(now, due); err != nil {
				return err
			}
			sent += due
		}
	}
}

// createTopic creates topic with partitions unless it exists, and waits
// until every partition has a leader.
func createTopic(ctx context.Context, brokers []string, topic string, partitions int) error {
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	cl := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: tr}
	res, err := cl.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: 1,
	}}})
	if err != nil {
		return fmt.Errorf("service: create topic %s: %w", topic, err)
	}
	if err := res.Errors[topic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("service: create topic %s: %w", topic, err)
	}
	for {
		md, err := cl.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) > 0 {
			ready := true
			for _, p := range md.Topics[0].Partitions {
				ready = ready && p.Error == nil && p.Leader.Host != ""
			}
			if ready {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("service: topic %s has no leaders: %w", topic, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// sleep stands in for a handler's I/O: it waits d or until ctx ends.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
