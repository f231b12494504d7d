package natstest_test

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-go/sluice/adapters/nats/natstest"
)

// Start a JetStream server inside the process (no installation, 127.0.0.1
// only), as the quick start and the adapter tests do. In a test, Start and
// JetStream do the same and clean up with the test.
func ExampleRun() {
	dir, err := os.MkdirTemp("", "natstest")
	if err != nil {
		panic(err)
	}
	defer os.RemoveAll(dir)
	srv, err := natstest.Run(dir)
	if err != nil {
		panic(err)
	}
	defer func() { srv.Shutdown(); srv.WaitForShutdown() }()

	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stream, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	if err != nil {
		panic(err)
	}
	if _, err := js.Publish(ctx, "orders.created", []byte("42")); err != nil {
		panic(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		panic(err)
	}
	fmt.Println("messages stored:", info.State.Msgs)
	// Output: messages stored: 1
}
