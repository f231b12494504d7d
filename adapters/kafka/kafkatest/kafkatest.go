package kafkatest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
)

// EnvBrokers is the environment variable naming real brokers.
const EnvBrokers = "KAFKA_BROKERS"

// Cluster is a running Kafka cluster for tests.
type Cluster struct {
	// Brokers are the bootstrap addresses.
	Brokers []string
	// Fake is the in-process cluster, nil on real brokers. Tests use it to
	// inject faults with ControlKey.
	Fake *kfake.Cluster

	transport *kafka.Transport
	owned     bool
	once      sync.Once
	kafka     *kafkaadapter.Cluster
}

// Kafka returns the adapter's connection settings for the cluster: one
// *kafkaadapter.Cluster per test cluster, so everything a test builds on it
// shares one transport.
func (c *Cluster) Kafka() *kafkaadapter.Cluster {
	if c.kafka == nil {
		c.kafka = &kafkaadapter.Cluster{Brokers: c.Brokers}
	}
	return c.kafka
}

// Real reports whether the cluster is a real broker from $KAFKA_BROKERS.
func (c *Cluster) Real() bool { return c.Fake == nil }

// Kind is "kfake" or "kafka".
func (c *Cluster) Kind() string {
	if c.Real() {
		return "kafka"
	}
	return "kfake"
}

// New returns the brokers from $KAFKA_BROKERS, or starts a kfake cluster
// with one broker. The caller calls Close.
func New() (*Cluster, error) {
	c := &Cluster{}
	if env := strings.TrimSpace(os.Getenv(EnvBrokers)); env != "" {
		for _, b := range strings.Split(env, ",") {
			if b = strings.TrimSpace(b); b != "" {
				c.Brokers = append(c.Brokers, b)
			}
		}
		c.Kafka()
		return c, nil
	}
	fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(0))
	if err != nil {
		return nil, fmt.Errorf("kafkatest: start kfake: %w", err)
	}
	c.Fake, c.owned, c.Brokers = fake, true, fake.ListenAddrs()
	c.Kafka()
	return c, nil
}

// Start returns a cluster for tb (see New), closed in tb.Cleanup.
func Start(tb testing.TB) *Cluster {
	tb.Helper()
	c, err := New()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// Close stops a kfake cluster and closes idle connections.
func (c *Cluster) Close() {
	if c.transport != nil {
		c.transport.CloseIdleConnections()
	}
	if c.owned {
		c.Fake.Close()
	}
}

// Client returns a kafka-go client on the cluster's own transport (with
// the cluster's TLS and SASL settings, all topics' metadata).
func (c *Cluster) Client() *kafka.Client {
	c.once.Do(func() {
		k := c.Kafka()
		c.transport = &kafka.Transport{TLS: k.TLS, SASL: k.SASL}
	})
	return &kafka.Client{Addr: kafka.TCP(c.Brokers...), Transport: c.transport, Timeout: 10 * time.Second}
}

// Addr is the cluster's bootstrap address for kafka-go.
func (c *Cluster) Addr() net.Addr { return kafka.TCP(c.Brokers...) }

// UniqueName returns prefix plus a random suffix: topic and group names that
// do not clash between tests or runs against a shared broker.
func UniqueName(prefix string) string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return prefix + "-" + hex.EncodeToString(b[:])
}

// CreateTopic creates topic with the given partitions and waits until every
// partition has a leader.
func (c *Cluster) CreateTopic(ctx context.Context, topic string, partitions int) error {
	res, err := c.Client().CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{
		Topic: topic, NumPartitions: partitions, ReplicationFactor: 1,
	}}})
	if err != nil {
		return fmt.Errorf("kafkatest: create %s: %w", topic, err)
	}
	if err := res.Errors[topic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
		return fmt.Errorf("kafkatest: create %s: %w", topic, err)
	}
	for {
		md, err := c.Client().Metadata(ctx, &kafka.MetadataRequest{Topics: []string{topic}})
		if err == nil && len(md.Topics) == 1 && md.Topics[0].Error == nil && len(md.Topics[0].Partitions) == partitions {
			ok := true
			for _, p := range md.Topics[0].Partitions {
				ok = ok && p.Error == nil && p.Leader.Host != ""
			}
			if ok {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("kafkatest: topic %s not ready: %w", topic, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Topic creates a uniquely named topic with partitions for tb and returns
// its name.
func (c *Cluster) Topic(tb testing.TB, prefix string, partitions int) string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	name := UniqueName(prefix)
	if err := c.CreateTopic(ctx, name, partitions); err != nil {
		tb.Fatal(err)
	}
	return name
}

// Writer returns a synchronous writer (RequiredAcks all) on its own
// transport; Close it with CloseWriter.
func (c *Cluster) Writer(topic string) *kafka.Writer {
	return &kafka.Writer{
		Addr:         kafka.TCP(c.Brokers...),
		Topic:        topic,
		Balancer:     &kafka.RoundRobin{},
		RequiredAcks: kafka.RequireAll,
		BatchSize:    1000,
		BatchBytes:   4 << 20,
		BatchTimeout: time.Millisecond,
		Transport:    &kafka.Transport{TLS: c.Kafka().TLS, SASL: c.Kafka().SASL},
	}
}

// CloseWriter closes w and its transport's idle connections.
func CloseWriter(w *kafka.Writer) {
	_ = w.Close()
	if t, ok := w.Transport.(*kafka.Transport); ok {
		t.CloseIdleConnections()
	}
}

// Produce writes msgs to topic (messages without a Topic) in batches and
// waits for every acknowledgement.
func (c *Cluster) Produce(ctx context.Context, topic string, msgs []kafka.Message) error {
	w := c.Writer(topic)
	defer CloseWriter(w)
	for len(msgs) > 0 {
		n := min(len(msgs), 1000)
		if err := w.WriteMessages(ctx, msgs[:n]...); err != nil {
			return fmt.Errorf("kafkatest: produce to %s: %w", topic, err)
		}
		msgs = msgs[n:]
	}
	return nil
}

// Committed returns the group's committed offsets for topic's partitions
// (-1 when none). It retries while the coordinator is still loading (a
// fresh broker) until ctx is done.
func (c *Cluster) Committed(ctx context.Context, group, topic string, partitions int) (map[int]int64, error) {
	for {
		out, err := c.committed(ctx, group, topic, partitions)
		var kerr kafka.Error
		if err == nil || !errors.As(err, &kerr) || !kerr.Temporary() {
			return out, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (c *Cluster) committed(ctx context.Context, group, topic string, partitions int) (map[int]int64, error) {
	ps := make([]int, partitions)
	for i := range ps {
		ps[i] = i
	}
	res, err := c.Client().OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: ps}})
	if err != nil {
		return nil, err
	}
	out := map[int]int64{}
	if errors.Is(res.Error, kafka.GroupIdNotFound) { // kfake: no group yet
		for _, p := range ps {
			out[p] = -1
		}
		return out, nil
	}
	if res.Error != nil {
		return nil, res.Error
	}
	for _, p := range res.Topics[topic] {
		if p.Error != nil {
			return nil, p.Error
		}
		out[p.Partition] = p.CommittedOffset
	}
	return out, nil
}
