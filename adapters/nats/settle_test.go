package natsadapter_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
)

// TestBatchConfirmsPlainAcksByLaterAnswer: with the default ConfirmBatch
// most acks go without a reply subject, and each of them is confirmed by
// the server's answer to a later one. A watcher on another connection sees
// every ack in the order the server received them: the first asks for an
// answer (nothing was answered yet on this connection), the last asks for
// one (no plain ack is left waiting for a later answer), and the route
// counts every message settled only once the server took all the acks.
func TestBatchConfirmsPlainAcksByLaterAnswer(t *testing.T) {
	const n, workers = 2000, 8
	ctx, js := setup(t, n)
	var mu sync.Mutex
	var order []bool // true: the ack asked for an answer
	wnc, err := nats.Connect(js.Conn().ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wnc.Close)
	if _, err := wnc.Subscribe("$JS.ACK.WORK.>", func(m *nats.Msg) {
		if string(m.Data) == "+ACK" {
			mu.Lock()
			order = append(order, m.Reply != "")
			mu.Unlock()
		}
	}); err != nil {
		t.Fatal(err)
	}
	if err := wnc.Flush(); err != nil {
		t.Fatal(err)
	}
	src, err := natsadapter.NewSourceFor(ctx, js, "WORK", jetstream.ConsumerConfig{Durable: "batch"}, natsadapter.SourceOptions{PollWait: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// The workers finish in groups, so settlements reach the writer
	// together: the k-th handler run waits for the others of its group.
	groups := make([]chan struct{}, n/workers)
	for i := range groups {
		groups[i] = make(chan struct{})
	}
	counts := make([]atomic.Int64, len(groups))
	var arrived atomic.Int64
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "batch",
		Source:  src,
		Workers: workers,
		Expiry:  expiry.Policy{IgnoreHeader: true},
		Handler: func(context.Context, *consumer.Message) error {
			g := int(arrived.Add(1)-1) / workers
			if g < len(groups) {
				if counts[g].Add(1) == workers {
					close(groups[g])
				}
				<-groups[g]
			}
			return nil
		},
		Window: consumer.WindowPolicy{Messages: 64, Bytes: 1 << 20},
	})
	if err != nil {
		t.Fatal(err)
	}
	runUntil(t, c, 45*time.Second, func() bool {
		return c.Stats()[0].Settled[consumer.OutcomeSucceeded] == n
	}, nil)
	info, err := src.Consumer().Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.NumAckPending != 0 || info.AckFloor.Stream != n {
		t.Fatalf("server: %d ack pending, ack floor %d: a settlement counted confirmed had not landed", info.NumAckPending, info.AckFloor.Stream)
	}
	st := src.Stats()
	mu.Lock()
	defer mu.Unlock()
	deadline := time.Now().Add(5 * time.Second)
	for len(order) < n && time.Now().Before(deadline) {
		mu.Unlock()
		time.Sleep(10 * time.Millisecond)
		mu.Lock()
	}
	requests := 0
	for _, r := range order {
		if r {
			requests++
		}
	}
	t.Logf("%d acks: %d asked for an answer, %d plain; covered %d, re-sent %d", len(order), requests, len(order)-requests, st.AcksCovered, st.AcksResent)
	if len(order) != n {
		t.Fatalf("watcher saw %d acks, want %d", len(order), n)
	}
	if !order[0] || !order[n-1] {
		t.Fatalf("first ack asked for an answer: %v, last: %v (want both)", order[0], order[n-1])
	}
	if plain := uint64(n - requests); plain == 0 || st.AcksCovered != plain {
		t.Fatalf("%d plain acks, %d confirmed by a later answer", plain, st.AcksCovered)
	}
}
