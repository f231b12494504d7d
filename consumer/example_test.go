package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/sluicetest"
)

// One route with its own window and workers. The handler fails one message
// permanently; without a dead-letter sink it is terminated and counted.
func Example() {
	src := sluicetest.NewSource() // an adapter's Source in real use: adapters/nats, adapters/kafka
	for _, id := range []string{"a", "b", "poison", "c"} {
		src.Publish(id, []byte("payload"), nil, time.Time{})
	}
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "orders",
		Source:  src,
		Workers: 2,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			if string(m.Key) == "poison" {
				return consumer.Permanent(errors.New("cannot decode"))
			}
			return nil
		},
		Window:   consumer.WindowPolicy{Messages: 8, Bytes: 1 << 20},
		Overload: consumer.OverloadPolicy{Criticality: backpressure.Critical},
	})
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- c.Run(ctx) }()
	for c.Stats()[0].Fetched < 4 || c.Stats()[0].Held > 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	fmt.Println("run:", <-done)
	s := c.Stats()[0]
	fmt.Println("succeeded:", s.Settled[consumer.OutcomeSucceeded])
	fmt.Println("terminated:", s.Settled[consumer.OutcomeTerminated])
	// Output:
	// run: <nil>
	// succeeded: 3
	// terminated: 1
}
