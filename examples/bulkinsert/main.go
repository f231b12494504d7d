package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/sluicetest"
)

var (
	dsnFlag     = flag.String("dsn", "", "PostgreSQL to write to, e.g. `postgres://user:pass@host/db` (default: an embedded PostgreSQL, started and removed here)")
	modeFlag    = flag.String("mode", "batch", "batch (BatchHandler, COPY), single (Handler, one INSERT a message), compare (interleaved pairs of both), lab (overload with deadlines), or plot (an SVG of the compare outputs named as arguments, to stdout)")
	nFlag       = flag.Int("n", 20000, "orders to load into the broker before the consumer starts")
	workersFlag = flag.Int("workers", 8, "the route's Workers")
	batchFlag   = flag.Int("max-batch", 0, "BatchPolicy.MaxMessages (0: the default)")
	poisonFlag  = flag.Int("poison-every", 100, "every `N`th order cannot be decoded and is dead-lettered (0: none)")
	pairsFlag   = flag.Int("pairs", 3, "compare: how many single/batch pairs to run")
	loadFlag    = flag.Float64("load", 3, "lab: offered rate as a multiple of the batch route's capacity")
	deadFlag    = flag.Duration("deadline", 500*time.Millisecond, "lab: each order's deadline after its publish")
	forFlag     = flag.Duration("for", 10*time.Second, "lab: how long orders are offered")
	brokerFlag  = flag.String("broker", "nats", "nats (an embedded JetStream server) or kafka ($KAFKA_BROKERS, else an in-process kfake cluster); -mode lab is NATS only")
	cpuFlag     = flag.String("cpuprofile", "", "write a CPU profile of the whole run to `FILE`")
)

func main() {
	if pgChild() {
		return // ran as the unprivileged PostgreSQL starter (pg.go)
	}
	flag.Parse()
	if *modeFlag == "plot" {
		if err := plotCompare(flag.Args(), os.Stdout); err != nil {
			log.Fatal(err)
		}
		return
	}
	if *cpuFlag != "" {
		f, err := os.Create(*cpuFlag)
		if err != nil {
			log.Fatal(err)
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			log.Fatal(err)
		}
		defer pprof.StopCPUProfile()
	}
	if err := run(context.Background(), os.Stdout); err != nil {
		log.Print(err)
		return
	}
}

func run(ctx context.Context, out io.Writer) error {
	dsn := *dsnFlag
	if dsn == "" {
		fmt.Fprintln(out, "starting an embedded PostgreSQL (first run: fetching its binaries into", pgCache()+")")
		pg, err := startPostgres(io.Discard)
		if err != nil {
			return err
		}
		defer pg.Stop()
		dsn = pg.DSN
	}
	st, err := openStore(ctx, dsn, *workersFlag+2)
	if err != nil {
		return err
	}
	defer st.Close()

	dir, err := os.MkdirTemp("", "sluice-bulkinsert")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	srv, err := natstest.Run(dir)
	if err != nil {
		return err
	}
	defer srv.WaitForShutdown()
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	var b broker = natsBroker{js: js}
	switch *brokerFlag {
	case "nats":
	case "kafka":
		cl, err := kafkatest.New() // $KAFKA_BROKERS, else an in-process kfake cluster
		if err != nil {
			return err
		}
		defer cl.Close()
		fmt.Fprintf(out, "%s cluster at %v\n", cl.Kind(), cl.Brokers)
		b = &kafkaBroker{cl: cl}
	default:
		return fmt.Errorf("bulkinsert: unknown -broker %q", *brokerFlag)
	}
	cfg := runConfig{Workers: *workersFlag, MaxBatch: *batchFlag}
	msgs := orders("o", *nFlag, *poisonFlag)

	switch *modeFlag {
	case "batch", "single":
		cfg.Batch = *modeFlag == "batch"
		res, err := runOnce(ctx, b, st, cfg, msgs)
		if err != nil {
			return err
		}
		fmt.Fprintln(out, res)
		return nil
	case "compare":
		return compare(ctx, out, b, st, cfg, msgs, *pairsFlag)
	case "lab":
		res, err := lab(ctx, out, js, st, labConfig{Load: *loadFlag, Deadline: *deadFlag, For: *forFlag,
			PoisonEvery: *poisonFlag, Workers: *workersFlag, MaxBatch: *batchFlag})
		if err != nil {
			return err
		}
		fmt.Fprintln(out, res)
		return nil
	}
	return fmt.Errorf("bulkinsert: unknown -mode %q", *modeFlag)
}

// runConfig shapes one run's route.
type runConfig struct {
	Batch    bool
	Workers  int
	MaxBatch int
}

// result is what one run measured.
type result struct {
	Mode                  string
	Orders, Rows          int
	Succeeded, Dead       uint64
	Expired               uint64
	ExpiredIDs            []string
	Elapsed               time.Duration
	Batches, BatchMsgs    uint64
	Fixed, PerMessage     time.Duration
	PeakHeld, WindowLimit int
}

// Rate is the orders settled per second.
func (r result) Rate() float64 { return float64(r.Orders) / r.Elapsed.Seconds() }

