package franzadapter_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	franzadapter "github.com/sluice-go/sluice/adapters/franz"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
)

// An existing kgo group consumer keeps its options (brokers, TLS, SASL,
// group, topics, tuning); its PollFetches loop becomes a sluice route. The
// Source builds the client from the same options when the route attaches
// it, adding only manual commits and its rebalance callbacks.
func ExampleNewSource() {
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(2, "orders"))
	if err != nil {
		panic(err)
	}
	defer fake.Close()
	producer, err := kgo.NewClient(kgo.SeedBrokers(fake.ListenAddrs()...), kgo.DefaultProduceTopic("orders"))
	if err != nil {
		panic(err)
	}
	defer producer.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := producer.ProduceSync(ctx, kgo.StringRecord("a"), kgo.StringRecord("b"), kgo.StringRecord("c")).FirstErr(); err != nil {
		panic(err)
	}

	// The options the service already builds its consumer with. Before:
	//	cl, _ := kgo.NewClient(opts...)
	//	for { fetches := cl.PollFetches(ctx); ...; cl.CommitUncommittedOffsets(ctx) }
	opts := []kgo.Opt{
		kgo.SeedBrokers(fake.ListenAddrs()...),
		kgo.ConsumerGroup("orders-service"),
		kgo.ConsumeTopics("orders"),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()),
		// kgo.DialTLSConfig(...), kgo.SASL(...): kept as they are.
	}
	src, err := franzadapter.NewSource(franzadapter.Config{}, opts...)
	if err != nil {
		panic(err)
	}
	defer src.Close()
	// Dead letters go through a kgo producer too (here the same one).
	sink, err := franzadapter.NewDeadLetterSink(producer, "orders-dlq")
	if err != nil {
		panic(err)
	}

	var handled atomic.Int64
	runCtx, stop := context.WithCancel(ctx)
	cons, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "orders",
		Source:  src,
		Workers: 4,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			if handled.Add(1) == 3 {
				stop()
			}
			return nil
		},
		Window:     consumer.WindowPolicy{Messages: 64, Bytes: 1 << 20}, // the Source sizes its prefetch from it
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
	})
	if err != nil {
		panic(err)
	}
	if err := cons.Run(runCtx); err != nil {
		panic(err)
	}
	fmt.Println("handled", handled.Load(), "messages")
	// Output: handled 3 messages
}

// A dead letter keeps the original record's key, value and header order,
// and carries why it died; dlq.Decode reads it back.
func ExampleDeadLetterSink() {
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(1, "orders-dlq"))
	if err != nil {
		panic(err)
	}
	defer fake.Close()
	cl, err := kgo.NewClient(kgo.SeedBrokers(fake.ListenAddrs()...), kgo.ConsumeTopics("orders-dlq"))
	if err != nil {
		panic(err)
	}
	defer cl.Close()
	sink, err := franzadapter.NewDeadLetterSink(cl, "orders-dlq")
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err = sink.Write(ctx, &dlq.Letter{Key: []byte("k"), Value: []byte("payload"), Err: "card declined", Attempts: 3,
		Origin: dlq.Origin{Topic: "orders", Partition: 0, Offset: 41, Group: "orders-service"}})
	if err != nil {
		panic(err)
	}
	fs := cl.PollFetches(ctx)
	r := fs.Records()[0]
	h := map[string][]string{}
	for _, kh := range r.Headers {
		h[kh.Key] = append(h[kh.Key], string(kh.Value))
	}
	l, err := dlq.Decode(r.Key, r.Value, h)
	if err != nil {
		panic(err)
	}
	fmt.Println(string(l.Value), "|", l.Err, "| attempts", l.Attempts, "| from", l.Origin.Topic, l.Origin.Offset)
	// Output: payload | card declined | attempts 3 | from orders 41
}
