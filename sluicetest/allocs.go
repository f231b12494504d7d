package sluicetest

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"

	"github.com/sluice-go/sluice/consumer"
)

// AllocsPerMessage measures the heap allocations the consumer's own path
// makes per message in steady state: a route shaped by shape (window 256,
// 2 workers and a no-op handler unless shape changes them) on a Consumer
// made with opts runs rounds of perRound preallocated messages (128-byte
// values, headers h) through testing.AllocsPerRun, and the result is its
// average per round divided by perRound. The messages, the Source and the
// Acker allocate nothing per message, so what is left is the consumer's:
// window, queue, workers, settlement and whatever opts and shape add.
// Allocations made once per Fetch or per timer tick show as fractions;
// one allocation added per message shows as 1 or more.
//
// The first round (AllocsPerRun's warm-up) also starts the route. It
// returns an error when the Consumer cannot be built or Run fails.
func AllocsPerMessage(opts consumer.Options, h consumer.Headers, shape func(*consumer.Route), rounds, perRound int) (float64, error) {
	if rounds < 1 || perRound < 1 {
		return 0, errors.New("sluicetest: AllocsPerMessage needs rounds and perRound >= 1")
	}
	total := (rounds + 1) * perRound
	src := &roundSource{msgs: make([]*consumer.Message, total), more: make(chan struct{}, 1)}
	src.settledAll = make(chan struct{}, 1)
	val := make([]byte, 128)
	ack := &roundAcker{src: src}
	for i := range src.msgs {
		src.msgs[i] = consumer.NewMessage(ack)
		src.msgs[i].Value = val
		src.msgs[i].Headers = h
	}
	r := consumer.Route{
		Name:    "allocs",
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
		return 0, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	started := false
	var runErr error
	round := func() {
		if runErr != nil {
			return
		}
		if !started {
			started = true
			go func() { errc <- c.Run(ctx) }()
		}
		src.target.Add(int64(perRound))
		src.limit.Add(int64(perRound))
		select {
		case src.more <- struct{}{}:
		default:
		}
		select {
		case <-src.settledAll:
		case runErr = <-errc:
			if runErr == nil {
				runErr = errors.New("sluicetest: Run returned before the round settled")
			}
		}
	}
	avg := testing.AllocsPerRun(rounds, round)
	cancel()
	if started && runErr == nil {
		runErr = <-errc
		if errors.Is(runErr, context.Canceled) {
			runErr = nil
		}
	}
	if runErr != nil {
		return 0, runErr
	}
	return avg / float64(perRound), nil
}

// roundSource hands out its preallocated messages up to limit, which
// AllocsPerMessage raises one round at a time.
type roundSource struct {
	msgs       []*consumer.Message
	next       int // the fetch loop's alone
	limit      atomic.Int64
	target     atomic.Int64 // settlements that end the current round
	settled    atomic.Int64
	more       chan struct{}
	settledAll chan struct{}
}

func (s *roundSource) Attach(consumer.RouteLimits) (consumer.SourceInfo, error) {
	return consumer.SourceInfo{}, nil
}

func (s *roundSource) Fetch(ctx context.Context, n int, _ int64) ([]*consumer.Message, error) {
	for {
		if lim := int(s.limit.Load()); s.next < lim {
			i := s.next
			s.next = min(i+n, lim)
			return s.msgs[i:s.next], nil
		}
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case <-s.more:
		}
	}
}

type roundAcker struct{ src *roundSource }

func (a *roundAcker) Settle(context.Context, consumer.Settlement) error {
	if a.src.settled.Add(1) == a.src.target.Load() {
		a.src.settledAll <- struct{}{}
	}
	return nil
}

func (a *roundAcker) InProgress(context.Context) error { return nil }
