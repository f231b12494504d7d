package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
	"github.com/sluice-go/sluice/sluicetest"
)

// The overload lab for batch routes (-mode lab): the batch route's
// capacity is measured on a backlog without deadlines, then orders are
// published at a multiple of it for a while, each with a deadline, and the
// route runs until every one is settled. It reports goodput (orders
// written and acked before their deadline) against capacity, the latency
// of successes, what expired and whether any of it was written, and the
// most the route held against its window.

// labConfig is one lab run.
type labConfig struct {
	Load        float64       // offered rate as a multiple of capacity
	Deadline    time.Duration // each order's deadline after its publish
	For         time.Duration // how long orders are offered
	PoisonEvery int
	Workers     int
	MaxBatch    int
}

// labResult is what a lab run measured.
type labResult struct {
	Capacity, Offered        float64 // orders/s
	Published                int
	Succeeded, Late, Expired uint64
	Dead                     uint64
	Goodput                  float64 // orders/s succeeded within their deadline, over the offered period
	P50, P99                 time.Duration
	ExpiredWritten, LateRows int
	PeakHeld, Window         int
	MaxHeld                  int // held, including dropped messages awaiting the broker's confirmation
	PeakBytes, WindowBytes   int64
	HeldOverWindow           bool
	MeanBatch                float64
	ExpiredEarly             uint64
	Fixed, PerMessage        time.Duration
	expiredIDs               []string
	offeredSeconds           float64
}

func (r labResult) String() string {
	return fmt.Sprintf(`capacity %.0f/s (backlog run), offered %.0f/s (%.1fx) for %.0fs with %v deadlines: %d orders
goodput %.0f/s = %.0f%% of capacity; succeeded %d (late %d), expired %d (early %d), dead-lettered %d
successes publish→ack p50 %v, p99 %v
rows written for expired orders: %d; rows written after their deadline: %d
window peak %d of %d messages, %d of %d bytes (over the window: %v; held incl. dropped awaiting confirmation: max %d); mean batch %.1f, learned %v + %v a message`,
		r.Capacity, r.Offered, r.Offered/r.Capacity, r.offeredSeconds, labDeadline, r.Published,
		r.Goodput, 100*r.Goodput/r.Capacity, r.Succeeded, r.Late, r.Expired, r.ExpiredEarly, r.Dead,
		r.P50.Round(time.Millisecond), r.P99.Round(time.Millisecond),
		r.ExpiredWritten, r.LateRows,
		r.PeakHeld, r.Window, r.PeakBytes, r.WindowBytes, r.HeldOverWindow, r.MaxHeld, r.MeanBatch,
		r.Fixed.Round(10*time.Microsecond), r.PerMessage.Round(time.Microsecond))
}

var labDeadline time.Duration

// labHook keeps, per order, what the lab reports: the latency of each
// success and the ids of the expired.
type labHook struct {
	mu      sync.Mutex
	ok      []time.Duration
	expired []string
}

func (h *labHook) HookRoute(consumer.RouteInfo) consumer.MessageHook { return h }
func (h *labHook) Held(ctx context.Context, _ *consumer.Message, _ consumer.Waits) context.Context {
	return ctx
}
func (h *labHook) Event(_ context.Context, m *consumer.Message, ev consumer.Event) {
	if ev.Kind != consumer.EventSettled {
		return
	}
	switch ev.Outcome {
	case consumer.OutcomeSucceeded:
		d := time.Since(m.PublishedAt)
		h.mu.Lock()
		h.ok = append(h.ok, d)
		h.mu.Unlock()
	case consumer.OutcomeExpired:
		if o, err := decode(m); err == nil {
			h.mu.Lock()
			h.expired = append(h.expired, o.ID)
			h.mu.Unlock()
		}
	}
}

