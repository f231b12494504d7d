package consumer_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/sluicetest"
)

// runUntil runs c until cond holds on its first route, then stops it.
func runUntil(c *consumer.Consumer, cond func(consumer.RouteStats) bool) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	for !cond(c.Stats()[0]) {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
}

// A retry budget: when a downstream fails for everyone, retries add at most
// 10% to its load. Failures the budget cannot retry go to the DLQ with class
// "retry-budget", to be replayed at a safe pace later.
func Example_retryBudget() {
	src := sluicetest.NewSource()
	for i := range 100 {
		src.Publish(fmt.Sprint("m", i), []byte("x"), nil, time.Time{})
	}
	budget, _ := backpressure.NewRetryBudget(backpressure.RetryBudgetOptions{Ratio: 0.1})
	attempts := 0
	letters := map[string]int{}
	c, _ := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "payments",
		Source:  src,
		Workers: 1,
		Retry:   consumer.RetryPolicy{MaxAttempts: 2, BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
		Handler: func(context.Context, *consumer.Message) error {
			attempts++
			return errors.New("downstream unavailable")
		},
		Window:   consumer.WindowPolicy{Messages: 8, Bytes: 1 << 20},
		Overload: consumer.OverloadPolicy{RetryBudget: budget},
		DeadLetter: consumer.DeadLetterPolicy{Sink: dlq.SinkFunc(func(_ context.Context, l *dlq.Letter) error {
			letters[l.Class]++
			return nil
		})},
	})
	runUntil(c, func(s consumer.RouteStats) bool { return s.Settled[consumer.OutcomeDeadLettered] == 100 })
	fmt.Println("attempts:", attempts, "for 100 messages (no budget: 200)")
	fmt.Println("dead letters:", letters[consumer.ClassRetryBudget], consumer.ClassRetryBudget, "+", letters[dlq.ClassExhausted], dlq.ClassExhausted)
	// Output:
	// attempts: 110 for 100 messages (no budget: 200)
	// dead letters: 90 retry-budget + 10 exhausted
}

// Queue shedding: at most 2 fetched messages wait for the single worker;
// beyond that the oldest queued message of the lowest class present is
// shed, or the arrival itself when its class is below every queued one
// (here acked as a counted drop; the default ShedNak hands it back to the
// broker). The producer marked the odd messages SHEDDABLE; the route's
// class is CRITICAL. m1 and m3 are shed for being SHEDDABLE, m0 for being
// the oldest CRITICAL when m4 arrives to a queue of two CRITICAL, m5 as the
// lowest arrival.
func Example_queueShedding() {
	src := sluicetest.NewSource()
	release, running := make(chan struct{}), make(chan struct{})
	var ran []string
	c, _ := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "orders",
		Source:  src,
		Workers: 1,
		Handler: func(ctx context.Context, m *consumer.Message) error {
			if string(m.Key) == "first" {
				close(running)
				<-release // hold the worker while the others queue
				return nil
			}
			ran = append(ran, string(m.Key))
			return nil
		},
		Window:   consumer.WindowPolicy{Messages: 16, Bytes: 1 << 20, MinFetch: 1},
		Overload: consumer.OverloadPolicy{Criticality: backpressure.Critical, OnShed: consumer.ShedAck, Queue: consumer.QueuePolicy{Order: consumer.QueueFIFO, MaxLength: 2, DropWhenFull: consumer.DropLowestCriticality}},
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	src.Publish("first", nil, nil, time.Time{})
	<-running // out of the queue: the queue's 2 places are for the others
	for i := range 6 {
		var h consumer.Headers
		if i%2 == 1 {
			h = consumer.Headers{consumer.CriticalityHeader: {"SHEDDABLE"}}
		}
		src.Publish(fmt.Sprint("m", i), nil, h, time.Time{})
	}
	for c.Stats()[0].Fetched < 7 {
		time.Sleep(time.Millisecond)
	}
	close(release)
	for c.Stats()[0].Held > 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	s := c.Stats()[0]
	fmt.Println("ran:", ran)
	fmt.Println("shed SHEDDABLE:", s.Overload.Shed[consumer.ShedQueueFull][backpressure.Sheddable],
		"CRITICAL:", s.Overload.Shed[consumer.ShedQueueFull][backpressure.Critical])
	// Output:
	// ran: [m2 m4]
	// shed SHEDDABLE: 3 CRITICAL: 1
}

