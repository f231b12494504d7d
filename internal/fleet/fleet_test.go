package fleet_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/internal/fleet"
)

// One instance's handler: workers × cost is its capacity.
const (
	workers    = 4
	window     = 16
	cost       = 8 * time.Millisecond
	capacity   = float64(workers) / 0.008 // msg/s of one instance
	partitions = 6
)

// commitInterval is the Kafka instances' CommitInterval:
// $SLUICE_FLEET_COMMIT_INTERVAL, default 1 s (the adapter's default).
func commitInterval(t *testing.T) time.Duration {
	v := os.Getenv("SLUICE_FLEET_COMMIT_INTERVAL")
	if v == "" {
		return time.Second
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		t.Fatalf("SLUICE_FLEET_COMMIT_INTERVAL=%q: want a positive duration", v)
	}
	return d
}

// plan is how long each part of a run lasts.
type plan struct {
	measure time.Duration // steady-state measurement per fleet size
	churn   time.Duration // load with instances coming and going
	step    time.Duration // time between two churn actions
	// scale2 and scale4 are the least throughput 2 and 4 instances must
	// reach, as multiples of one's. The short form (CI, on whatever else
	// the machine runs) only catches a fleet that does not scale at all.
	scale2, scale4 float64
}

func runPlan(t *testing.T) plan {
	switch m := os.Getenv("SLUICE_FLEET"); m {
	case "short":
		return plan{measure: 4 * time.Second, churn: 24 * time.Second, step: 3 * time.Second, scale2: 1.3, scale4: 2}
	case "full":
		return plan{measure: 10 * time.Second, churn: time.Minute, step: 3 * time.Second, scale2: 1.5, scale4: 2.5}
	case "":
		t.Skip("the fleet test runs broker and consumer processes: SLUICE_FLEET=short (CI) or full (docs/fleet.md)")
	default:
		t.Fatalf("SLUICE_FLEET=%q: want short or full", m)
	}
	return plan{}
}

// target is one broker the fleet runs on.
type target struct {
	name string
	// args are an instance's flags for group (Kafka group / JetStream
	// durable) on the topic or stream named dest.
	args func(dest, group string) []string
	// create makes a topic (stream) with partitions and returns its name.
	create func(t *testing.T, prefix string) string
	// produce writes ids [lo, hi) to dest and waits for the broker.
	produce func(ctx context.Context, dest string, lo, hi int) error
	// settled reports whether the broker has everything in dest settled
	// by group, with the figures that say so.
	settled func(ctx context.Context, dest, group string) (bool, string, error)
	// stable reports whether a fleet of n instances is past its start.
	stable func(f *fleet.Fleet, n int) bool
	bounds fleet.Bounds
}

func TestFleet(t *testing.T) {
	p := runPlan(t)
	bin := buildMember(t)
	t.Run("kafka", func(t *testing.T) { runFleet(t, p, bin, kafkaTarget(t)) })
	t.Run("nats", func(t *testing.T) { runFleet(t, p, bin, natsTarget(t)) })
}

func repoRoot(t *testing.T) string {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// buildMember builds examples/fleet into a temp dir.
func buildMember(t *testing.T) string {
	bin := filepath.Join(t.TempDir(), "fleet")
	cmd := exec.Command("go", "build", "-o", bin, "./examples/fleet")
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build ./examples/fleet: %v\n%s", err, out)
	}
	return bin
}

func runFleet(t *testing.T, p plan, bin string, tg *target) {
	rates := map[int]float64{}
	for _, n := range []int{1, 2, 4} {
		rates[n] = measure(t, p, bin, tg, n)
	}
	t.Logf("%s: steady-state msg/s with 1, 2, 4 instances: %.0f, %.0f, %.0f (%.2fx, %.2fx of one; nominal capacity %.0f each)",
		tg.name, rates[1], rates[2], rates[4], rates[2]/rates[1], rates[4]/rates[1], capacity)
	if rates[2] < p.scale2*rates[1] || rates[4] < p.scale4*rates[1] {
		t.Errorf("%s: throughput does not scale with the fleet: %.0f, %.0f, %.0f msg/s", tg.name, rates[1], rates[2], rates[4])
	}
	churn(t, p, bin, tg)
}

