package kafkaadapter_test

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
)

// TestTransactionMarkers: a transactional producer (franz-go) leaves a
// commit marker after each transaction, so the partition's log ends with
// a marker. Every record is handled once and the group commits to the
// log's end. Before, a fetch whose only batch was a marker returned no
// records, and the partition fetched that marker again at once, forever,
// never committing past it.
func TestTransactionMarkers(t *testing.T) {
	const txns, per = 3, 5
	topic := cluster.Topic(t, "txn", 1)
	group := kafkatest.UniqueName("txn")
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.Brokers...), kgo.TransactionalID(kafkatest.UniqueName("tx")),
		kgo.DefaultProduceTopic(topic), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for tx := range txns {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for i := range per {
			r := &kgo.Record{Value: []byte(strconv.Itoa(tx*per+i) + ":"), Partition: 0}
			if err := cl.ProduceSync(ctx, r).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(ctx, kgo.TryCommit); err != nil {
			t.Fatal(err)
		}
	}
	cl.Close()
	end := endOffsets(t, topic)
	if end[0] <= txns*per {
		t.Fatalf("log end %d: no transaction markers after the %d records", end[0], txns*per)
	}
	var handled atomic.Int64
	m := startMember(t, testConfig(group, topic), consumer.Route{Handler: func(context.Context, *consumer.Message) error {
		handled.Add(1)
		return nil
	}})
	// The last marker may land after EndTransaction returned (Kafka 4's
	// transactions write markers asynchronously): read the end again.
	waitFor(t, 20*time.Second, "committed to the log's end", func() bool { return committedAll(group, topic, endOffsets(t, topic)) })
	m.stop(t)
	if handled.Load() != txns*per {
		t.Fatalf("handled %d, want %d", handled.Load(), txns*per)
	}
}
