package saramaadapter

import (
	"github.com/IBM/sarama"

	"github.com/sluice-go/sluice/internal/kafkacore"
)

// NewMurmur2Partitioner is a sarama.PartitionerConstructor that places a
// keyed message where Kafka's Java producer (and kafka-go's
// Murmur2Balancer, franz-go's default) place it: murmur2 of the key, made
// positive, modulo the partition count. sarama's default hash partitioner
// (FNV-1a) places keys elsewhere, so a key written by a sarama producer and
// by a Java or kafka-go producer would land on two partitions and lose its
// order. Messages without a key go to a random partition.
func NewMurmur2Partitioner(topic string) sarama.Partitioner {
	return murmur2Partitioner{random: sarama.NewRandomPartitioner(topic)}
}

type murmur2Partitioner struct{ random sarama.Partitioner }

func (p murmur2Partitioner) Partition(m *sarama.ProducerMessage, n int32) (int32, error) {
	if m.Key == nil {
		return p.random.Partition(m, n)
	}
	key, err := m.Key.Encode()
	if err != nil {
		return -1, err
	}
	return int32(kafkacore.KeyPartition(key, int(n))), nil
}

func (murmur2Partitioner) RequiresConsistency() bool { return true }
