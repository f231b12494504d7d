package natsadapter

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/consumer"
)

// TestCloseNaksUnreadDeliveries: what the server delivered for the last
// pull request but no Fetch returned (the route stopped reading) is nak'd
// by Close, so the next Source on the durable gets it at once, in stream
// order, instead of after AckWait (30 s here).
func TestCloseNaksUnreadDeliveries(t *testing.T) {
	js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "UNREAD", Subjects: []string{"unread.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		if _, err := js.Publish(ctx, "unread.x", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	open := func() *Source {
		src, err := NewSourceFor(ctx, js, "UNREAD", jetstream.ConsumerConfig{Durable: "d", AckWait: 30 * time.Second},
			SourceOptions{PollWait: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := src.Attach(consumer.RouteLimits{Route: "r", Messages: 20, Bytes: 1 << 20}); err != nil {
			t.Fatal(err)
		}
		return src
	}
	first := open()
	ch, err := first.subscription(20)
	if err != nil {
		t.Fatal(err)
	}
	if err := first.send(ctx, 20, 0); err != nil {
		t.Fatal(err)
	}
	for len(ch) < 20 && ctx.Err() == nil {
		time.Sleep(time.Millisecond) // the deliveries arriving, unread
	}
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	if n := first.Stats().ReturnedUnread; n != 20 {
		t.Fatalf("Close nak'd %d unread deliveries, want 20", n)
	}
	second := open()
	defer second.Close()
	var got []string
	for len(got) < 20 && ctx.Err() == nil {
		msgs, err := second.Fetch(ctx, 20-len(got), 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range msgs {
			if m.Attempt != 2 {
				t.Errorf("message %s: attempt %d, want 2", m.Value, m.Attempt)
			}
			got = append(got, string(m.Value))
		}
	}
	for i, v := range got {
		if v != strconv.Itoa(i) {
			t.Fatalf("redelivered out of stream order: %v", got)
		}
	}
}
