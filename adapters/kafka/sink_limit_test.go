package kafkaadapter_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/dlq"
)

// TestDeadLetterOfOversizedRecord (issue 13.5): a record with a 1 MiB
// header (an origin topic can allow it) was refused by the dead-letter
// topic, so its handler ran again and again. Its letter is now stored cut
// to fit, with the marker, value and envelope kept; a small letter is
// stored unchanged. Runs on kfake, and on the real broker in
// .ci/kafka-suite ($KAFKA_BROKERS).
func TestDeadLetterOfOversizedRecord(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic := cluster.Topic(t, "dlq-big", 1)
	sink, err := kafkaadapter.NewDeadLetterSink(cluster.Kafka(), topic)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	big := &dlq.Letter{Key: []byte("k"), Value: bytes.Repeat([]byte("v"), 4096), Class: dlq.ClassExhausted, Err: "boom", Attempts: 3,
		Headers: map[string][]string{"X-Huge": {strings.Repeat("h", 1<<20)}, "App": {"a"}},
		Origin:  dlq.Origin{Topic: "orders", Partition: 0, Offset: 7, Group: "g"}}
	if err := sink.Write(ctx, big); err != nil {
		t.Fatalf("letter of a record with a 1 MiB header refused: %v", err)
	}
	small := &dlq.Letter{Value: []byte("fine"), Class: dlq.ClassPermanent, Err: "x", Headers: map[string][]string{"App": {"b"}},
		Origin: dlq.Origin{Topic: "orders", Partition: 0, Offset: 8}}
	if err := sink.Write(ctx, small); err != nil {
		t.Fatal(err)
	}
	back, err := kafkaadapter.GetLetter(ctx, cluster.Kafka(), topic, "0/0")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(back.Truncated, "header X-Huge cut from 1048576 to 256 bytes") || len(back.Value) != 4096 ||
		back.Err != "boom" || back.Origin.Offset != 7 || back.Headers["App"][0] != "a" {
		t.Fatalf("big letter read back: truncated %q, value %d bytes, err %q, origin %+v", back.Truncated, len(back.Value), back.Err, back.Origin)
	}
	back, err = kafkaadapter.GetLetter(ctx, cluster.Kafka(), topic, "0/1")
	if err != nil || back.Truncated != "" || string(back.Value) != "fine" || back.Headers["App"][0] != "b" {
		t.Fatalf("small letter: %+v %v", back, err)
	}
}