// The overload options of a route, together. Each is optional and its zero
// value keeps the plain behaviour.
func Example_overloadOptions() {
	slots, _ := backpressure.NewSlots(8)                                    // one downstream, shared by routes
	throttle, _ := backpressure.NewThrottle(backpressure.ThrottleOptions{}) // K=2, 2 min
	limit, _ := backpressure.NewAdaptiveLimit(backpressure.AdaptiveLimitOptions{
		Min: 4, Max: 64, Target: 50 * time.Millisecond,
		Cooldown: 3, // a sheddable route ramps back after the critical ones
	})
	budget, _ := backpressure.NewRetryBudget(backpressure.RetryBudgetOptions{})
	_, err := consumer.New(consumer.Options{}, consumer.Route{
		Name:    "reports",
		Source:  sluicetest.NewSource(),
		Workers: 16,
		// the broker keeps shed messages
		Handler: func(ctx context.Context, m *consumer.Message) error {
			out := consumer.Headers{}
			consumer.PropagateCriticality(ctx, out) // outgoing messages inherit the class
			return nil
		},
		Window:     consumer.WindowPolicy{Messages: 64, Bytes: 8 << 20},
		Overload:   consumer.OverloadPolicy{Criticality: backpressure.Sheddable, Slots: slots, Throttle: throttle, AdaptiveLimit: limit, RetryBudget: budget, ShedNearDeadline: 20 * time.Millisecond, OnShed: consumer.ShedNak, Queue: consumer.QueuePolicy{Order: consumer.QueueLIFO, MaxLength: 32, DropWhenFull: consumer.DropOldest}},
		DeadLetter: consumer.DeadLetterPolicy{OnOverloaded: consumer.OverloadedNak},
	})
	fmt.Println(err)
	// Output:
	// <nil>
}

// "Overloaded, do not retry" across layers: the handler calls a service
// layer that calls a client, each retrying through backpressure.Retrier,
// which passes an overloaded error up instead of retrying it. Three layers
// of 3 attempts make 27 calls to a dependency that is down; with Retrier 3
// per delivery. By default (OverloadedNak) the route hands the message back
// to the broker, which redelivers it up to Retry.MaxAttempts (3) times: 9
// calls. OverloadedDeadLetter dead-letters it at once: 3 calls.
func Example_doNotRetry() {
	dependency := func(calls *int) func(context.Context) error {
		return func(context.Context) error { *calls++; return errors.New("dependency down") }
	}
	rt := &backpressure.Retrier{BaseDelay: -1}
	for _, on := range []consumer.OverloadedAction{consumer.OverloadedNak, consumer.OverloadedDeadLetter} {
		calls := 0
		client := func(ctx context.Context) error { return rt.Do(ctx, dependency(&calls)) }
		service := func(ctx context.Context) error { return rt.Do(ctx, client) }
		src := sluicetest.NewSource()
		src.Publish("m", []byte("x"), nil, time.Time{})
		c, _ := consumer.New(consumer.Options{}, consumer.Route{
			Name:    "orders",
			Source:  src,
			Workers: 1,
			Handler: func(ctx context.Context, m *consumer.Message) error {
				return service(ctx) // backpressure.Overloaded(err) after 3 calls
			},
			Retry:      consumer.RetryPolicy{BaseDelay: time.Millisecond, MaxDelay: time.Millisecond},
			DeadLetter: consumer.DeadLetterPolicy{Sink: &sluicetest.Sink{}, OnOverloaded: on},
		})
		runUntil(c, func(s consumer.RouteStats) bool { return s.Settled[consumer.OutcomeDeadLettered] == 1 })
		fmt.Println("calls to the dependency:", calls)
	}
	// Output:
	// calls to the dependency: 9
	// calls to the dependency: 3
}
