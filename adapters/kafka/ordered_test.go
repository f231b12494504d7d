package kafkaadapter_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
)

// produceKeyed writes n messages "i:", message i on key "key<keyOf(i)>",
// partitioned by key with murmur2 as Kafka's producers do, and returns the
// end offsets.
func produceKeyed(t testing.TB, topic string, n int, keyOf func(i int) int) map[int]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: []byte("key" + strconv.Itoa(keyOf(i))), Value: []byte(strconv.Itoa(i) + ":")}
	}
	w := cluster.Writer(topic)
	w.Balancer = &kafka.Murmur2Balancer{}
	defer kafkatest.CloseWriter(w)
	for len(msgs) > 0 {
		k := min(len(msgs), 1000)
		if err := w.WriteMessages(ctx, msgs[:k]...); err != nil {
			t.Fatal(err)
		}
		msgs = msgs[k:]
	}
	return endOffsets(t, topic)
}

// seqOf reads the publish index produceKeyed wrote.
func seqOf(m *consumer.Message) int {
	s, _, _ := strings.Cut(string(m.Value), ":")
	n, _ := strconv.Atoi(s)
	return n
}

// keyOrder checks per-key order across every consumer of a group: two runs
// of a key never overlap, and no run starts after a run of a later message
// of its key started (a retry of the same message may follow it). With
// handlers far shorter than RevokeGrace a rebalance redelivers nothing that
// ran (the final commit's map lists it), so even a duplicate would count.
type keyOrder struct {
	mu         sync.Mutex
	running    map[string]int
	last       map[string]int // highest sequence started, per key
	ran        map[int]bool
	violations []string
}

func newKeyOrder() *keyOrder {
	return &keyOrder{running: map[string]int{}, last: map[string]int{}, ran: map[int]bool{}}
}

func (o *keyOrder) start(key string, seq int) (end func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.running[key] > 0 {
		o.violations = append(o.violations, fmt.Sprintf("key %s: %d started while the key ran", key, seq))
	}
	if last, ok := o.last[key]; ok && seq < last {
		o.violations = append(o.violations, fmt.Sprintf("key %s: %d ran after %d", key, seq, last))
	}
	o.ran[seq] = true
	o.last[key] = max(o.last[key], seq)
	o.running[key]++
	return func() {
		o.mu.Lock()
		o.running[key]--
		o.mu.Unlock()
	}
}

func (o *keyOrder) done() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.ran)
}

func (o *keyOrder) check(t *testing.T) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	for i, v := range o.violations {
		if i == 10 {
			t.Errorf("... %d violations", len(o.violations))
			break
		}
		t.Error(v)
	}
}

// TestOrderedRebalance: ByKey routes on three members that join and leave
// under load, some messages failing once and retried in place after up to
// 2 s (longer than RevokeGrace): no key ever runs on two members at once,
// and no message runs after a later message of its key, across every
// revoke.
func TestOrderedRebalance(t *testing.T) {
	const n, parts, keys = 4000, 4, 300
	topic := cluster.Topic(t, "orderrebal", parts)
	group := kafkatest.UniqueName("orderrebal")
	produceKeyed(t, topic, n, func(int) int { return rand.IntN(keys) })
	check := newKeyOrder()
	route := consumer.Route{
		Workers: 8, Ordering: consumer.ByKey,
		// Retries wait longer than RevokeGrace: the old owner must not run
		// them (nor the key's later messages) once the new owner may.
		Retry: consumer.RetryPolicy{MaxAttempts: 5, BaseDelay: 2 * time.Second, MaxDelay: 2 * time.Second},
		Handler: func(_ context.Context, m *consumer.Message) error {
			seq := seqOf(m)
			defer check.start(string(m.Key), seq)()
			time.Sleep(time.Duration(500+rand.IntN(1500)) * time.Microsecond)
			if seq%37 == 5 && m.Attempt == 1 {
				return errors.New("not yet")
			}
			return nil
		},
	}
	progress := func(k int) func() bool { return func() bool { return check.done() >= k } }
	a := startMember(t, testConfig(group, topic), route)
	waitFor(t, 30*time.Second, "first progress", progress(n/5))
	b := startMember(t, testConfig(group, topic), route)
	waitFor(t, 30*time.Second, "progress with two", progress(2*n/5))
	c := startMember(t, testConfig(group, topic), route)
	waitFor(t, 30*time.Second, "progress with three", progress(3*n/5))
	a.stop(t)
	waitFor(t, 30*time.Second, "progress after a left", progress(4*n/5))
	b.stop(t)
	deadline := time.Now().Add(60 * time.Second)
	for !progress(n)() {
		if time.Now().After(deadline) {
			check.mu.Lock()
			var missing []int
			for i := range n {
				if !check.ran[i] && len(missing) < 20 {
					missing = append(missing, i)
				}
			}
			check.mu.Unlock()
			t.Fatalf("not all the work ran: missing %v; route %+v; source %+v; committed %v", missing, c.c.Stats()[0], c.src.Stats(), func() map[int]int64 {
				got, _ := cluster.Committed(context.Background(), group, topic, parts)
				return got
			}())
		}
		time.Sleep(20 * time.Millisecond)
	}
	c.stop(t)
	var gens, returned, retries int64
	for _, m := range []*member{a, b, c} {
		gens += m.src.Stats().Generations
		s := m.c.Stats()[0]
		returned += int64(s.Settled[consumer.OutcomeReturned])
		retries += int64(s.Order.Retries)
	}
	t.Logf("%s: %d messages on %d keys, %d generations, %d handed back unstarted on revoke or stop, %d retried in place",
		cluster.Kind(), n, keys, gens, returned, retries)
	check.check(t)
	if gens < 5 {
		t.Errorf("only %d generations: no churn", gens)
	}
}
