package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sluice-go/sluice/consumer"
)

// Result is what Run observed.
type Result struct {
	Start time.Time
	// Done[i] is when route i had settled Want[i] messages; zero if it
	// did not within the limit.
	Done []time.Time
}

// Settled counts a route's final outcomes (not retries: those come back).
func Settled(s consumer.RouteStats) uint64 {
	return s.Settled[consumer.OutcomeSucceeded] + s.Settled[consumer.OutcomeDeadLettered] +
		s.Settled[consumer.OutcomeExpired] + s.Settled[consumer.OutcomeTerminated]
}

// Run runs c until route 0 has settled want[0] messages (recording when
// every route reached its own want), limit passes, or ctx ends; then it
// stops c and returns Run's error, with consumer.ErrStuckHandlers treated as
// a clean stop (a demo's slow route may still be mid-handler).
func Run(ctx context.Context, c *consumer.Consumer, limit time.Duration, want ...uint64) (Result, error) {
	runCtx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	res := Result{Start: time.Now(), Done: make([]time.Time, len(want))}
	go func() { errc <- c.Run(runCtx) }()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
loop:
	for {
		select {
		case <-deadline.C:
			break loop
		case <-ctx.Done():
			break loop
		case <-tick.C:
			st := c.Stats()
			for i, w := range want {
				if res.Done[i].IsZero() && Settled(st[i]) >= w {
					res.Done[i] = time.Now()
				}
			}
			if !res.Done[0].IsZero() {
				break loop
			}
		}
	}
	stop()
	err := <-errc
	if errors.Is(err, consumer.ErrStuckHandlers) {
		err = nil
	}
	return res, err
}

// PrintTable writes one line per route.
func PrintTable(w io.Writer, stats []consumer.RouteStats) {
	fmt.Fprintf(w, "\n%-8s %8s %9s %8s %8s %9s %8s %12s\n", "route", "fetched", "succeeded", "expired", "retried", "dead-lett", "goodput", "peak/window")
	for _, s := range stats {
		fmt.Fprintf(w, "%-8s %8d %9d %8d %8d %9d %8d %7d/%-4d\n", s.Name, s.Fetched,
			s.Settled[consumer.OutcomeSucceeded], s.Settled[consumer.OutcomeExpired], s.Settled[consumer.OutcomeRetried],
			s.Settled[consumer.OutcomeDeadLettered], s.Goodput(), s.PeakInFlight, s.MaxInFlight)
	}
}

// Verdict writes whether route 0 (name0) finished before route 1 (name1).
func Verdict(w io.Writer, res Result, name0, name1 string, limit time.Duration) {
	d0 := res.Done[0]
	var d1 time.Time
	if len(res.Done) > 1 {
		d1 = res.Done[1]
	}
	switch {
	case d0.IsZero():
		fmt.Fprintf(w, "\n%s did NOT finish within %v\n", name0, limit)
	case d1.IsZero() || d0.Before(d1):
		fmt.Fprintf(w, "\n%s finished in %v, before %s: not starved\n", name0, d0.Sub(res.Start).Round(time.Millisecond), name1)
	default:
		fmt.Fprintf(w, "\n%s finished in %v, after %s\n", name0, d0.Sub(res.Start).Round(time.Millisecond), name1)
	}
}

// Sleep is a handler's stand-in for I/O: it waits d or until ctx ends.
func Sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
