package kafkaadapter_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
)

// TestReaderSource wraps an application's own group Reader: out-of-order
// completion, commits through CommitMessages only below settled work.
func TestReaderSource(t *testing.T) {
	const n, parts = 2000, 4
	topic := cluster.Topic(t, "reader", parts)
	group := kafkatest.UniqueName("reader")
	end := produceN(t, topic, n, 32, nil)
	l := newLedger(t, topic)
	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers: cluster.Brokers, GroupID: group, Topic: topic, StartOffset: kafka.FirstOffset,
		SessionTimeout: 6 * time.Second, HeartbeatInterval: 250 * time.Millisecond, MaxWait: 100 * time.Millisecond,
	})
	defer r.Close()
	win := consumer.WindowPolicy{Messages: 128, Bytes: 1 << 20}
	src, err := kafkaadapter.NewReaderSource(r, kafkaadapter.ReaderOptions{
		CommitInterval: 20 * time.Millisecond, PollWait: 200 * time.Millisecond, OnCommit: l.onCommit,
	})
	if err != nil {
		t.Fatal(err)
	}
	c, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "reader",
		Source:  src,
		Workers: 16,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			if rand.IntN(10) == 0 {
				time.Sleep(time.Duration(rand.IntN(10)) * time.Millisecond)
			}
			l.finish(m.Origin)
			return nil
		},
		Window: win,
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	waitFor(t, 40*time.Second, "all committed", func() bool { return committedAll(group, topic, end) })
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	unique, dups := l.counts()
	t.Logf("%s: %d unique, %d dups, %d commits, stats %+v", cluster.Kind(), unique, dups, l.commits, src.Stats())
	if int64(unique) != total(end) {
		t.Fatalf("finished %d of %d", unique, total(end))
	}
	for _, f := range l.failures() {
		t.Error(f)
	}
	plain := kafka.NewReader(kafka.ReaderConfig{Brokers: cluster.Brokers, Topic: topic})
	defer plain.Close()
	if _, err := kafkaadapter.NewReaderSource(plain, kafkaadapter.ReaderOptions{}); err == nil {
		t.Error("a Reader without GroupID was accepted")
	}
}
