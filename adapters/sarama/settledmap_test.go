package saramaadapter_test

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/IBM/sarama"

	saramaadapter "github.com/sluice-go/sluice/adapters/sarama"
	"github.com/sluice-go/sluice/consumer"
)

// ledger counts runs per message id.
type ledger struct {
	mu   sync.Mutex
	runs map[int]int
	ok   map[int]bool
}

func (l *ledger) handler(stuck func(id int) bool) consumer.Handler {
	return func(_ context.Context, m *consumer.Message) error {
		id, _ := strconv.Atoi(string(m.Value))
		l.mu.Lock()
		defer l.mu.Unlock()
		l.runs[id]++
		if stuck(id) {
			return errors.New("stuck")
		}
		l.ok[id] = true
		return nil
	}
}

func (l *ledger) done() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ok)
}

func publishIDs(t *testing.T, topic string, n, partitions int) {
	t.Helper()
	msgs := make([]*sarama.ProducerMessage, n)
	for i := range msgs {
		msgs[i] = &sarama.ProducerMessage{Topic: topic, Partition: int32(i % partitions), Value: sarama.StringEncoder(strconv.Itoa(i))}
	}
	p, err := sarama.NewSyncProducer(brokers, func() *sarama.Config {
		c := saramaConfig()
		c.Producer.Partitioner = sarama.NewManualPartitioner
		return c
	}())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if err := p.SendMessages(msgs); err != nil {
		t.Fatal(err)
	}
}

func runUntil(t *testing.T, c *consumer.Consumer, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	deadline := time.Now().Add(60 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			cancel()
			<-done
			t.Fatalf("timed out; stats %+v", c.Stats())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func newRoute(t *testing.T, src consumer.Source, h consumer.Handler) *consumer.Consumer {
	t.Helper()
	c, err := consumer.New(consumer.Options{ShutdownGrace: 2 * time.Second}, consumer.Route{
		Name: "settled", Source: src, Handler: h, Workers: 8,
		Window: consumer.WindowPolicy{Messages: 64, Bytes: 1 << 20},
		Retry:  consumer.RetryPolicy{MaxAttempts: 1000, BaseDelay: 20 * time.Millisecond, MaxDelay: 20 * time.Millisecond},
	})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestSettledMapRestart: a message that keeps failing holds its partition's
// commit point while the 199 after it succeed; the member closes (sarama
// commits the final mark with the settled map as metadata) and the next
// member passes over the 199 and runs only the stuck one.
func TestSettledMapRestart(t *testing.T) {
	topic, group := uniqueName("settled"), uniqueName("settled-g")
	createTopic(t, topic, 1)
	publishIDs(t, topic, 200, 1)
	l := &ledger{runs: map[int]int{}, ok: map[int]bool{}}

	first := newMember(t, group, []string{topic}, saramaadapter.Config{}, nil)
	runUntil(t, newRoute(t, first, l.handler(func(id int) bool { return id == 0 })), func() bool { return l.done() == 199 })
	if err := first.Close(); err != nil {
		t.Fatal(err)
	}
	admin, err := sarama.NewClusterAdmin(brokers, saramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	res, err := admin.ListConsumerGroupOffsets(group, map[string][]int32{topic: {0}})
	if err != nil {
		t.Fatal(err)
	}
	if b := res.GetBlock(topic, 0); b == nil || b.Offset != 0 || b.Metadata == "" {
		t.Fatalf("committed %+v, want offset 0 with the settled map as metadata", b)
	}

	second := newMember(t, group, []string{topic}, saramaadapter.Config{}, nil)
	runUntil(t, newRoute(t, second, l.handler(func(int) bool { return false })), func() bool { return l.done() == 200 })
	st := second.Stats()
	if st.MapsRestored != 1 || st.SkippedSettled != 199 {
		t.Errorf("second member: MapsRestored %d SkippedSettled %d, want 1 and 199", st.MapsRestored, st.SkippedSettled)
	}
	for id := 1; id < 200; id++ {
		if l.runs[id] != 1 {
			t.Errorf("id %d ran %d times, want once", id, l.runs[id])
		}
	}
}

// TestSettledMapRebalance: two partitions, each with a message that fails
// until the second member joined; the rebalance that assigns it one of
// them commits each claim's map, and no message that succeeded runs again
// on either member.
func TestSettledMapRebalance(t *testing.T) {
	const n = 400
	topic, group := uniqueName("settledreb"), uniqueName("settledreb-g")
	createTopic(t, topic, 2)
	publishIDs(t, topic, n, 2)
	l := &ledger{runs: map[int]int{}, ok: map[int]bool{}}
	var mu sync.Mutex
	released := false
	stuck := func(id int) bool {
		mu.Lock()
		defer mu.Unlock()
		return id < 2 && !released
	}

	a := newMember(t, group, []string{topic}, saramaadapter.Config{}, nil)
	ca := newRoute(t, a, l.handler(stuck))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	doneA := make(chan error, 1)
	go func() { doneA <- ca.Run(ctx) }()
	deadline := time.Now().Add(60 * time.Second)
	for l.done() < n-2 {
		if time.Now().After(deadline) {
			t.Fatalf("first member: %d done", l.done())
		}
		time.Sleep(5 * time.Millisecond)
	}
	b := newMember(t, group, []string{topic}, saramaadapter.Config{}, nil)
	cb := newRoute(t, b, l.handler(stuck))
	doneB := make(chan error, 1)
	go func() { doneB <- cb.Run(ctx) }()
	b.waitClaims(t, 1)
	a.waitClaims(t, 1)
	mu.Lock()
	released = true
	mu.Unlock()
	for l.done() < n {
		if time.Now().After(deadline) {
			t.Fatalf("after the rebalance: %d done", l.done())
		}
		time.Sleep(5 * time.Millisecond)
	}
	cancel()
	if err := <-doneA; err != nil {
		t.Fatal(err)
	}
	if err := <-doneB; err != nil {
		t.Fatal(err)
	}
	if got := a.Stats().SkippedSettled + b.Stats().SkippedSettled; got == 0 {
		t.Error("no member passed over a settled offset: the maps were not restored")
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := 2; id < n; id++ {
		if l.runs[id] != 1 {
			t.Errorf("id %d ran %d times, want once", id, l.runs[id])
		}
	}
}