// lab runs the overload lab on NATS.
func lab(ctx context.Context, out io.Writer, js jetstream.JetStream, st *store, cfg labConfig) (labResult, error) {
	// The producer has its own connection, as a separate process would: on
	// the consumer's, its publishes would queue ahead of the consumer's
	// pulls and acks.
	pnc, err := nats.Connect(js.Conn().ConnectedUrl())
	if err != nil {
		return labResult{}, err
	}
	defer pnc.Close()
	pjs, err := jetstream.New(pnc)
	if err != nil {
		return labResult{}, err
	}
	var res labResult
	labDeadline = cfg.Deadline
	// Capacity: a backlog, no deadlines.
	capRun, err := runOnce(ctx, natsBroker{js: js}, st, runConfig{Batch: true, Workers: cfg.Workers, MaxBatch: cfg.MaxBatch}, orders("cap", 20000, 0))
	if err != nil {
		return res, err
	}
	fmt.Fprintln(out, "capacity run:", capRun)
	res.Capacity = capRun.Rate()
	res.Offered = cfg.Load * res.Capacity

	if err := st.Reset(ctx); err != nil {
		return res, err
	}
	b := natsBroker{js: js}
	if err := b.Load(ctx, nil); err != nil {
		return res, err
	}
	src, closeSrc, err := b.Source(ctx)
	if err != nil {
		return res, err
	}
	defer closeSrc()
	hook := &labHook{}
	r := consumer.Route{Name: "orders", Source: src, Workers: cfg.Workers, BatchHandler: st.InsertBatch,
		Batch: consumer.BatchPolicy{MaxMessages: cfg.MaxBatch},
		Retry: consumer.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond}}
	c, err := consumer.New(consumer.Options{Hook: hook, ShutdownGrace: 5 * time.Second}, r)
	if err != nil {
		return res, err
	}

	// The producer: the offered rate in steps of 10 ms, async publishes.
	var published atomic.Int64
	var pubErr error
	pubDone := make(chan struct{})
	go func() {
		defer close(pubDone)
		pubErr = produce(ctx, pjs, res.Offered, cfg, &published)
	}()
	var peakOver atomic.Bool
	var maxHeld atomic.Int64
	stats, runErr := sluicetest.RunUntil(ctx, c, cfg.For+2*time.Minute, func(s []consumer.RouteStats) bool {
		if s[0].Window.InUse > s[0].WindowMessages || s[0].Window.InUseBytes > s[0].WindowBytes {
			peakOver.Store(true)
		}
		if h := int64(s[0].Held); h > maxHeld.Load() {
			maxHeld.Store(h)
		}
		select {
		case <-pubDone:
			return sluicetest.Final(s[0]) >= uint64(published.Load())
		default:
			return false
		}
	})
	<-pubDone
	if pubErr != nil {
		return res, pubErr
	}
	if runErr != nil {
		return res, runErr
	}
	s := stats[0]
	res.Published = int(published.Load())
	res.offeredSeconds = cfg.For.Seconds()
	res.Succeeded, res.Late = s.Settled[consumer.OutcomeSucceeded], s.Late
	res.Expired, res.ExpiredEarly = s.Settled[consumer.OutcomeExpired], s.Overload.ExpiredEarly
	res.Dead = s.Settled[consumer.OutcomeDeadLettered] + s.Settled[consumer.OutcomeTerminated]
	// What was published over For can succeed until For + Deadline.
	res.Goodput = float64(s.Goodput()) / (cfg.For + cfg.Deadline).Seconds()
	res.PeakHeld, res.Window = s.Window.Peak, s.WindowMessages
	res.PeakBytes, res.WindowBytes = s.Window.PeakBytes, s.WindowBytes
	res.HeldOverWindow = peakOver.Load() || s.Window.Peak > s.WindowMessages || s.Window.PeakBytes > s.WindowBytes
	res.MaxHeld = int(maxHeld.Load())
	if s.Batch.Batches > 0 {
		res.MeanBatch = float64(s.Batch.Messages) / float64(s.Batch.Batches)
	}
	res.Fixed, res.PerMessage = s.Batch.Fixed, s.Batch.PerMessage
	hook.mu.Lock()
	lat := slices.Clone(hook.ok)
	res.expiredIDs = slices.Clone(hook.expired)
	hook.mu.Unlock()
	if len(lat) > 0 {
		slices.Sort(lat)
		res.P50 = lat[len(lat)/2]
		res.P99 = lat[min(len(lat)-1, len(lat)*99/100)]
	}
	if res.ExpiredWritten, err = st.CountIDs(ctx, res.expiredIDs); err != nil {
		return res, err
	}
	if res.LateRows, err = st.WrittenLate(ctx); err != nil {
		return res, err
	}
	return res, nil
}

// produce publishes orders at rate per second for cfg.For, each with a
// deadline cfg.Deadline after its publish.
func produce(ctx context.Context, js jetstream.JetStream, rate float64, cfg labConfig, n *atomic.Int64) error {
	const step = 10 * time.Millisecond
	tick := time.NewTicker(step)
	defer tick.Stop()
	start := time.Now()
	due := 0.0
	i := 0
	var futs []jetstream.PubAckFuture
	for now := range tick.C {
		if now.Sub(start) >= cfg.For {
			break
		}
		due += rate * step.Seconds()
		for ; float64(i) < due; i++ {
			id := fmt.Sprintf("lab-%d", i)
			v, _ := json.Marshal(order{ID: id, Customer: fmt.Sprintf("c%d", i%97), AmountCents: int64(100 + i%5000)})
			if cfg.PoisonEvery > 0 && i%cfg.PoisonEvery == cfg.PoisonEvery-1 {
				v = []byte("{oops")
			}
			m := &nats.Msg{Subject: "orders.new", Data: v, Header: nats.Header{}}
			m.Header.Set(expiry.DefaultHeader, expiry.FormatDeadline(time.Now().Add(cfg.Deadline)))
			f, err := js.PublishMsgAsync(m, jetstream.WithStallWait(10*time.Second))
			if err != nil {
				return err
			}
			futs = append(futs, f)
			n.Add(1)
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
	}
	return waitAcks(ctx, futs)
}
