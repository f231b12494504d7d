package dlq_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/sluice-go/sluice/dlq"
)

func ExampleDecode() {
	l := &dlq.Letter{Value: []byte(`{"id":7}`), Class: dlq.ClassPermanent, Err: "unknown currency", Attempts: 1,
		Origin: dlq.Origin{Topic: "orders.created", Stream: "ORDERS", Sequence: 7, Partition: -1}}
	headers := l.EnvelopeHeaders() // what an adapter's Sink publishes

	back, err := dlq.Decode(nil, l.Value, headers)
	if err != nil {
		panic(err)
	}
	fmt.Println(back.Class, back.Err, back.Origin.Stream, back.Origin.Sequence)
	// Output: permanent unknown currency ORDERS 7
}

// A replay from an in-memory queue: letters replayed 3 times already are
// parked, the rest go back to their origin with a fresh replay count.
func ExampleReplayer() {
	queue := []*dlq.Pending{}
	for i, replays := range []int{0, 1, 3} {
		l := &dlq.Letter{Value: []byte(fmt.Sprint("order-", i)), Class: dlq.ClassPermanent, Replays: replays,
			Origin: dlq.Origin{Topic: "orders.new", Partition: -1}}
		queue = append(queue, &dlq.Pending{Letter: l, Pos: fmt.Sprint("dlq#", i), Remove: func(context.Context) error { return nil }})
	}
	src := dlq.SourceFunc(func(ctx context.Context, n int) ([]*dlq.Pending, error) {
		if len(queue) == 0 {
			return nil, dlq.ErrDrained
		}
		batch := queue[:min(n, len(queue))]
		queue = queue[len(batch):]
		return batch, nil
	})
	var mu sync.Mutex
	var lines []string
	dst := dlq.TargetFunc(func(ctx context.Context, m *dlq.Outgoing) error {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, fmt.Sprintf("%s → %s, %s=%s", m.Value, m.Topic, dlq.HeaderReplayCount, m.Headers[dlq.HeaderReplayCount][0]))
		return nil
	})
	park := dlq.SinkFunc(func(ctx context.Context, l *dlq.Letter) error {
		mu.Lock()
		defer mu.Unlock()
		lines = append(lines, fmt.Sprintf("%s parked after %d replays", l.Value, l.Replays))
		return nil
	})
	r, err := dlq.NewReplayer(dlq.ReplayOptions{Rate: 1000, Concurrency: 1, Park: park, Allow: []string{"orders.*"}})
	if err != nil {
		panic(err)
	}
	rep, err := r.Run(context.Background(), src, dst)
	if err != nil {
		panic(err)
	}
	sort.Strings(lines)
	for _, l := range lines {
		fmt.Println(l)
	}
	fmt.Println("replayed", rep.Replayed, "parked", rep.Parked)
	// Output:
	// order-0 → orders.new, Sluice-Replay-Count=1
	// order-1 → orders.new, Sluice-Replay-Count=2
	// order-2 parked after 3 replays
	// replayed 2 parked 1
}

func ExampleParseFilter() {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	f, err := dlq.ParseFilter("class=permanent origin=orders.* since=2h", now)
	if err != nil {
		panic(err)
	}
	l := &dlq.Letter{Class: dlq.ClassPermanent, LastFailure: now.Add(-time.Hour), Origin: dlq.Origin{Topic: "orders.new"}}
	fmt.Println(f.Match(l), f.Since.Format(time.Kitchen))
	_, err = dlq.ParseFilter("colour=red", now)
	fmt.Println(err)
	// Output:
	// true 10:00AM
	// sluice: invalid option: bad filter: unknown key "colour" (keys: class, origin, route, since, until)
}

// Where a replay may publish is the operator's choice: here each letter
// goes to its route's retry subject, and a letter naming the JetStream API
// as its origin changes nothing. Without Allow, Destination or Topic a
// replay moves nothing and names what the letters ask for.
func ExampleReplayOptions_destination() {
	letters := []*dlq.Letter{
		{Value: []byte("a"), Route: "orders", Class: dlq.ClassPermanent, Origin: dlq.Origin{Topic: "orders.new", Partition: -1}},
		{Value: []byte("b"), Route: "orders", Class: dlq.ClassPermanent, Origin: dlq.Origin{Topic: "$JS.API.STREAM.PURGE.ORDERS", Partition: -1}},
		{Value: []byte("c"), Route: "", Class: dlq.ClassPermanent},
	}
	src := func() dlq.Source {
		queue := slices.Clone(letters)
		return dlq.SourceFunc(func(ctx context.Context, n int) ([]*dlq.Pending, error) {
			if len(queue) == 0 {
				return nil, dlq.ErrDrained
			}
			var out []*dlq.Pending
			for i, l := range queue[:min(n, len(queue))] {
				out = append(out, &dlq.Pending{Letter: l, Pos: fmt.Sprint("dlq#", i)})
			}
			queue = queue[len(out):]
			return out, nil
		})
	}
	dst := dlq.TargetFunc(func(ctx context.Context, m *dlq.Outgoing) error {
		fmt.Printf("%s → %s\n", m.Value, m.Topic)
		return nil
	})
	r, _ := dlq.NewReplayer(dlq.ReplayOptions{Rate: math.Inf(1), Concurrency: 1, Destination: func(l *dlq.Letter) (string, error) {
		if l.Route == "" {
			return "", errors.New("no route to retry")
		}
		return l.Route + ".retry", nil
	}})
	rep, _ := r.Run(context.Background(), src(), dst)
	fmt.Println("replayed", rep.Replayed, "refused", rep.Refused)

	none, _ := dlq.NewReplayer(dlq.ReplayOptions{Rate: math.Inf(1)})
	_, err := none.Run(context.Background(), src(), dst)
	fmt.Println(err)
	// Output:
	// a → orders.retry
	// b → orders.retry
	// replayed 2 refused 1
	// sluice: replay needs the destinations it may publish to (an allow-list, or one destination for all): nothing was moved; the letters ask for (none) (1), $JS.API.STREAM.PURGE.ORDERS (1), orders.new (1)
}
