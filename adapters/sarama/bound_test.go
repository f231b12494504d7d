package saramaadapter_test

import (
	"context"
	"sync"
	"testing"
	"time"

	saramaadapter "github.com/sluice-go/sluice/adapters/sarama"
	"github.com/sluice-go/sluice/consumer"
)

// TestBoundAndFairness: four partitions with a backlog each, a window of 8
// and a slow handler. The Handler never holds more than its prefetch (the
// window's numbers), and the route is served the partitions in turn: of
// the first 64 messages run, every partition has at least 8 (a fair share
// is 16; a claim filling the prefetch alone would give one partition all).
func TestBoundAndFairness(t *testing.T) {
	const parts, per = 4, 200
	topic, group := uniqueName("bound"), uniqueName("bound-g")
	createTopic(t, topic, parts)
	publishIDs(t, topic, parts*per, parts)
	sc := saramaConfig()
	sc.ChannelBufferSize = 4
	m := newMember(t, group, []string{topic}, saramaadapter.Config{}, sc)
	var mu sync.Mutex
	var order []int32
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name: "bound", Source: m, Workers: 4,
		Window: consumer.WindowPolicy{Messages: 8, Bytes: 1 << 20},
		Handler: func(_ context.Context, msg *consumer.Message) error {
			time.Sleep(time.Millisecond)
			mu.Lock()
			order = append(order, msg.Origin.Partition)
			mu.Unlock()
			return nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	// Let every claim fill sarama's channels before the route takes any.
	m.waitClaims(t, parts)
	var st saramaadapter.Stats
	runUntil(t, c, func() bool {
		mu.Lock()
		defer mu.Unlock()
		// Read before the route stops: what it hands back at shutdown
		// waits as in-process retries, in their own allowance.
		st = m.Stats()
		return len(order) >= 400
	})
	if st.PeakBuffered > 8 || st.PeakBytes > 1<<20 {
		t.Errorf("held %d messages, %d bytes outside the window; the prefetch is 8 and 1 MiB", st.PeakBuffered, st.PeakBytes)
	}
	if st.PeakBuffered == 0 {
		t.Error("nothing was ever buffered: the case proves nothing")
	}
	mu.Lock()
	defer mu.Unlock()
	per4 := map[int32]int{}
	for _, p := range order[:64] {
		per4[p]++
	}
	for p := range int32(parts) {
		if per4[p] < 8 {
			t.Errorf("partition %d ran %d of the first 64 messages (shares %v)", p, per4[p], per4)
		}
	}
	t.Logf("peak %d messages, %d bytes; first 64 by partition %v; bound with sarama's channels %d", st.PeakBuffered, st.PeakBytes, per4, m.Bound(sc, parts))
}
