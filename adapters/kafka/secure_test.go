package kafkaadapter_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
)

// TestSecureClusters runs every client sluice builds from one Cluster (a
// group Source with a retry topic, a DeadLetterSink, a LetterSource, a
// ReplayTarget and GetLetter) against a TLS listener and SASL listeners:
// kfake with a CA made by the test in `go test work`, the real broker's
// listeners from `scripts/kafka start --tls --sasl plain,scram` in
// .ci/kafka-suite.
func TestSecureClusters(t *testing.T) {
	for _, sec := range []kafkatest.Security{
		{TLS: true},
		{SASL: "PLAIN"},
		{SASL: "SCRAM-SHA-256"},
		{SASL: "SCRAM-SHA-512"},
		{TLS: true, SASL: "SCRAM-SHA-512"}, // kfake only: the script has no SASL_SSL listener
	} {
		t.Run(fmt.Sprintf("tls=%v,sasl=%s", sec.TLS, sec.SASL), func(t *testing.T) {
			c := kafkatest.StartSecure(t, sec)
			secureRoundTrip(t, c)
		})
	}
}

func secureRoundTrip(t *testing.T, c *kafkatest.Cluster) {
	const n = 20
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	topic, retryTopic, dlqTopic := kafkatest.UniqueName("sec"), kafkatest.UniqueName("sec-r"), kafkatest.UniqueName("sec-dlq")
	for _, tp := range []string{topic, retryTopic, dlqTopic} {
		if err := c.CreateTopic(ctx, tp, 2); err != nil {
			t.Fatal(err)
		}
	}
	msgs := make([]kafka.Message, n)
	for i := range msgs {
		msgs[i] = kafka.Message{Key: []byte("k" + strconv.Itoa(i)), Value: []byte(strconv.Itoa(i))}
	}
	if err := c.Produce(ctx, topic, msgs); err != nil {
		t.Fatal(err)
	}
	k := c.Kafka()
	sink, err := kafkaadapter.NewDeadLetterSink(k, dlqTopic)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	cfg := testConfig(kafkatest.UniqueName("sec"), topic)
	cfg.Cluster = k
	cfg.RetryTopic = retryTopic
	cfg.LocalRetryMaxDelay = time.Nanosecond // every retry goes through the retry topic
	src, err := kafkaadapter.NewSource(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	handled := make(chan struct{}, n)
	cons, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "sec",
		Source:  src,
		Workers: 2,
		Retry:   consumer.RetryPolicy{MaxAttempts: 2, BaseDelay: 50 * time.Millisecond, MaxDelay: 50 * time.Millisecond},
		Handler: func(ctx context.Context, m *consumer.Message) error {
			defer func() { handled <- struct{}{} }()
			switch {
			case string(m.Value) == "3":
				return consumer.Permanent(errors.New("poison"))
			case string(m.Value) == "4" && m.Attempt == 1:
				return errors.New("later") // through the retry topic
			}
			return nil
		},
		Window:     consumer.WindowPolicy{Messages: 16, Bytes: 1 << 20},
		DeadLetter: consumer.DeadLetterPolicy{Sink: sink},
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- cons.Run(runCtx) }()
	for range n + 1 {
		select {
		case <-handled:
		case <-ctx.Done():
			t.Fatalf("handled fewer than %d messages; source stats %+v", n+1, src.Stats())
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if st := src.Stats(); st.RetryWrites != 1 {
		t.Errorf("retry writes %d, want 1: %+v", st.RetryWrites, st)
	}

	letters, err := kafkaadapter.NewLetterSource(ctx, kafkaadapter.LetterSourceConfig{Cluster: k, Topic: dlqTopic})
	if err != nil {
		t.Fatal(err)
	}
	got, err := letters.Fetch(ctx, 10)
	if err != nil || len(got) != 1 || got[0].Letter == nil || string(got[0].Letter.Value) != "3" {
		t.Fatalf("letters: %v, %v", got, err)
	}
	id := got[0].Pos[len(dlqTopic)+1:] // "p@off"
	l, err := kafkaadapter.GetLetter(ctx, k, dlqTopic, replaceAt(id))
	if err != nil || string(l.Value) != "3" || l.Class != dlq.ClassPermanent {
		t.Fatalf("GetLetter %s: %+v, %v", id, l, err)
	}
	target, err := kafkaadapter.NewReplayTarget(k, kafkaadapter.ReplayTargetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	if err := target.Publish(ctx, &dlq.Outgoing{Topic: topic, Key: l.Key, Value: l.Value, Letter: l}); err != nil {
		t.Fatal(err)
	}
	if err := got[0].Remove(ctx); err != nil {
		t.Fatal(err)
	}
	if err := letters.Close(ctx); err != nil {
		t.Fatal(err)
	}
}

func replaceAt(id string) string {
	for i := range id {
		if id[i] == '@' {
			return id[:i] + "/" + id[i+1:]
		}
	}
	return id
}