// measure runs n instances on a backlog and returns their steady-state
// settlements per second.
func measure(t *testing.T, p plan, bin string, tg *target, n int) float64 {
	// The backlog outlasts the start and the measurement at n × capacity.
	backlog := int(float64(n) * capacity * (p.measure + 20*time.Second).Seconds())
	dest := tg.create(t, "fleet-scale")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := tg.produce(ctx, dest, 0, backlog); err != nil {
		t.Fatal(err)
	}
	f := &fleet.Fleet{Bin: bin, Args: tg.args(dest, kafkatest.UniqueName("scale")), LogDir: t.TempDir()}
	defer stopAll(t, f)
	for range n {
		if _, err := f.Start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, pr := range f.All() {
		if err := pr.Ready(ctx); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, ctx, fmt.Sprintf("%d instances settled in", n), func() bool { return tg.stable(f, n) })
	s0, t0 := f.Settled(), time.Now()
	time.Sleep(p.measure) // the measurement itself: a steady-state rate over this time
	s1, t1 := f.Settled(), time.Now()
	if !tg.stable(f, n) {
		t.Errorf("%s, %d instances: the group changed during the measurement", tg.name, n)
	}
	if s1 >= int64(backlog) {
		t.Fatalf("%s, %d instances: the backlog of %d ran out", tg.name, n, backlog)
	}
	rate := float64(s1-s0) / t1.Sub(t0).Seconds()
	t.Logf("%s, %d instances: %.0f msg/s over %v", tg.name, n, rate, t1.Sub(t0).Round(time.Millisecond))
	return rate
}

// churn runs the fleet under 1.5× one instance's capacity while instances
// are added, terminated and killed, then drains and checks the ledger.
func churn(t *testing.T, p plan, bin string, tg *target) {
	dest := tg.create(t, "fleet-churn")
	group := kafkatest.UniqueName("churn")
	led := fleet.NewLedger()
	f := &fleet.Fleet{Bin: bin, Args: tg.args(dest, group), LogDir: t.TempDir(), Ledger: led}
	defer stopAll(t, f)
	ctx, cancel := context.WithTimeout(context.Background(), p.churn+3*time.Minute)
	defer cancel()
	for range 2 {
		if _, err := f.Start(); err != nil {
			t.Fatal(err)
		}
	}
	for _, pr := range f.All() {
		if err := pr.Ready(ctx); err != nil {
			t.Fatal(err)
		}
	}

	// The load: 1.5 × one instance's capacity, in 20 ms ticks.
	// A batch under way when the churn ends is finished, so every id
	// written is in the ledger's count.
	load := 1.5 * capacity
	stopProd := make(chan struct{})
	var prodErr error
	var wg sync.WaitGroup
	wg.Go(func() {
		const tick = 20 * time.Millisecond
		start, next := time.Now(), 0
		tk := time.NewTicker(tick)
		defer tk.Stop()
		for {
			select {
			case <-stopProd:
				return
			case <-tk.C:
			}
			want := int(load * time.Since(start).Seconds())
			if want <= next {
				continue
			}
			if err := tg.produce(ctx, dest, next, want); err != nil {
				prodErr = err
				return
			}
			next = want
			led.Produced(next)
		}
	})

	// The churn: a fixed cycle of actions, kept between 1 and 4 instances.
	rng := rand.New(rand.NewPCG(19, 2))
	cycle := []string{"add", "kill", "add", "add", "term", "kill", "add", "term"}
	var events []string
	began := time.Now()
	tk := time.NewTicker(p.step)
	for i := 0; time.Since(began) < p.churn; i++ {
		select {
		case <-tk.C:
		case <-ctx.Done():
			t.Fatal(ctx.Err())
		}
		live := f.Live()
		action := cycle[i%len(cycle)]
		switch {
		case action == "add" && len(live) >= 4:
			action = "term"
		case action != "add" && len(live) <= 1:
			action = "add"
		}
		at := time.Since(began).Round(100 * time.Millisecond)
		if action == "add" {
			pr, err := f.Start()
			if err != nil {
				t.Fatal(err)
			}
			events = append(events, fmt.Sprintf("%v +%d", at, pr.ID))
			continue
		}
		victim := live[rng.IntN(len(live))]
		if action == "kill" {
			err := f.Kill(victim)
			events = append(events, fmt.Sprintf("%v kill %d", at, victim.ID))
			if err != nil {
				t.Fatal(err)
			}
		} else {
			err := f.Terminate(victim)
			events = append(events, fmt.Sprintf("%v term %d", at, victim.ID))
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	tk.Stop()
	close(stopProd)
	wg.Wait()
	if prodErr != nil {
		t.Fatalf("producer: %v", prodErr)
	}
	produced := led.ProducedCount()
	t.Logf("%s churn: %d messages in %v (%.0f msg/s); events: %s", tg.name, produced,
		time.Since(began).Round(time.Millisecond), float64(produced)/time.Since(began).Seconds(), strings.Join(events, ", "))

	// Drain with two fresh instances besides the survivors.
	for range 2 {
		if _, err := f.Start(); err != nil {
			t.Fatal(err)
		}
	}
	drainStart := time.Now()
	var detail string
	drainCtx, cancelDrain := context.WithTimeout(ctx, 90*time.Second)
	defer cancelDrain()
	drained := poll(drainCtx, func() bool {
		ok, d, err := tg.settled(ctx, dest, group)
		detail = fmt.Sprint(d, err)
		if n := led.Missing(); n > 0 {
			detail = fmt.Sprintf("%d not handled yet (first: %v); broker: %s", n, led.Report(tg.bounds).Lost, detail)
			return false
		}
		return err == nil && ok
	})
	if !drained {
		for _, pr := range f.Live() {
			t.Logf("live instance %d: %+v, %d settled", pr.ID, pr.Window(), pr.Settled())
		}
		t.Fatalf("%s: not drained 90 s after the churn: %s; logs in %s", tg.name, detail, f.LogDir)
	}
	t.Logf("%s drain: %v after the churn (%s)", tg.name, time.Since(drainStart).Round(time.Millisecond), detail)
	if err := f.StopAll(30 * time.Second); err != nil {
		t.Errorf("graceful stop: %v", err)
	}
	if ok, d, err := tg.settled(ctx, dest, group); err != nil || !ok {
		t.Errorf("after the fleet stopped: settled %v (%s), %v", ok, d, err)
	}

	r := led.Report(tg.bounds)
	t.Logf("%s ledger:\n%s", tg.name, r)
	if r.NumLost > 0 {
		t.Errorf("%d messages lost: %v", r.NumLost, r.Lost)
	}
	if r.Unknown > 0 {
		t.Errorf("%d ledger lines about unknown ids", r.Unknown)
	}
	for _, k := range r.OverBound {
		t.Errorf("SIGKILL of instance %d left %d duplicates, above its bound %d", k.Inst, k.InFlight+k.SettledLate, k.Bound)
	}
	kills, terms := 0, 0
	for _, pr := range f.All() {
		w := pr.Window()
		t.Logf("%s instance %d (%v): held at most %d (hook) / %d (route's Window.Peak), window %d; settled %d; held %d at its last report",
			tg.name, pr.ID, pr.End(), w.HookPeak, w.RoutePeak, w.Limit, pr.Settled(), w.Held)
		if w.HookPeak > window || w.RoutePeak > window || w.Limit > window {
			t.Errorf("%s instance %d held %d (route %d, limit %d): above its window %d", tg.name, pr.ID, w.HookPeak, w.RoutePeak, w.Limit, window)
		}
		switch pr.End() {
		case fleet.Killed:
			kills++
		case fleet.Terminated:
			terms++
			if ok, _ := pr.Exited(); !ok {
				t.Errorf("%s instance %d was terminated but did not finish its graceful stop", tg.name, pr.ID)
			}
		}
	}
	if kills == 0 || terms == 0 {
		t.Errorf("churn had %d kills and %d graceful stops: want both", kills, terms)
	}
}

func stopAll(t *testing.T, f *fleet.Fleet) {
	if err := f.StopAll(30 * time.Second); err != nil {
		t.Error(err)
	}
}

// waitFor polls cond every 100 ms until it holds or ctx ends.
func waitFor(t *testing.T, ctx context.Context, what string, cond func() bool) {
	t.Helper()
	if !poll(ctx, cond) {
		t.Fatalf("waiting for %s: %v", what, ctx.Err())
	}
}

// poll reports whether cond held, checked every 100 ms, before ctx ended.
func poll(ctx context.Context, cond func() bool) bool {
	tk := time.NewTicker(100 * time.Millisecond)
	defer tk.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return false
		case <-tk.C:
		}
	}
	return true
}

// ---------------------------------------------------------------- Kafka

// kafkaTarget uses $KAFKA_BROKERS, or starts a broker with scripts/kafka.
func kafkaTarget(t *testing.T) *target {
	if os.Getenv(kafkatest.EnvBrokers) == "" {
		if _, err := exec.LookPath("java"); err != nil {
			t.Skip("no Kafka: set KAFKA_BROKERS, or install Java 17+ so scripts/kafka can start a broker")
		}
		dir := t.TempDir()
		script := filepath.Join(repoRoot(t), "scripts", "kafka")
		out, err := exec.Command(script, "start", dir).Output()
		if err != nil {
			t.Skipf("no Kafka: scripts/kafka start: %v", err)
		}
		t.Cleanup(func() { _ = exec.Command(script, "stop", "--rm", dir).Run() })
		line := strings.TrimSpace(string(out))
		t.Setenv(kafkatest.EnvBrokers, line[strings.LastIndex(line, "=")+1:])
	}
	cl, err := kafkatest.New()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(cl.Close)
	if !cl.Real() {
		t.Fatal("the fleet runs on a real broker")
	}
	var mu sync.Mutex
	writers := map[string]*kafka.Writer{}
	t.Cleanup(func() {
		for _, w := range writers {
			kafkatest.CloseWriter(w)
		}
	})
	brokers := strings.Join(cl.Brokers, ",")
	ci := commitInterval(t)
	return &target{
		name: "kafka",
		args: func(topic, group string) []string {
			return []string{"-broker", "kafka", "-brokers", brokers, "-topic", topic, "-group", group, "-commit-interval", ci.String(),
				"-workers", strconv.Itoa(workers), "-window", strconv.Itoa(window), "-cost", cost.String()}
		},
		create: func(t *testing.T, prefix string) string { return cl.Topic(t, prefix, partitions) },
		produce: func(ctx context.Context, topic string, lo, hi int) error {
			mu.Lock()
			w := writers[topic]
			if w == nil {
				w = cl.Writer(topic)
				writers[topic] = w
			}
			mu.Unlock()
			for lo < hi {
				n := min(hi-lo, 1000)
				msgs := make([]kafka.Message, n)
				for i := range msgs {
					v := []byte(strconv.Itoa(lo + i))
					msgs[i] = kafka.Message{Key: v, Value: v}
				}
				if err := w.WriteMessages(ctx, msgs...); err != nil {
					return err
				}
				lo += n
			}
			return nil
		},
		settled: func(ctx context.Context, topic, group string) (bool, string, error) {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			req := &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{}}
			for p := range partitions {
				req.Topics[topic] = append(req.Topics[topic], kafka.LastOffsetOf(p))
			}
			ends, err := cl.Client().ListOffsets(ctx, req)
			if err != nil {
				return false, "", err
			}
			committed, err := cl.Committed(ctx, group, topic, partitions)
			if err != nil {
				return false, "", err
			}
			ok, behind := true, int64(0)
			for _, po := range ends.Topics[topic] {
				if po.Error != nil {
					return false, "", po.Error
				}
				if c := committed[po.Partition]; c != po.LastOffset {
					ok = false
					behind += po.LastOffset - max(c, 0)
				}
			}
			return ok, fmt.Sprintf("committed offsets %d behind the ends", behind), nil
		},
		stable: func(f *fleet.Fleet, n int) bool {
			live := f.Live()
			if len(live) != n {
				return false
			}
			gen, parts := -1, 0
			for _, p := range live {
				w := p.Window()
				if w.Gen == 0 || gen >= 0 && w.Gen != gen || p.Settled() == 0 {
					return false
				}
				gen, parts = w.Gen, parts+w.Parts
			}
			return parts == partitions
		},
		// A settlement waits up to a CommitInterval for its commit, plus
		// the commit's round trip and the line's way through the pipe.
		bounds: fleet.Bounds{Window: window, CommitLag: ci + 500*time.Millisecond},
	}
}

