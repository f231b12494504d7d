// Command quickstart runs two sluice routes over NATS JetStream under a
// burst far above their capacity: critical orders and sheddable reports,
// each with its own window and workers, dead letters to a JetStream stream.
//
//	go run ./examples/quickstart
//
// It starts an embedded NATS server unless $NATS_URL is set, keeping its
// JetStream store in -store DIR if given (so the dead letters outlive the
// run: "go run ./cmd/sluice dlq ls --nats-store DIR"), else in a temporary
// directory removed at exit. It serves
// Prometheus metrics on $METRICS_ADDR (default 127.0.0.1:0, printed), and
// prints a table per route when orders are all settled or after 20 s.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/internal/natstest"
	"github.com/sluice-go/sluice/metrics"
)

const (
	numOrders  = 3000
	numReports = 600
	numPoison  = 10
)

var storeDir = flag.String("store", "", "keep the embedded server's JetStream store in `DIR` (default: a temporary directory, removed at exit)")

func main() {
	flag.Parse()
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 28*time.Second)
	defer cancel()

	url := os.Getenv("NATS_URL")
	if url == "" {
		dir := *storeDir
		if dir == "" {
			tmp, err := os.MkdirTemp("", "sluice-quickstart")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			dir = tmp
		}
		srv, err := natstest.Run(dir)
		if err != nil {
			return err
		}
		defer srv.WaitForShutdown()
		defer srv.Shutdown()
		url = srv.ClientURL()
		fmt.Println("embedded NATS server at", url)
	}
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}

	for name, subj := range map[string]string{"ORDERS": "orders.>", "REPORTS": "reports.>"} {
		_ = js.DeleteStream(ctx, name) // a fresh run against a shared server
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{subj}}); err != nil {
			return err
		}
	}
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		return err
	}

	// The burst: everything is published before the consumer starts.
	now := time.Now()
	var futs []jetstream.PubAckFuture
	pub := func(subj string, i int, deadline time.Time, poison bool) error {
		h := nats.Header{}
		h.Set(expiry.DefaultHeader, expiry.FormatDeadline(deadline))
		if poison {
			h.Set("Poison", "1")
		}
		f, err := js.PublishMsgAsync(&nats.Msg{Subject: subj, Data: []byte(strconv.Itoa(i)), Header: h})
		futs = append(futs, f)
		return err
	}
	for i := range numOrders {
		dl := now.Add(time.Minute)
		if i%50 == 0 {
			dl = now.Add(time.Millisecond) // already about to expire
		}
		if err := pub("orders.new", i, dl, i%(numOrders/numPoison) == 7); err != nil {
			return err
		}
	}
	for i := range numReports {
		dl := now.Add(10 * time.Second) // the tail will be stale by the time it runs
		if err := pub("reports.daily", i, dl, false); err != nil {
			return err
		}
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	fmt.Printf("published %d orders (%d poison) and %d reports\n", numOrders, numPoison, numReports)

	var ordersDone atomic.Int64 // unix nanos when orders finished
	var reportsDone atomic.Int64
	ordersSrc, err := natsadapter.NewSourceFor(ctx, js, "ORDERS", jetstream.ConsumerConfig{Durable: "orders"}, 64, natsadapter.SourceOptions{PollWait: 250 * time.Millisecond})
	if err != nil {
		return err
	}
	reportsSrc, err := natsadapter.NewSourceFor(ctx, js, "REPORTS", jetstream.ConsumerConfig{Durable: "reports"}, 8, natsadapter.SourceOptions{PollWait: 250 * time.Millisecond})
	if err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	obs, err := metrics.New(reg)
	if err != nil {
		return err
	}
	addr := os.Getenv("METRICS_ADDR")
	if addr == "" {
		addr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: promhttp.HandlerFor(reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: time.Second}
	go hs.Serve(ln)
	defer hs.Close()
	fmt.Printf("metrics at http://%s/metrics\n", ln.Addr())

	exp := expiry.Policy{UseHeader: true}
	c, err := consumer.New(consumer.Options{Observer: obs, ShutdownGrace: 2 * time.Second},
		consumer.Route{
			Name: "orders", Source: ordersSrc, Criticality: backpressure.Critical,
			Workers: 8, MaxInFlight: 64, MaxInFlightBytes: 1 << 20,
			Expiry: exp, DeadLetter: sink, Group: "orders",
			Retry: consumer.RetryPolicy{BaseDelay: 5 * time.Millisecond, MaxDelay: 50 * time.Millisecond},
			Handler: func(ctx context.Context, m *consumer.Message) error {
				if m.Headers.Get("Poison") != "" {
					return consumer.Permanent(errors.New("order cannot be parsed"))
				}
				return sleep(ctx, 2*time.Millisecond)
			},
		},
		consumer.Route{
			Name: "reports", Source: reportsSrc, Criticality: backpressure.Sheddable,
			Workers: 2, MaxInFlight: 8, MaxInFlightBytes: 256 << 10,
			Expiry: exp, DeadLetter: sink, Group: "reports",
			Handler: func(ctx context.Context, m *consumer.Message) error {
				return sleep(ctx, 50*time.Millisecond)
			},
		})
	if err != nil {
		return err
	}

	runCtx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	start := time.Now()
	go func() { errc <- c.Run(runCtx) }()
	settled := func(s consumer.RouteStats) uint64 {
		return s.Settled[consumer.OutcomeSucceeded] + s.Settled[consumer.OutcomeDeadLettered] +
			s.Settled[consumer.OutcomeExpired] + s.Settled[consumer.OutcomeTerminated]
	}
	limit := time.NewTimer(20 * time.Second)
	defer limit.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
loop:
	for {
		select {
		case <-limit.C:
			break loop
		case <-ctx.Done():
			break loop
		case <-tick.C:
			st := c.Stats()
			if ordersDone.Load() == 0 && settled(st[0]) >= numOrders {
				ordersDone.Store(time.Now().UnixNano())
				break loop
			}
			if reportsDone.Load() == 0 && settled(st[1]) >= numReports {
				reportsDone.Store(time.Now().UnixNano())
			}
		}
	}
	stop()
	runErr := <-errc

	fmt.Printf("\n%-8s %8s %9s %8s %8s %9s %8s %12s\n", "route", "fetched", "succeeded", "expired", "retried", "dead-lett", "goodput", "peak/window")
	for _, s := range c.Stats() {
		fmt.Printf("%-8s %8d %9d %8d %8d %9d %8d %7d/%-4d\n", s.Name, s.Fetched,
			s.Settled[consumer.OutcomeSucceeded], s.Settled[consumer.OutcomeExpired], s.Settled[consumer.OutcomeRetried],
			s.Settled[consumer.OutcomeDeadLettered], s.Goodput(), s.PeakInFlight, s.MaxInFlight)
	}
	od, rd := ordersDone.Load(), reportsDone.Load()
	switch {
	case od == 0:
		fmt.Printf("\norders did NOT finish within 20 s\n")
	case rd == 0 || od < rd:
		fmt.Printf("\norders finished in %v, before reports: not starved\n", time.Duration(od-start.UnixNano()).Round(time.Millisecond))
	default:
		fmt.Printf("\norders finished in %v, after reports\n", time.Duration(od-start.UnixNano()).Round(time.Millisecond))
	}
	if runErr != nil && !errors.Is(runErr, consumer.ErrStuckHandlers) {
		return runErr
	}
	return nil
}

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
