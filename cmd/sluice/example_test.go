package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/dlq"
)

// Listing and replaying the dead letters of an embedded server.
func Example() {
	dir, _ := os.MkdirTemp("", "sluice-cli-example")
	defer os.RemoveAll(dir)
	srv, err := natstest.Run(dir)
	if err != nil {
		panic(err)
	}
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	nc, _ := nats.Connect(srv.ClientURL())
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	_, _ = js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}})
	sink, _ := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	at := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	for i := range 3 {
		_ = sink.Write(ctx, &dlq.Letter{Route: "orders", Class: dlq.ClassPermanent, Err: "bad order",
			Value: []byte(fmt.Sprint(i)), Attempts: 1, FirstFailure: at, LastFailure: at,
			Origin: dlq.Origin{Topic: "orders.new", Stream: "ORDERS", Sequence: uint64(i + 1), Group: "orders", Partition: -1}})
	}

	execute(ctx, []string{"dlq", "ls", "--nats", srv.ClientURL()}, os.Stdout, os.Stderr)
	execute(ctx, []string{"dlq", "replay", "--nats", srv.ClientURL(), "--rate", "inf", "--allow", "orders.*", "--dry-run"}, os.Stdout, os.Stderr)
	// Output:
	// stream SLUICE_DLQ: 3 letters
	//
	// ORIGIN             CLASS      COUNT  MAX REPLAYS  OLDEST FAILURE        NEWEST FAILURE
	// ORDERS/orders.new  permanent  3      0            2026-12-02T09:00:00Z  2026-12-02T09:00:00Z
	// dry run on stream SLUICE_DLQ: nothing is published or removed
	// replay SLUICE_DLQ#1 → orders.new  class=permanent replays=0 last=2026-12-02T09:00:00Z
	// replay SLUICE_DLQ#2 → orders.new  class=permanent replays=0 last=2026-12-02T09:00:00Z
	// replay SLUICE_DLQ#3 → orders.new  class=permanent replays=0 last=2026-12-02T09:00:00Z
	// would replay 3, park 0; left in place: held 0, skipped 0, malformed 0
	// destinations:
	//   orders.new  3 letters
}
