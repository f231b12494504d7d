package natsadapter_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/consumer"
)

// waitState polls c's health until route 0 is in want (a TCP broker runs
// in real time), and returns it.
func waitState(t *testing.T, c *consumer.Consumer, want consumer.RouteState, reason string) consumer.RouteHealth {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		rh := c.Health().Routes[0]
		if rh.State == want && strings.Contains(rh.Reason, reason) {
			return rh
		}
		if time.Now().After(deadline) {
			t.Fatalf("health %+v: want %s with %q", rh, want, reason)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// The Source reports its connection through SourceInfo.Ready: a server
// that goes down makes the route not ready, with the connection's status
// as the reason, and the route is ready again once the server is back.
func TestHealthServerDownAndBack(t *testing.T) {
	r := newFaultRig(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := r.js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}}); err != nil {
		t.Fatal(err)
	}
	src, err := natsadapter.NewSourceFor(ctx, r.js, "WORK", jetstream.ConsumerConfig{Durable: "health"}, natsadapter.SourceOptions{PollWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Options{}, consumer.Route{Name: "work", Source: src,
		Handler: func(context.Context, *consumer.Message) error { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	waitState(t, c, consumer.StateIdle, "holds nothing")

	r.mu.Lock()
	r.srv.Shutdown()
	r.srv.WaitForShutdown()
	rh := waitState(t, c, consumer.StateNotReady, `source not ready: natsadapter: consumer "health": connection RECONNECTING`)
	if ok, _ := c.Health().Ready(); ok {
		t.Fatal("ready with the server down")
	}
	if ok, _ := c.Health().Live(0); !ok {
		t.Fatal("not live with the server down: a restart would not bring it back")
	}
	s, err := natstest.RunAt(r.dir, r.port)
	if err != nil {
		r.mu.Unlock()
		t.Fatal(err)
	}
	r.srv = s
	r.mu.Unlock()
	back := waitState(t, c, consumer.StateIdle, "")
	if !back.Since.After(rh.Since) {
		t.Fatalf("back since %v, down since %v", back.Since, rh.Since)
	}
	if _, err := r.js.Publish(ctx, "work.x", []byte("v")); err != nil {
		t.Fatal(err)
	}
	for c.Stats()[0].Settled[consumer.OutcomeSucceeded] == 0 {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	src.Close()
	waitState(t, c, consumer.StateStopped, "shutting down")
}
