package saramaadapter_test

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	saramaadapter "github.com/sluice-go/sluice/adapters/sarama"
	"github.com/sluice-go/sluice/consumer"
)

// TestRevokeHandsBackUnstarted: a slow route holds a window of messages
// from two claims when a second member joins. The claims end: what the
// route had not started is handed back, not run (consumer.Revocable), and
// what ran was marked within the grace; every message runs exactly once
// across both members.
func TestRevokeHandsBackUnstarted(t *testing.T) {
	const n = 300
	topic, group := uniqueName("revoke"), uniqueName("revoke-g")
	createTopic(t, topic, 2)
	publishIDs(t, topic, n, 2)
	var mu sync.Mutex
	runs := map[int]int{}
	h := func(_ context.Context, m *consumer.Message) error {
		time.Sleep(20 * time.Millisecond)
		id, _ := strconv.Atoi(string(m.Value))
		mu.Lock()
		runs[id]++
		mu.Unlock()
		return nil
	}
	done := func() int {
		mu.Lock()
		defer mu.Unlock()
		return len(runs)
	}
	route := func(src consumer.Source) *consumer.Consumer {
		c, err := consumer.New(consumer.Options{ShutdownGrace: 2 * time.Second}, consumer.Route{
			Name: "revoke", Source: src, Handler: h, Workers: 2, Ordering: consumer.ByPartition,
			Window: consumer.WindowPolicy{Messages: 64, Bytes: 1 << 20},
		})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a := newMember(t, group, []string{topic}, saramaadapter.Config{}, nil)
	ca := route(a)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	doneA := make(chan error, 1)
	go func() { doneA <- ca.Run(ctx) }()
	deadline := time.Now().Add(60 * time.Second)
	for done() < 20 {
		if time.Now().After(deadline) {
			t.Fatal("first member ran nothing")
		}
		time.Sleep(time.Millisecond)
	}
	b := newMember(t, group, []string{topic}, saramaadapter.Config{}, nil)
	cb := route(b)
	doneB := make(chan error, 1)
	go func() { doneB <- cb.Run(ctx) }()
	for done() < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d ran", done(), n)
		}
		time.Sleep(5 * time.Millisecond)
	}
	returned := ca.Stats()[0].Settled[consumer.OutcomeReturned]
	cancel()
	if err := <-doneA; err != nil {
		t.Fatal(err)
	}
	if err := <-doneB; err != nil {
		t.Fatal(err)
	}
	if returned == 0 {
		t.Error("the first member handed nothing back at the revoke: the case proves nothing")
	}
	mu.Lock()
	defer mu.Unlock()
	for id := range n {
		if runs[id] != 1 {
			t.Errorf("id %d ran %d times, want once", id, runs[id])
		}
	}
	t.Logf("handed back at the revoke: %d; stale settles A %d B %d", returned, a.Stats().StaleSettles, b.Stats().StaleSettles)
}
