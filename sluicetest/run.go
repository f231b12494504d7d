package sluicetest

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sluice-go/sluice/consumer"
)

// Final counts a route's final outcomes: the messages that will not come
// back (succeeded, dead-lettered, expired, terminated, shed by ack). Retried,
// returned and abandoned messages come back from the broker.
func Final(s consumer.RouteStats) uint64 {
	return s.Settled[consumer.OutcomeSucceeded] + s.Settled[consumer.OutcomeDeadLettered] +
		s.Settled[consumer.OutcomeExpired] + s.Settled[consumer.OutcomeTerminated]
}

// RunUntil runs c until done reports true for its stats (checked every
// 10 ms), limit passes, or ctx ends; then it stops c and returns the last
// stats and Run's error. It returns an error wrapping
// context.DeadlineExceeded when limit passed first.
func RunUntil(ctx context.Context, c *consumer.Consumer, limit time.Duration, done func([]consumer.RouteStats) bool) ([]consumer.RouteStats, error) {
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var timedOut error
loop:
	for {
		select {
		case <-deadline.C:
			timedOut = fmt.Errorf("sluicetest: condition not met within %v: %w", limit, context.DeadlineExceeded)
			break loop
		case <-ctx.Done():
			break loop
		case <-tick.C:
			if done(c.Stats()) {
				break loop
			}
		}
	}
	stop()
	err := <-errc
	return c.Stats(), errors.Join(timedOut, err)
}

// WriteTable writes one line per route: what it fetched, the main outcomes,
// goodput, and the peak of its window against its size.
func WriteTable(w io.Writer, stats []consumer.RouteStats) {
	fmt.Fprintf(w, "%-8s %8s %9s %8s %8s %9s %8s %12s\n", "route", "fetched", "succeeded", "expired", "retried", "dead-lett", "goodput", "peak/window")
	for _, s := range stats {
		fmt.Fprintf(w, "%-8s %8d %9d %8d %8d %9d %8d %7d/%-4d\n", s.Name, s.Fetched,
			s.Settled[consumer.OutcomeSucceeded], s.Settled[consumer.OutcomeExpired], s.Settled[consumer.OutcomeRetried],
			s.Settled[consumer.OutcomeDeadLettered], s.Goodput(), s.Window.Peak, s.WindowMessages)
	}
}
