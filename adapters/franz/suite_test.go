package franzadapter_test

import (
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	franzadapter "github.com/sluice-go/sluice/adapters/franz"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/adaptertest"
)

// TestAdapterSuite runs the cases every adapter passes, on kfake or on
// the broker in $KAFKA_BROKERS.
func TestAdapterSuite(t *testing.T) {
	adaptertest.Run(t, franzBroker{}, adaptertest.Features{RedeliveryDelay: time.Second})
}

type franzBroker struct{}

func (franzBroker) NewTopic(t *testing.T, name string) adaptertest.Topic {
	return &franzTopic{topic: newTopic(t, name, 4)}
}

type franzTopic struct{ topic string }

func (tp *franzTopic) Publish(t *testing.T, msgs []adaptertest.Msg) {
	t.Helper()
	recs := make([]*kgo.Record, len(msgs))
	for i, m := range msgs {
		hs := []kgo.RecordHeader{{Key: "Id", Value: []byte(m.ID)}}
		for k, v := range m.Headers {
			hs = append(hs, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
		key := m.Key
		if key == "" {
			key = m.ID
		}
		recs[i] = &kgo.Record{Key: []byte(key), Value: m.Value, Headers: hs}
	}
	produce(t, tp.topic, recs, false)
}

func (tp *franzTopic) Source(t *testing.T, group string) consumer.Source {
	t.Helper()
	src, err := franzadapter.NewSource(franzadapter.Config{},
		kgo.SeedBrokers(brokers...), kgo.ConsumerGroup(tp.topic+"-"+group), kgo.ConsumeTopics(tp.topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.SessionTimeout(6*time.Second),
		kgo.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = src.Close() })
	return src
}
