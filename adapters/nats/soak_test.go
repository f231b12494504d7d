package natsadapter_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/expiry"
)

// TestSoak2x is issue 13's soak: a route of 8 workers x 5 ms with a 1 s
// deadline on every message, offered twice its measured capacity for a
// while, against a broker in a separate process, once per shed setting.
// Each shed setting must keep >= 90% (60% in the short form) of the
// measured capacity as goodput (successes within their deadline) over the
// steady part of the run, never fall below half of it in any 5 s window,
// and keep heap and goroutines flat. The route without shedding runs too,
// as the baseline.
//
// It runs only when SLUICE_SOAK is set: a duration per setting
// (SLUICE_SOAK=5m is the full soak, about 26 minutes for the five
// settings), or "short" for the CI form (8 s per setting, under a minute):
//
//	SLUICE_SOAK=5m go test ./adapters/nats -run TestSoak2x -v -timeout 40m
//	SLUICE_SOAK=short go test ./adapters/nats -run TestSoak2x -v
func TestSoak2x(t *testing.T) {
	env := os.Getenv("SLUICE_SOAK")
	if env == "" {
		t.Skip("set SLUICE_SOAK=short or a duration per shed setting (5m for the full soak)")
	}
	// The short form runs in CI on a shared machine: it holds each shed
	// setting to 60%, enough to catch a collapse like issue 13.1's (4
	// msg/s); the full soak holds them to 90%.
	per, hold := 8*time.Second, 0.6
	if env != "short" {
		hold = 0.9
		d, err := time.ParseDuration(env)
		if err != nil {
			t.Fatalf("SLUICE_SOAK=%q: %v", env, err)
		}
		per = d
	}
	url := startServerProcess(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	capacity := soakCapacity(t, js)
	t.Logf("measured capacity %.0f msg/s (8 workers x 5 ms)", capacity)
	settings := []struct {
		name string
		set  func(*consumer.Route)
		// baseline: reported, not held to the 90% (without shedding, a FIFO
		// backlog hands workers messages that finish just past their
		// deadline; the shed settings are what keep goodput up).
		baseline bool
	}{
		{"no-shedding", func(*consumer.Route) {}, true},
		{"near-deadline-nak", func(r *consumer.Route) { r.Overload.ShedNearDeadline = 20 * time.Millisecond }, false},
		{"near-deadline-ack", func(r *consumer.Route) {
			r.Overload.ShedNearDeadline = 20 * time.Millisecond
			r.Overload.OnShed = consumer.ShedAck
		}, false},
		{"queue-length-nak", func(r *consumer.Route) {
			r.Overload.Queue.MaxLength = 16
			r.Overload.Queue.DropWhenFull = consumer.DropOldest
		}, false},
		{"queue-length-ack", func(r *consumer.Route) {
			r.Overload.Queue.MaxLength = 16
			r.Overload.Queue.DropWhenFull = consumer.DropOldest
			r.Overload.OnShed = consumer.ShedAck
		}, false},
	}
	for i, st := range settings {
		t.Run(st.name, func(t *testing.T) {
			soakRun(t, js, fmt.Sprintf("SOAK%d", i), capacity, per, hold, st.set, st.baseline)
		})
	}
}

const (
	soakWorkers  = 8
	soakWork     = 5 * time.Millisecond
	soakDeadline = time.Second
	soakWindow   = 64
)

func soakRoute(src consumer.Source, done *atomic.Int64) consumer.Route {
	return consumer.Route{
		Name:    "soak",
		Source:  src,
		Workers: soakWorkers,
		Expiry:  expiry.Policy{},
		Handler: func(ctx context.Context, m *consumer.Message) error {
			time.Sleep(soakWork)
			if done != nil {
				done.Add(1)
			}
			return nil
		},
		Window: consumer.WindowPolicy{Messages: soakWindow, Bytes: 8 << 20},
	}
}

// soakCapacity drains a backlog without deadlines and returns the route's
// throughput.
func soakCapacity(t *testing.T, js jetstream.JetStream) float64 {
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SOAKCAP", Subjects: []string{"soakcap.>"}}); err != nil {
		t.Fatal(err)
	}
	const n = 4000
	payload := make([]byte, 128)
	var futs []jetstream.PubAckFuture
	for range n {
		f, err := js.PublishAsync("soakcap.x", payload)
		if err != nil {
			t.Fatal(err)
		}
		futs = append(futs, f)
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			t.Fatal(err)
		}
	}
	src, err := natsadapter.NewSourceFor(ctx, js, "SOAKCAP", jetstream.ConsumerConfig{Durable: "cap"}, natsadapter.SourceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	var done atomic.Int64
	c, err := consumer.New(consumer.Options{}, soakRoute(src, &done))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()
	// Skip the start (the first pulls), then time the steady part.
	for done.Load() < n/4 {
		time.Sleep(time.Millisecond)
	}
	t0, d0 := time.Now(), done.Load()
	for done.Load() < n {
		time.Sleep(time.Millisecond)
	}
	rate := float64(done.Load()-d0) / time.Since(t0).Seconds()
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	return rate
}

