package franzadapter_test

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"go.uber.org/goleak"
)

// brokers are the package's broker: kfake in process, or $KAFKA_BROKERS
// (.ci/kafka-suite points it at a real Kafka).
var brokers []string

type withCluster struct{ m *testing.M }

func (w withCluster) Run() int {
	kind := "kafka"
	if env := strings.TrimSpace(os.Getenv("KAFKA_BROKERS")); env != "" {
		brokers = strings.Split(env, ",")
	} else {
		fake, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(0), kfake.AllowAutoTopicCreation()) // as a real Kafka by default
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer fake.Close()
		brokers, kind = fake.ListenAddrs(), "kfake"
	}
	fmt.Fprintf(os.Stderr, "franz adapter suite on %s %v\n", kind, brokers)
	if err := warmUp(); err != nil {
		fmt.Fprintln(os.Stderr, "warm-up:", err)
		return 1
	}
	return w.m.Run()
}

// warmUp joins a group once: the first join on a fresh broker (creating
// the offsets topic, loading the coordinator) is slow, and no test should
// pay it (SmallBatchNotHeld once waited over 3 s for it on a fresh Kafka).
func warmUp() error {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	topic := uniqueName("warmup")
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.AllowAutoTopicCreation(), kgo.DefaultProduceTopic(topic),
		kgo.ConsumerGroup(uniqueName("warmup")), kgo.ConsumeTopics(topic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return err
	}
	defer cl.Close()
	if err := cl.ProduceSync(ctx, kgo.StringRecord("x")).FirstErr(); err != nil {
		return err
	}
	for {
		fs := cl.PollFetches(ctx)
		if err := ctx.Err(); err != nil {
			return err
		}
		if fs.NumRecords() > 0 {
			return nil
		}
	}
}

func TestMain(m *testing.M) { goleak.VerifyTestMain(withCluster{m}) }

// uniqueName returns prefix plus a random suffix: topic and group names
// that do not clash between tests or runs against a shared broker.
func uniqueName(prefix string) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return prefix + "-" + hex.EncodeToString(b)
}

// client returns a kgo client on the test brokers with opts, closed when
// the test ends.
func client(t testing.TB, opts ...kgo.Opt) *kgo.Client {
	t.Helper()
	cl, err := kgo.NewClient(append([]kgo.Opt{kgo.SeedBrokers(brokers...)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	return cl
}

// newTopic creates a uniquely named topic with partitions and returns its
// name once every partition has a leader.
func newTopic(t testing.TB, prefix string, partitions int) string {
	t.Helper()
	name := uniqueName(prefix)
	cl := client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = name, int32(partitions), 1
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 30_000
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	if err := kerr.ErrorForCode(resp.Topics[0].ErrorCode); err != nil && err != kerr.TopicAlreadyExists {
		t.Fatal(err)
	}
	for {
		md := kmsg.NewPtrMetadataRequest()
		mt := kmsg.NewMetadataRequestTopic()
		mt.Topic = &name
		md.Topics = append(md.Topics, mt)
		mresp, err := md.RequestWith(ctx, cl)
		if err == nil && len(mresp.Topics) == 1 && mresp.Topics[0].ErrorCode == 0 && len(mresp.Topics[0].Partitions) == partitions {
			ok := true
			for _, p := range mresp.Topics[0].Partitions {
				ok = ok && p.Leader >= 0
			}
			if ok {
				return name
			}
		}
		select {
		case <-ctx.Done():
			t.Fatalf("topic %s has no leaders: %v", name, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// produce writes recs (Topic set or topic) with murmur2 key partitioning
// (kgo's StickyKeyPartitioner, as Java producers do, unless a record names
// its partition through ManualPartitioner) and waits for every ack.
func produce(t testing.TB, topic string, recs []*kgo.Record, manual bool) {
	t.Helper()
	part := kgo.StickyKeyPartitioner(nil)
	if manual {
		part = kgo.ManualPartitioner()
	}
	cl := client(t, kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(part), kgo.ProducerLinger(5*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := cl.ProduceSync(ctx, recs...).FirstErr(); err != nil {
		t.Fatal(err)
	}
}
