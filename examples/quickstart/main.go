package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/internal/demo"
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
	if err := run(os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(out io.Writer) error {
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
		fmt.Fprintln(out, "embedded NATS server at", url)
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
	fmt.Fprintf(out, "published %d orders (%d poison) and %d reports\n", numOrders, numPoison, numReports)

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
	fmt.Fprintf(out, "metrics at http://%s/metrics\n", ln.Addr())

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
				return demo.Sleep(ctx, 2*time.Millisecond)
			},
		},
		consumer.Route{
			Name: "reports", Source: reportsSrc, Criticality: backpressure.Sheddable,
			Workers: 2, MaxInFlight: 8, MaxInFlightBytes: 256 << 10,
			Expiry: exp, DeadLetter: sink, Group: "reports",
			Handler: func(ctx context.Context, m *consumer.Message) error {
				return demo.Sleep(ctx, 50*time.Millisecond)
			},
		})
	if err != nil {
		return err
	}

	const limit = 20 * time.Second
	res, err := demo.Run(ctx, c, limit, numOrders, numReports)
	demo.PrintTable(out, c.Stats())
	demo.Verdict(out, res, "orders", "reports", limit)
	return err
}