type soakWindowStat struct {
	goodput    float64
	heap       uint64
	goroutines int
}

func soakRun(t *testing.T, js jetstream.JetStream, stream string, capacity float64, dur time.Duration, hold float64, set func(*consumer.Route), baseline bool) {
	ctx, cancelAll := context.WithCancel(context.Background())
	defer cancelAll()
	subj := strings.ToLower(stream) + ".x"
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subj}}); err != nil {
		t.Fatal(err)
	}
	src, err := natsadapter.NewSourceFor(ctx, js, stream, jetstream.ConsumerConfig{Durable: "soak"}, natsadapter.SourceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	route := soakRoute(src, nil)
	set(&route)
	c, err := consumer.New(consumer.Options{}, route)
	if err != nil {
		t.Fatal(err)
	}

	// The producer offers 2x capacity in 10 ms ticks, each message with a
	// deadline 1 s after it is published.
	offered := 2 * capacity
	var published atomic.Int64
	var pubErrs atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		payload := make([]byte, 128)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		start := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-tick.C:
				due := int64(offered * now.Sub(start).Seconds())
				for published.Load() < due {
					m := &nats.Msg{Subject: subj, Data: payload, Header: nats.Header{}}
					m.Header.Set(expiry.DefaultHeader, expiry.FormatDeadline(time.Now().Add(soakDeadline)))
					if _, err := js.PublishMsgAsync(m); err != nil {
						pubErrs.Add(1)
					}
					published.Add(1)
				}
			}
		}
	}()

	runCtx, stop := context.WithCancel(ctx)
	errc := make(chan error, 1)
	go func() { errc <- c.Run(runCtx) }()

	const every = 5 * time.Second
	warm := min(5*time.Second, dur/4)
	time.Sleep(warm)
	var stats []soakWindowStat
	prev := c.Stats()[0].Goodput()
	end := time.Now().Add(dur - warm)
	for time.Now().Before(end) {
		step := min(every, time.Until(end))
		if step < time.Second {
			break
		}
		time.Sleep(step)
		g := c.Stats()[0].Goodput()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		stats = append(stats, soakWindowStat{goodput: float64(g-prev) / step.Seconds(), heap: ms.HeapAlloc, goroutines: runtime.NumGoroutine()})
		prev = g
	}
	s := c.Stats()[0]
	cancelAll()
	stop()
	wg.Wait()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}

	var line []string
	var sum float64
	worst := stats[0].goodput
	for _, w := range stats {
		line = append(line, fmt.Sprintf("%.0f", w.goodput))
		sum += w.goodput
		worst = min(worst, w.goodput)
	}
	mean := sum / float64(len(stats))
	heaps := make([]uint64, len(stats))
	gmin, gmax := stats[0].goroutines, stats[0].goroutines
	for i, w := range stats {
		heaps[i] = w.heap
		gmin, gmax = min(gmin, w.goroutines), max(gmax, w.goroutines)
	}
	first, last := heaps[0], heaps[len(heaps)-1]
	sort.Slice(heaps, func(i, j int) bool { return heaps[i] < heaps[j] })
	var shed uint64
	for _, r := range s.Overload.Shed {
		for _, v := range r {
			shed += v
		}
	}
	t.Logf("goodput %.0f msg/s = %.1f%% of capacity %.0f (offered %.0f/s); worst 5 s window %.0f; windows %s",
		mean, 100*mean/capacity, capacity, offered, worst, strings.Join(line, " "))
	t.Logf("heap %.1f MiB first, %.1f MiB last, %.1f-%.1f MiB range; goroutines %d-%d; shed %d, expired %d, late %d, fetch errors %d, settle errors %d, publish errors %d; source %+v",
		mib(first), mib(last), mib(heaps[0]), mib(heaps[len(heaps)-1]), gmin, gmax, shed, s.Settled[consumer.OutcomeExpired], s.Late, s.Errors.Fetch, s.Errors.Settle, pubErrs.Load(), src.Stats())
	if mean < hold*capacity && !baseline {
		t.Errorf("goodput %.0f/s is %.1f%% of capacity (want >= %.0f%%)", mean, 100*mean/capacity, 100*hold)
	}
	if worst < min(hold, 0.5)*capacity && !baseline {
		t.Errorf("a 5 s window fell to %.0f/s (%.1f%% of capacity)", worst, 100*worst/capacity)
	}
	if gmax-gmin > 8 {
		t.Errorf("goroutines not flat: %d-%d", gmin, gmax)
	}
	if len(heaps) >= 4 && last > 2*heaps[len(heaps)/2]+(8<<20) {
		t.Errorf("heap not flat: last %.1f MiB, median %.1f MiB", mib(last), mib(heaps[len(heaps)/2]))
	}
}

func mib(b uint64) float64 { return float64(b) / (1 << 20) }
