package consumer_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/sluicetest"
)

// BenchmarkCorePathOrdered is BenchmarkCorePath on a route ordered ByKey,
// its messages on 1,024 keys (they get their key as they are fetched): what
// keeping each key's order costs per message.
func BenchmarkCorePathOrdered(b *testing.B) {
	keys := make([][]byte, 1024)
	for i := range keys {
		keys[i] = []byte("key" + strconv.Itoa(i))
	}
	sluicetest.BenchCorePath(b, consumer.Options{}, nil, func(r *consumer.Route) {
		r.Ordering = consumer.ByKey
		r.Source = &keyedSource{Source: r.Source, keys: keys}
	})
}

// keyedSource gives each message its Source returns the next of keys.
type keyedSource struct {
	consumer.Source
	keys [][]byte
	n    int
}

func (s *keyedSource) Fetch(ctx context.Context, n int, b int64) ([]*consumer.Message, error) {
	msgs, err := s.Source.Fetch(ctx, n, b)
	for _, m := range msgs {
		m.Key = s.keys[s.n%len(s.keys)]
		s.n++
	}
	return msgs, err
}
