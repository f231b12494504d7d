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
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/metrics"
	"github.com/sluice-go/sluice/sluicetest"
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

	ordersSrc, err := natsadapter.NewSourceFor(ctx, js, "ORDERS", jetstream.ConsumerConfig{Durable: "orders"}, natsadapter.SourceOptions{PollWait: 250 * time.Millisecond})
	if err != nil {
		return err
	}
	reportsSrc, err := natsadapter.NewSourceFor(ctx, js, "REPORTS", jetstream.ConsumerConfig{Durable: "reports"}, natsadapter.SourceOptions{PollWait: 250 * time.Millisecond})
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

	// Deadlines come from the Sluice-Deadline header (the zero expiry
	// policy reads it).
	c, err := consumer.New(consumer.Options{Observer: obs, ShutdownGrace: 2 * time.Second},
		consumer.Route{
			Name: "orders", Source: ordersSrc, Workers: 8,
			Window:     consumer.WindowPolicy{Messages: 64, Bytes: 1 << 20},
			Retry:      consumer.RetryPolicy{BaseDelay: 5 * time.Millisecond, MaxDelay: 50 * time.Millisecond},
			DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
			Overload:   consumer.OverloadPolicy{Criticality: backpressure.Critical},
			Handler: func(ctx context.Context, m *consumer.Message) error {
				if m.Headers.Get("Poison") != "" {
					return consumer.Permanent(errors.New("order cannot be parsed"))
				}
				return sleep(ctx, 2*time.Millisecond)
			},
		},
		consumer.Route{
			Name: "reports", Source: reportsSrc, Workers: 2,
			Window:     consumer.WindowPolicy{Messages: 8, Bytes: 256 << 10},
			DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
			Overload:   consumer.OverloadPolicy{Criticality: backpressure.Sheddable},
			Handler: func(ctx context.Context, m *consumer.Message) error {
				return sleep(ctx, 50*time.Millisecond)
			},
		})
	if err != nil {
		return err
	}

	// Run until every order is settled for good, noting when each route
	// got there.
	const limit = 20 * time.Second
	start := time.Now()
	var ordersDone, reportsDone time.Duration
	stats, err := sluicetest.RunUntil(ctx, c, limit, func(st []consumer.RouteStats) bool {
		if ordersDone == 0 && sluicetest.Final(st[0]) >= numOrders {
			ordersDone = time.Since(start)
		}
		if reportsDone == 0 && sluicetest.Final(st[1]) >= numReports {
			reportsDone = time.Since(start)
		}
		return ordersDone > 0
	})
	fmt.Fprintln(out)
	sluicetest.WriteTable(out, stats)
	switch {
	case ordersDone == 0:
		fmt.Fprintf(out, "\norders did NOT finish within %v\n", limit)
	case reportsDone == 0 || ordersDone < reportsDone:
		fmt.Fprintf(out, "\norders finished in %v, before reports: not starved\n", ordersDone.Round(time.Millisecond))
	default:
		fmt.Fprintf(out, "\norders finished in %v, after reports\n", ordersDone.Round(time.Millisecond))
	}
	if errors.Is(err, consumer.ErrStuckHandlers) {
		err = nil // the slow reports route may still be mid-handler: expected
	}
	return err
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
