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
	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/internal/demo"
	"github.com/sluice-go/sluice/internal/kafkatest"
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

	ordersWin := kafkaadapter.Window{Messages: 64, Bytes: 1 << 20}
	reportsWin := kafkaadapter.Window{Messages: 8, Bytes: 256 << 10}
	source := func(topic string, w kafkaadapter.Window) (*kafkaadapter.Source, error) {
		return kafkaadapter.NewSource(kafkaadapter.Config{
			Cluster: cl.Kafka(), GroupID: kafkatest.UniqueName(topic), Topics: []string{topic}, Window: w,
			SessionTimeout: 6 * time.Second, HeartbeatInterval: 500 * time.Millisecond,
			PollWait: 250 * time.Millisecond, RevokeGrace: time.Second,
		})
	}
	ordersSrc, err := source(orders, ordersWin)
	if err != nil {
		return err
	}
	defer ordersSrc.Close()
	reportsSrc, err := source(reports, reportsWin)
	if err != nil {
		return err
	}
	defer reportsSrc.Close()

	exp := expiry.Policy{UseHeader: true}
	c, err := consumer.New(consumer.Options{ShutdownGrace: 2 * time.Second},
		consumer.Route{
			Name: "orders", Source: ordersSrc, Criticality: backpressure.Critical,
			Workers: 8, MaxInFlight: ordersWin.Messages, MaxInFlightBytes: ordersWin.Bytes,
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
			Workers: 2, MaxInFlight: reportsWin.Messages, MaxInFlightBytes: reportsWin.Bytes,
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
	// Close commits the watermarks once more and leaves the groups.
	_ = ordersSrc.Close()
	_ = reportsSrc.Close()
	demo.PrintTable(out, c.Stats())
	for _, x := range []struct {
		name string
		src  *kafkaadapter.Source
	}{{"orders", ordersSrc}, {"reports", reportsSrc}} {
		st := x.src.Stats()
		fmt.Fprintf(out, "source %-8s %d commits, prefetch peak %d bytes (bound %d)\n", x.name, st.Commits, st.PeakBytes, x.src.Bound(0, 4))
	}
	demo.Verdict(out, res, "orders", "reports", limit)
	return err
}
