package kafkaadapter_test

import (
	"bytes"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
)

// produceBatched writes values to one partition the way librdkafka does
// with its default batching: kcat (a librdkafka producer) when it is
// installed and the broker is plaintext, else kafka-go's Writer with one
// batch for everything. keys[i] (if keys is not nil) keys value i; headers
// go on every record. It returns which producer it used.
func produceBatched(t testing.TB, topic string, partition int, keys, values []string, headers []kafka.Header) string {
	t.Helper()
	if path, err := exec.LookPath("kcat"); err == nil {
		args := []string{"-P", "-b", strings.Join(cluster.Brokers, ","), "-t", topic, "-X", "linger.ms=100"}
		if partition >= 0 {
			args = append(args, "-p", strconv.Itoa(partition))
		}
		if keys != nil {
			args = append(args, "-K", "\t")
		}
		for _, h := range headers {
			args = append(args, "-H", h.Key+"="+string(h.Value))
		}
		var in bytes.Buffer
		for i, v := range values {
			if keys != nil {
				in.WriteString(keys[i] + "\t")
			}
			in.WriteString(v + "\n")
		}
		cmd := exec.Command(path, args...)
		cmd.Stdin = &in
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("kcat: %v: %s", err, out)
		}
		return "kcat"
	}
	w := cluster.Writer(topic)
	defer kafkatest.CloseWriter(w)
	w.BatchSize, w.BatchBytes, w.BatchTimeout = len(values)+1, 16<<20, 100*time.Millisecond
	if partition >= 0 {
		w.Balancer = kafka.BalancerFunc(func(kafka.Message, ...int) int { return partition })
	} else {
		w.Balancer = &kafka.CRC32Balancer{Consistent: true} // librdkafka's default
	}
	msgs := make([]kafka.Message, len(values))
	for i, v := range values {
		msgs[i] = kafka.Message{Value: []byte(v), Headers: headers}
		if keys != nil {
			msgs[i].Key = []byte(keys[i])
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		t.Fatal(err)
	}
	return "kafka-go (one batch)"
}

// TestBoundAndFairness: 3 partitions x 1,000 small records, produced one
// partition at a time in large batches (librdkafka style), read by a route
// with a window of 8 messages / 64 KiB. The Source never holds more than
// its prefetch's bytes (64 KiB) and, by count, the prefetch plus one
// response of at most 8 records per fetch lane (a fetch is sent while
// fewer than 8 are held; of each response's 1,000-record batch it keeps
// 8), and it serves the partitions fairly: within the first 100 messages
// handled, every partition appears at least 20 times. Before, it held
// ~2,000 records and served one partition at a time.
//
// With 4 partitions the Source runs two fetchers (two partitions each):
// every partition gets at least 15 of the first 100.
func TestBoundAndFairness(t *testing.T) {
	for _, parts := range []int{3, 4} {
		t.Run(fmt.Sprintf("partitions=%d", parts), func(t *testing.T) { boundAndFairness(t, parts, 60/parts) })
	}
}

func boundAndFairness(t *testing.T, parts, minShare int) {
	const perPart = 1000
	topic := cluster.Topic(t, "fair", parts)
	group := kafkatest.UniqueName("fair")
	var producer string
	for p := range parts {
		vals := make([]string, perPart)
		for i := range vals {
			vals[i] = fmt.Sprintf("%d:p%d-%d", p*perPart+i, p, i)
		}
		producer = produceBatched(t, topic, p, nil, vals, nil)
	}
	end := endOffsets(t, topic)
	var mu sync.Mutex
	var order []int
	cfg := testConfig(group, topic)
	window := consumer.WindowPolicy{Messages: 8, Bytes: 64 << 10}
	m := startMember(t, cfg, consumer.Route{Workers: 2, Window: window, Handler: func(ctx context.Context, m *consumer.Message) error {
		mu.Lock()
		order = append(order, int(m.Origin.Partition))
		mu.Unlock()
		return nil
	}})
	// 4 partitions took 17-54 s under -race while two fetch lanes split a
	// prefetch of 8 (2 records per partition per fetch); one lane: ~1 s.
	waitFor(t, 60*time.Second, "all committed", func() bool { return committedAll(group, topic, end) })
	m.stop(t)
	st := m.src.Stats()
	mu.Lock()
	defer mu.Unlock()
	counts := make([]int, parts)
	for _, p := range order[:100] {
		counts[p]++
	}
	t.Logf("%s, %s producer: first 100 by partition %v; held at peak %d records / %d bytes; fetched %d for %d handled",
		cluster.Kind(), producer, counts, st.PeakBuffered, st.PeakBytes, st.Fetched, len(order))
	for p, c := range counts {
		if c < minShare {
			t.Errorf("partition %d: %d of the first 100 handled, want >= %d", p, c, minShare)
		}
	}
	if msgs, bytes := kafkaadapter.HeldBound(m.src, 1); st.PeakBuffered > msgs || st.PeakBytes > bytes || bytes != window.Bytes {
		t.Errorf("held %d records / %d bytes at peak, above the bound %d / %d (window %d / %d)",
			st.PeakBuffered, st.PeakBytes, msgs, bytes, window.Messages, window.Bytes)
	}
	if len(order) < parts*perPart {
		t.Errorf("handled %d of %d", len(order), parts*perPart)
	}
}
