package sluicetest

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice/consumer"
)

// BenchCorePath runs b.N in-memory messages (128-byte values and headers h,
// preallocated) through one route (window 256, 2 workers, a no-op handler)
// shaped by shape, on a Consumer made with opts, and reports allocations. It measures
// the consumer's own path (window, queue, workers, settlement, and whatever
// opts and shape add), not a fixture: the Source hands out slices of the
// preallocated messages and the Acker only counts. consumer's
// BenchmarkCorePath is BenchCorePath with nothing added; packages that plug
// into the core (otelsluice) compare against it.
func BenchCorePath(b *testing.B, opts consumer.Options, h consumer.Headers, shape func(*consumer.Route)) {
	var settled atomic.Int64
	msgs := make([]*consumer.Message, b.N)
	val := make([]byte, 128)
	ack := countAcker{&settled}
	for i := range msgs {
		msgs[i] = consumer.NewMessage(ack)
		msgs[i].Value = val
		msgs[i].Headers = h
	}
	src := &benchSource{msgs: msgs, done: make(chan struct{})}
	r := consumer.Route{
		Name:    "bench",
		Source:  src,
		Workers: 2,
		Handler: func(context.Context, *consumer.Message) error { return nil },
		Window:  consumer.WindowPolicy{Messages: 256, Bytes: 64 << 20},
	}
	if shape != nil {
		shape(&r)
	}
	c, err := consumer.New(opts, r)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.ReportAllocs()
	b.ResetTimer()
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	for settled.Load() < int64(b.N) {
		time.Sleep(50 * time.Microsecond)
	}
	b.StopTimer()
	cancel()
	<-errc
}

// benchSource hands out preallocated messages in order.
type benchSource struct {
	msgs []*consumer.Message
	next atomic.Int64
	done chan struct{}
}

type countAcker struct{ n *atomic.Int64 }

func (a countAcker) Settle(context.Context, consumer.Settlement) error { a.n.Add(1); return nil }
func (a countAcker) InProgress(context.Context) error                  { return nil }

func (s *benchSource) Attach(consumer.RouteLimits) (consumer.SourceInfo, error) {
	return consumer.SourceInfo{}, nil
}

func (s *benchSource) Fetch(ctx context.Context, n int, _ int64) ([]*consumer.Message, error) {
	i := s.next.Load()
	if int(i) >= len(s.msgs) {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.done:
			return nil, consumer.ErrClosed
		}
	}
	j := min(int(i)+n, len(s.msgs))
	s.next.Store(int64(j))
	return s.msgs[i:j], nil
}
