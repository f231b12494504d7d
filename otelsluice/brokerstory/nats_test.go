package brokerstory_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/otelsluice"
	"github.com/sluice-go/sluice/otelsluice/internal/storytest"
)

// The story on the embedded NATS server: naks redeliver with the original
// headers, the dead letter goes to the DLQ stream with the failure's
// context in its envelope, and the replay republishes to the subject.
func TestStoryNATS(t *testing.T) {
	js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	src, err := natsadapter.NewSourceFor(ctx, js, "ORDERS", jetstream.ConsumerConfig{Durable: "orders"},
		natsadapter.SourceOptions{PollWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	storytest.Run(t, storytest.NewTracing(t), storytest.Broker{
		System: "nats",
		Topic:  "orders.new",
		Source: src,
		Sink:   sink,
		Publish: func(ctx context.Context, h map[string][]string, v []byte) error {
			_, err := js.PublishMsg(ctx, &nats.Msg{Subject: "orders.new", Header: nats.Header(h), Data: v})
			return err
		},
		Letters: func(ctx context.Context) (dlq.Source, func()) {
			ls, err := natsadapter.NewLetterSource(ctx, js, natsadapter.LetterSourceOptions{})
			if err != nil {
				t.Fatal(err)
			}
			return ls, func() { _ = ls.Close(context.Background()) }
		},
		Target: natsadapter.NewReplayTarget(js),
		Where: func(t *testing.T, s sdktrace.ReadOnlySpan) {
			storytest.WantAttrs(t, s, map[attribute.Key]string{otelsluice.AttrStream: "ORDERS", otelsluice.AttrSequence: "1",
				"messaging.consumer.group.name": "orders"})
		},
	})
}
