package saramaadapter_test

import (
	"strconv"
	"testing"

	"github.com/IBM/sarama"
	"github.com/twmb/franz-go/pkg/kgo"

	saramaadapter "github.com/sluice-go/sluice/adapters/sarama"
)

// TestMurmur2PartitionerMatchesKgo: keyed messages land where franz-go's
// default partitioner (the Java client's murmur2) puts them.
func TestMurmur2PartitionerMatchesKgo(t *testing.T) {
	ours := saramaadapter.NewMurmur2Partitioner("t")
	theirs := kgo.StickyKeyPartitioner(nil).ForTopic("t")
	for _, n := range []int{1, 3, 4, 12, 100} {
		for i := range 500 {
			key := "key-" + strconv.Itoa(i)
			got, err := ours.Partition(&sarama.ProducerMessage{Key: sarama.StringEncoder(key)}, int32(n))
			if err != nil {
				t.Fatal(err)
			}
			if want := theirs.Partition(&kgo.Record{Key: []byte(key)}, n); int(got) != want {
				t.Fatalf("key %q over %d partitions: %d, kgo %d", key, n, got, want)
			}
		}
	}
	if !ours.RequiresConsistency() {
		t.Error("a key partitioner must require consistency (sarama then waits for a partition rather than pick another)")
	}
}