// ---------------------------------------------------------------- NATS

// natsTarget starts a nats-server process (built from the module cache)
// with JetStream on a temp dir.
func natsTarget(t *testing.T) *target {
	dir := t.TempDir()
	bin := filepath.Join(dir, "nats-server")
	build := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2")
	build.Dir = repoRoot(t)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build nats-server: %v\n%s", err, out)
	}
	port := freePort(t)
	srv := exec.Command(bin, "-js", "-sd", filepath.Join(dir, "store"), "-a", "127.0.0.1", "-p", strconv.Itoa(port))
	logf, err := os.Create(filepath.Join(dir, "nats-server.log"))
	if err != nil {
		t.Fatal(err)
	}
	srv.Stdout, srv.Stderr = logf, logf
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = srv.Process.Signal(syscall.SIGTERM)
		_ = srv.Wait()
		_ = logf.Close()
	})
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	var nc *nats.Conn
	deadline := time.Now().Add(30 * time.Second)
	for {
		nc, err = nats.Connect(url)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nats-server at %s: %v", url, err)
		}
		time.Sleep(50 * time.Millisecond) // the server process is starting: poll its port
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return &target{
		name: "nats",
		args: func(stream, durable string) []string {
			return []string{"-broker", "nats", "-nats", url, "-stream", stream, "-durable", durable,
				"-ack-wait", "5s", "-workers", strconv.Itoa(workers), "-window", strconv.Itoa(window), "-cost", cost.String()}
		},
		create: func(t *testing.T, prefix string) string {
			name := strings.ToUpper(strings.ReplaceAll(kafkatest.UniqueName(prefix), "-", "_"))
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{name + ".>"}}); err != nil {
				t.Fatal(err)
			}
			return name
		},
		produce: func(ctx context.Context, stream string, lo, hi int) error {
			for lo < hi {
				n := min(hi-lo, 1000)
				acks := make([]jetstream.PubAckFuture, n)
				for i := range n {
					a, err := js.PublishAsync(stream+".m", []byte(strconv.Itoa(lo+i)))
					if err != nil {
						return err
					}
					acks[i] = a
				}
				for i, a := range acks {
					select {
					case <-a.Ok():
					case err := <-a.Err():
						return fmt.Errorf("publish %d: %w", lo+i, err)
					case <-ctx.Done():
						return ctx.Err()
					}
				}
				lo += n
			}
			return nil
		},
		settled: func(ctx context.Context, stream, durable string) (bool, string, error) {
			ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			c, err := js.Consumer(ctx, stream, durable)
			if err != nil {
				return false, "", err
			}
			info, err := c.Info(ctx)
			if err != nil {
				return false, "", err
			}
			return info.NumPending == 0 && info.NumAckPending == 0,
				fmt.Sprintf("%d pending, %d ack pending, %d redelivered", info.NumPending, info.NumAckPending, info.NumRedelivered), nil
		},
		stable: func(f *fleet.Fleet, n int) bool {
			live := f.Live()
			if len(live) != n {
				return false
			}
			for _, p := range live {
				if p.Settled() == 0 {
					return false
				}
			}
			return true
		},
		bounds: fleet.Bounds{Window: window},
	}
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}
