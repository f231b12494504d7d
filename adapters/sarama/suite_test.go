package saramaadapter_test

import (
	"testing"
	"time"

	"github.com/IBM/sarama"

	saramaadapter "github.com/sluice-go/sluice/adapters/sarama"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/adaptertest"
)

// TestAdapterSuite runs the cases every adapter passes, on kfake or on the
// broker in $KAFKA_BROKERS, with the Handler in a sarama group loop.
func TestAdapterSuite(t *testing.T) {
	adaptertest.Run(t, saramaBroker{}, adaptertest.Features{RedeliveryDelay: time.Second})
}

type saramaBroker struct{}

func (saramaBroker) NewTopic(t *testing.T, name string) adaptertest.Topic {
	topic := uniqueName(name)
	createTopic(t, topic, 4)
	return &saramaTopic{topic: topic}
}

type saramaTopic struct{ topic string }

func (tp *saramaTopic) Publish(t *testing.T, msgs []adaptertest.Msg) {
	t.Helper()
	out := make([]*sarama.ProducerMessage, len(msgs))
	for i, m := range msgs {
		hs := []sarama.RecordHeader{{Key: []byte("Id"), Value: []byte(m.ID)}}
		for k, v := range m.Headers {
			hs = append(hs, sarama.RecordHeader{Key: []byte(k), Value: []byte(v)})
		}
		key := m.Key
		if key == "" {
			key = m.ID
		}
		out[i] = &sarama.ProducerMessage{Topic: tp.topic, Key: sarama.StringEncoder(key), Value: sarama.ByteEncoder(m.Value), Headers: hs}
	}
	produce(t, out)
}

func (tp *saramaTopic) Source(t *testing.T, group string) consumer.Source {
	t.Helper()
	return newMember(t, tp.topic+"-"+group, []string{tp.topic}, saramaadapter.Config{}, nil)
}
