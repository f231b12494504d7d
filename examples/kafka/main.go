package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

const (
	numOrders  = 3000
	numReports = 600
	numPoison  = 10
)

func main() {
	if err := run(os.Stdout); err != nil {
		log.Fatal(err)
	}
}

func run(out io.Writer) error {
	ctx, cancel := context.WithTimeout(context.Background(), 28*time.Second)
	defer cancel()

	cl, err := kafkatest.New()
	if err != nil {
		return err
	}
	defer cl.Close()
	fmt.Fprintf(out, "%s cluster at %v\n", cl.Kind(), cl.Brokers)

	orders, reports, dead := kafkatest.UniqueName("orders"), kafkatest.UniqueName("reports"), kafkatest.UniqueName("dlq")
	for topic, parts := range map[string]int{orders: 4, reports: 2, dead: 1} {
		if err := cl.CreateTopic(ctx, topic, parts); err != nil {
			return err
		}
	}
	sink, err := kafkaadapter.NewDeadLetterSink(cl.Kafka(), dead)
	if err != nil {
		return err
	}
	defer sink.Close()

	// The burst: everything is produced before the consumer starts.
	now := time.Now()
	msg := func(i int, deadline time.Time, poison bool) kafka.Message {
		h := []kafka.Header{{Key: expiry.DefaultHeader, Value: []byte(expiry.FormatDeadline(deadline))}}
		if poison {
			h = append(h, kafka.Header{Key: "Poison", Value: []byte("1")})
		}
		return kafka.Message{Key: []byte(strconv.Itoa(i)), Value: []byte(strconv.Itoa(i)), Headers: h}
	}
	var om, rm []kafka.Message
	for i := range numOrders {
		dl := now.Add(time.Minute)
		if i%50 == 0 {
			dl = now.Add(time.Millisecond) // already about to expire
		}
		om = append(om, msg(i, dl, i%(numOrders/numPoison) == 7))
	}
	for i := range numReports {
		rm = append(rm, msg(i, now.Add(10*time.Second), false)) // the tail will be stale
	}
	if err := cl.Produce(ctx, orders, om); err != nil {
		return err
	}
	if err := cl.Produce(ctx, reports, rm); err != nil {
		return err
	}
	fmt.Fprintf(out, "produced %d orders (%d poison) and %d reports\n", numOrders, numPoison, numReports)

	source := func(topic string) (*kafkaadapter.Source, error) {
		return kafkaadapter.NewSource(kafkaadapter.Config{
			Cluster: cl.Kafka(), GroupID: kafkatest.UniqueName(topic), Topics: []string{topic},
			SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
			PollWait: 250 * time.Millisecond, RevokeGrace: time.Second,
		})
	}
	ordersSrc, err := source(orders)
	if err != nil {
		return err
	}
	defer ordersSrc.Close()
	reportsSrc, err := source(reports)
	if err != nil {
		return err
	}
	defer reportsSrc.Close()

	// Deadlines come from the Sluice-Deadline header (the zero expiry
	// policy reads it); each Source sizes its prefetch from its route's
	// window.
	c, err := consumer.New(consumer.Options{ShutdownGrace: 2 * time.Second},
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
	// Close commits the watermarks once more and leaves the groups.
	_ = ordersSrc.Close()
	_ = reportsSrc.Close()
	fmt.Fprintln(out)
	sluicetest.WriteTable(out, stats)
	for _, x := range []struct {
		name string
		src  *kafkaadapter.Source
	}{{"orders", ordersSrc}, {"reports", reportsSrc}} {
		st := x.src.Stats()
		fmt.Fprintf(out, "source %-8s %d commits, prefetch peak %d bytes (bound %d)\n", x.name, st.Commits, st.PeakBytes, x.src.Bound(0, 4))
	}
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
