package consumer_test

import (
	"context"
	"testing"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

// BenchmarkCorePath runs in-memory messages through one plain route: the
// consumer's own path (window, queue, workers, settlement).
func BenchmarkCorePath(b *testing.B) {
	sluicetest.BenchCorePath(b, consumer.Options{}, nil, nil)
}

// BenchmarkCorePathDeadline is BenchmarkCorePath with every message
// carrying a deadline (an hour away): the path of predictive expiry, which
// times each handler run and plans each fetched batch.
func BenchmarkCorePathDeadline(b *testing.B) {
	dl := consumer.Headers{expiry.DefaultHeader: {expiry.FormatDeadline(time.Now().Add(time.Hour))}}
	sluicetest.BenchCorePath(b, consumer.Options{}, dl, nil)
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
	sluicetest.BenchCorePath(b, consumer.Options{}, nil, func(r *consumer.Route) {
		r.Overload = consumer.OverloadPolicy{
			Criticality: backpressure.Critical, Slots: slots, RetryBudget: budget, AdaptiveLimit: limit, Throttle: throttle,
			Queue: consumer.QueuePolicy{Order: consumer.QueueLIFO, MaxLength: 250, DropWhenFull: consumer.DropOldest},
		}
	})
}

// nopHook is the cheapest Hook: it keeps the route's context and ignores
// every event, so BenchmarkCorePathHook shows what the hook's call sites
// cost the core (the calls and the handler-latency clock reads).
type nopHook struct{}

func (nopHook) HookRoute(consumer.RouteInfo) consumer.MessageHook { return nopHook{} }
func (nopHook) Held(ctx context.Context, _ *consumer.Message, _ consumer.Waits) context.Context {
	return ctx
}
func (nopHook) Event(context.Context, *consumer.Message, consumer.Event) {}

// BenchmarkCorePathHook is BenchmarkCorePath with a Hook that does nothing.
func BenchmarkCorePathHook(b *testing.B) {
	sluicetest.BenchCorePath(b, consumer.Options{Hook: nopHook{}}, nil, nil)
}
