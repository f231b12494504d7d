package consumer_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
)

// benchSource hands out b.N preallocated messages so the benchmark measures
// the consumer's path (window, queue, workers, settlement), not a fixture.
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

func BenchmarkCorePath(b *testing.B) {
	benchCorePath(b, func(r *consumer.Route) {})
}

// BenchmarkCorePathDeadline is BenchmarkCorePath with every message
// carrying a deadline (an hour away): the path of predictive expiry, which
// times each handler run and plans each fetched batch.
func BenchmarkCorePathDeadline(b *testing.B) {
	dl := consumer.Headers{expiry.DefaultHeader: {expiry.FormatDeadline(time.Now().Add(time.Hour))}}
	benchCorePathWith(b, dl, func(r *consumer.Route) {})
}

// BenchmarkCorePathOverload is BenchmarkCorePath with the overload options
// that act per message switched on (shared Slots, a RetryBudget, an
// AdaptiveLimit, a pull Throttle and LIFO queue shedding), to compare
// side by side with the plain route.
func BenchmarkCorePathOverload(b *testing.B) {
	slots, _ := backpressure.NewSlots(64)
	budget, _ := backpressure.NewRetryBudget(backpressure.RetryBudgetOptions{})
	limit, _ := backpressure.NewAdaptiveLimit(backpressure.AdaptiveLimitOptions{Min: 16, Max: 256, Target: time.Second})
	throttle, _ := backpressure.NewThrottle(backpressure.ThrottleOptions{})
	benchCorePath(b, func(r *consumer.Route) {
		r.Overload = consumer.OverloadPolicy{
			Criticality: backpressure.Critical, Slots: slots, RetryBudget: budget, AdaptiveLimit: limit, Throttle: throttle,
			Queue: consumer.QueuePolicy{Order: consumer.QueueLIFO, MaxLength: 250, DropWhenFull: consumer.DropOldest},
		}
	})
}

// benchCorePath runs b.N in-memory messages through one route (window 256,
// 2 workers, no-op handler) shaped by opt.
func benchCorePath(b *testing.B, opt func(*consumer.Route)) { benchCorePathWith(b, nil, opt) }

// benchCorePathWith is benchCorePath with these headers on every message.
func benchCorePathWith(b *testing.B, h consumer.Headers, opt func(*consumer.Route)) {
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
	opt(&r)
	c, err := consumer.New(consumer.Options{}, r)
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
