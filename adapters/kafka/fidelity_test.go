package kafkaadapter_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
)

func headerString(hs []kafka.Header) string {
	var b strings.Builder
	for _, h := range hs {
		fmt.Fprintf(&b, "%q=%q ", h.Key, h.Value)
	}
	return b.String()
}

// TestPartitionAndHeaderFidelity: 100 keyed messages produced by kcat
// (librdkafka's default partitioner, not murmur2) with headers out of key
// order and a duplicate key, all dead-lettered, then replayed: each letter
// carries the original headers byte-identical and in order (then the
// envelope), and each replayed message lands on its original partition
// with the same headers in the same order (plus Sluice-Replay-Count).
// Before, headers came out sorted and replays were hashed with FNV-1a.
func TestPartitionAndHeaderFidelity(t *testing.T) {
	const n, parts = 100, 4
	topic := cluster.Topic(t, "fidelity", parts)
	dlqTopic := cluster.Topic(t, "fidelity-dlq", 2)
	group := kafkatest.UniqueName("fidelity")
	keys, vals := make([]string, n), make([]string, n)
	for i := range n {
		keys[i], vals[i] = fmt.Sprintf("order-%d", i), fmt.Sprintf("%d:v", i)
	}
	hs := []kafka.Header{{Key: "trace", Value: []byte("t-1")}, {Key: "b", Value: []byte("1")},
		{Key: "a", Value: []byte("2")}, {Key: "b", Value: []byte("3")}}
	producer := produceBatched(t, topic, -1, keys, vals, hs)
	end := endOffsets(t, topic)
	original := map[string]kafka.Message{}
	for _, m := range readTopic(t, topic) {
		original[string(m.Value)] = m
	}

	sink, err := kafkaadapter.NewDeadLetterSink(cluster.Kafka(), dlqTopic)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	m := startMember(t, testConfig(group, topic), consumer.Route{
		Handler:    func(context.Context, *consumer.Message) error { return consumer.Permanent(errors.New("poison")) },
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
	})
	waitFor(t, 30*time.Second, "all dead-lettered", func() bool { return committedAll(group, topic, end) })
	m.stop(t)

	for _, l := range readTopic(t, dlqTopic) {
		o := original[string(l.Value)]
		if got := l.Headers[:min(len(o.Headers), len(l.Headers))]; headerString(got) != headerString(o.Headers) {
			t.Fatalf("letter of %s starts with headers %s, want the original %s", l.Value, headerString(got), headerString(o.Headers))
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	src, err := kafkaadapter.NewLetterSource(ctx, kafkaadapter.LetterSourceConfig{Cluster: cluster.Kafka(), Topic: dlqTopic})
	if err != nil {
		t.Fatal(err)
	}
	rp, err := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{topic}, Rate: math.Inf(1)})
	if err != nil {
		t.Fatal(err)
	}
	rep, err := rp.Run(ctx, src, newTarget(t))
	closeSource(t, src)
	if err != nil || rep.Replayed != n {
		t.Fatalf("replayed %d of %d: %v", rep.Replayed, n, err)
	}
	moved, wrongPart, wrongHeaders := 0, 0, 0
	for _, r := range readTopic(t, topic) {
		if r.Offset < end[r.Partition] {
			continue
		}
		moved++
		o := original[string(r.Value)]
		if r.Partition != o.Partition {
			wrongPart++
		}
		want := append(slices.Clone(o.Headers), kafka.Header{Key: dlq.HeaderReplayCount, Value: []byte("1")})
		if headerString(r.Headers) != headerString(want) || !slices.Equal(r.Key, o.Key) {
			wrongHeaders++
			if wrongHeaders == 1 {
				t.Errorf("replay of %s: headers %s, want %s", r.Value, headerString(r.Headers), headerString(want))
			}
		}
	}
	t.Logf("%s, %s producer: %d replayed, %d on another partition, %d with other headers", cluster.Kind(), producer, moved, wrongPart, wrongHeaders)
	if moved != n || wrongPart > 0 || wrongHeaders > 0 {
		t.Fatalf("replayed %d of %d: %d on another partition than the original, %d with other headers", moved, n, wrongPart, wrongHeaders)
	}
}
