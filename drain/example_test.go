package drain_test

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluice-go/sluice/drain"
	"github.com/sluice-go/sluice/internal/memsource"
)

// A route's source, drained at 1000 messages/s until it catches up with
// messages younger than 5 s.
func Example() {
	backlog := memsource.New()
	for i := range 50 {
		backlog.Publish(strconv.Itoa(i), []byte("x"), nil, time.Now().Add(-time.Hour))
	}
	src, err := drain.New(backlog, drain.Options{Rate: 1000, CaughtUp: 5 * time.Second})
	if err != nil {
		panic(err)
	}
	// consumer.Route{Source: src, Criticality: backpressure.Sheddable, ...}
	ms, _ := src.Fetch(context.Background(), 64, 1<<20)
	fmt.Println(len(ms), "messages in the first batch; draining:", src.Draining())
	for _, m := range ms {
		_ = m.Acker.Ack(context.Background())
	}
	// Output: 20 messages in the first batch; draining: true
}
