package saramaadapter_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kfake"
	"go.uber.org/goleak"

	saramaadapter "github.com/sluice-go/sluice/adapters/sarama"
)

// brokers is the package's broker: kfake in process, or $KAFKA_BROKERS.
var brokers []string

func TestMain(m *testing.M) {
	code := func() int {
		if env := strings.TrimSpace(os.Getenv("KAFKA_BROKERS")); env != "" {
			brokers = strings.Split(env, ",")
		} else {
			fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(0))
			if err != nil {
				fmt.Fprintln(os.Stderr, err)
				return 1
			}
			defer fake.Close()
			brokers = fake.ListenAddrs()
		}
		fmt.Fprintf(os.Stderr, "sarama adapter suite on %v\n", brokers)
		return m.Run()
	}()
	if code == 0 {
		// go-metrics' meter ticker is a process-wide goroutine sarama's
		// metrics start once; everything else must be gone.
		if err := goleak.Find(goleak.IgnoreTopFunction("github.com/rcrowley/go-metrics.(*meterArbiter).tick")); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

// uniqueName returns prefix plus a random suffix.
func uniqueName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// saramaConfig is what the tests run sarama with: the group starts at the
// oldest offset and rebalances quickly.
func saramaConfig() *sarama.Config {
	c := sarama.NewConfig()
	c.Version = sarama.V3_0_0_0
	c.ClientID = "sluice-sarama-test"
	c.Consumer.Offsets.Initial = sarama.OffsetOldest
	c.Consumer.Group.Session.Timeout = 6 * time.Second
	c.Consumer.Group.Heartbeat.Interval = time.Second
	c.Consumer.Group.Rebalance.Timeout = 10 * time.Second
	c.Consumer.Group.Rebalance.Retry.Backoff = 200 * time.Millisecond
	c.Consumer.Offsets.AutoCommit.Interval = 200 * time.Millisecond
	c.Producer.Return.Successes = true
	c.Producer.Partitioner = saramaadapter.NewMurmur2Partitioner
	c.Producer.RequiredAcks = sarama.WaitForAll
	c.Metadata.Retry.Backoff = 100 * time.Millisecond
	return c
}

func createTopic(t testing.TB, topic string, partitions int32) {
	t.Helper()
	admin, err := sarama.NewClusterAdmin(brokers, saramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: partitions, ReplicationFactor: 1}, false); err != nil {
		t.Fatal(err)
	}
}

func produce(t testing.TB, msgs []*sarama.ProducerMessage) {
	t.Helper()
	p, err := sarama.NewSyncProducer(brokers, saramaConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for len(msgs) > 0 {
		k := min(len(msgs), 1000)
		if err := p.SendMessages(msgs[:k]); err != nil {
			t.Fatal(err)
		}
		msgs = msgs[k:]
	}
}

// member is a sarama consumer group running an existing-shape group loop
// with a Handler: the Source the suite's routes read.
type member struct {
	*saramaadapter.Handler
	client sarama.Client
	group  sarama.ConsumerGroup
	cancel context.CancelFunc
	done   chan struct{}
	closed bool
}

func newMember(t testing.TB, group string, topics []string, cfg saramaadapter.Config, sc *sarama.Config) *member {
	t.Helper()
	if sc == nil {
		sc = saramaConfig()
	}
	client, err := sarama.NewClient(brokers, sc)
	if err != nil {
		t.Fatal(err)
	}
	g, err := sarama.NewConsumerGroupFromClient(group, client)
	if err != nil {
		client.Close()
		t.Fatal(err)
	}
	cfg.GroupID, cfg.Client = group, client
	h, err := saramaadapter.NewHandler(cfg)
	if err != nil {
		t.Fatal(err)
	}
	m := &member{Handler: h, client: client, group: g, done: make(chan struct{})}
	var ctx context.Context
	ctx, m.cancel = context.WithCancel(context.Background())
	go func() {
		defer close(m.done)
		// The application's loop, unchanged but for the handler.
		for ctx.Err() == nil {
			if err := g.Consume(ctx, topics, h); err != nil && ctx.Err() == nil {
				time.Sleep(100 * time.Millisecond)
			}
		}
	}()
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// Close stops the group loop (the claims mark their final offsets and
// sarama commits them), closes the group and the client.
func (m *member) Close() error {
	if m.closed {
		return nil
	}
	m.closed = true
	m.cancel()
	<-m.done
	err := m.group.Close()
	_ = m.Handler.Close()
	_ = m.client.Close()
	return err
}

// waitClaims waits until the member runs n claims.
func (m *member) waitClaims(t testing.TB, n int) {
	t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for m.Stats().Claims != n {
		if time.Now().After(deadline) {
			t.Fatalf("member runs %d claims, want %d", m.Stats().Claims, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