func (r result) String() string {
	s := fmt.Sprintf("%-6s %6d orders in %7.3fs: %8.0f/s; %d rows, %d acked, %d dead-lettered, %d expired; window peak %d of %d",
		r.Mode, r.Orders, r.Elapsed.Seconds(), r.Rate(), r.Rows, r.Succeeded, r.Dead, r.Expired, r.PeakHeld, r.WindowLimit)
	if r.Batches > 0 {
		s += fmt.Sprintf("; %d batches, mean %.1f a batch, learned %v + %v a message",
			r.Batches, float64(r.BatchMsgs)/float64(r.Batches), r.Fixed.Round(10*time.Microsecond), r.PerMessage.Round(time.Microsecond))
	}
	return s
}

// expiredIDs is a Hook that keeps the ids of the orders settled as expired.
type expiredIDs struct {
	mu  sync.Mutex
	ids []string
}

func (e *expiredIDs) HookRoute(consumer.RouteInfo) consumer.MessageHook { return e }
func (e *expiredIDs) Held(ctx context.Context, _ *consumer.Message, _ consumer.Waits) context.Context {
	return ctx
}
func (e *expiredIDs) Event(_ context.Context, m *consumer.Message, ev consumer.Event) {
	if ev.Kind != consumer.EventSettled || ev.Outcome != consumer.OutcomeExpired {
		return
	}
	if o, err := decode(m); err == nil {
		e.mu.Lock()
		e.ids = append(e.ids, o.ID)
		e.mu.Unlock()
	}
}

// runOnce empties the table, loads msgs into the broker, and runs one route
// (batch or per message) until every message is settled for good.
func runOnce(ctx context.Context, b broker, st *store, cfg runConfig, msgs []payload) (result, error) {
	res := result{Mode: "single", Orders: len(msgs)}
	if cfg.Batch {
		res.Mode = "batch"
	}
	if err := st.Reset(ctx); err != nil {
		return res, err
	}
	if err := b.Load(ctx, msgs); err != nil {
		return res, err
	}
	src, closeSrc, err := b.Source(ctx)
	if err != nil {
		return res, err
	}
	defer closeSrc()
	r := consumer.Route{Name: "orders", Source: src, Workers: cfg.Workers,
		Retry: consumer.RetryPolicy{BaseDelay: 10 * time.Millisecond, MaxDelay: 100 * time.Millisecond}}
	if cfg.Batch {
		r.BatchHandler = st.InsertBatch
		r.Batch.MaxMessages = cfg.MaxBatch
	} else {
		r.Handler = st.InsertOne
	}
	var expired expiredIDs
	c, err := consumer.New(consumer.Options{Hook: &expired, ShutdownGrace: 5 * time.Second}, r)
	if err != nil {
		return res, err
	}
	start := time.Now()
	stats, err := sluicetest.RunUntil(ctx, c, 10*time.Minute, func(s []consumer.RouteStats) bool {
		return sluicetest.Final(s[0]) >= uint64(len(msgs))
	})
	res.Elapsed = time.Since(start)
	if err != nil {
		return res, err
	}
	s := stats[0]
	res.Succeeded = s.Settled[consumer.OutcomeSucceeded]
	res.Dead = s.Settled[consumer.OutcomeDeadLettered] + s.Settled[consumer.OutcomeTerminated]
	res.Expired = s.Settled[consumer.OutcomeExpired]
	res.Batches, res.BatchMsgs = s.Batch.Batches, s.Batch.Messages
	res.Fixed, res.PerMessage = s.Batch.Fixed, s.Batch.PerMessage
	res.PeakHeld, res.WindowLimit = s.Window.Peak, s.WindowMessages
	expired.mu.Lock()
	res.ExpiredIDs = slices.Clone(expired.ids)
	expired.mu.Unlock()
	res.Rows, err = st.Count(ctx)
	return res, err
}

// compare runs pairs of (per-message, batch) runs, alternating which goes
// first, and reports each pair's throughput ratio.
func compare(ctx context.Context, out io.Writer, b broker, st *store, cfg runConfig, msgs []payload, pairs int) error {
	if pairs < 1 {
		return errors.New("bulkinsert: -pairs must be at least 1")
	}
	var ratios []float64
	for p := range pairs {
		var single, batch result
		for k := range 2 {
			c := cfg
			c.Batch = (p+k)%2 == 1
			res, err := runOnce(ctx, b, st, c, msgs)
			if err != nil {
				return err
			}
			fmt.Fprintln(out, res)
			if c.Batch {
				batch = res
			} else {
				single = res
			}
		}
		ratios = append(ratios, batch.Rate()/single.Rate())
		fmt.Fprintf(out, "pair %d: batch/single = %.1fx (mean batch %.1f)\n", p+1, ratios[p], float64(batch.BatchMsgs)/float64(max(batch.Batches, 1)))
	}
	sorted := slices.Clone(ratios)
	slices.Sort(sorted)
	fmt.Fprintf(out, "batch/single over %d pairs: median %.1fx, range %.1fx to %.1fx\n", pairs, sorted[len(sorted)/2], sorted[0], sorted[len(sorted)-1])
	return nil
}
