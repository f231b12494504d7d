package natsadapter_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/adaptertest"
)

// TestAdapterSuite runs the cases every adapter passes, on the embedded
// nats-server.
func TestAdapterSuite(t *testing.T) {
	adaptertest.Run(t, natsBroker{}, adaptertest.Features{RedeliveryDelay: time.Second})
}

type natsBroker struct{}

func (natsBroker) NewTopic(t *testing.T, name string) adaptertest.Topic {
	js := natstest.JetStream(t)
	stream := strings.ToUpper(name)
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{name + ".>"}}); err != nil {
		t.Fatal(err)
	}
	return &natsTopic{js: js, stream: stream, prefix: name}
}

type natsTopic struct {
	js     jetstream.JetStream
	stream string
	prefix string // subjects are prefix.KEY (the Source's default key), prefix.x without a Key
}

func (tp *natsTopic) Publish(t *testing.T, msgs []adaptertest.Msg) {
	t.Helper()
	futs := make([]jetstream.PubAckFuture, 0, len(msgs))
	for _, m := range msgs {
		h := nats.Header{"Id": []string{m.ID}}
		for k, v := range m.Headers {
			h.Set(k, v)
		}
		subject := tp.prefix + ".x"
		if m.Key != "" {
			subject = tp.prefix + "." + m.Key
		}
		// A loaded machine (go test -race ./... on 2 cores) can leave more
		// than the client's 4000 publishes unanswered for longer than the
		// default 200 ms stall wait; waiting is right, failing is not.
		f, err := tp.js.PublishMsgAsync(&nats.Msg{Subject: subject, Data: m.Value, Header: h}, jetstream.WithStallWait(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		case <-time.After(10 * time.Second):
			t.Fatal("publish not acknowledged within 10s")
		}
	}
}

func (tp *natsTopic) Source(t *testing.T, group string) consumer.Source {
	t.Helper()
	src, err := natsadapter.NewSourceFor(context.Background(), tp.js, tp.stream,
		jetstream.ConsumerConfig{Durable: group, AckWait: 5 * time.Second},
		natsadapter.SourceOptions{PollWait: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return src
}
