package kafkaadapter_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
)

// runLedger records each handler run that succeeded, per partition and
// offset and per phase (a consumer's life: before and after a restart,
// a rebalance), so a test can count re-runs of completed work.
type runLedger struct {
	mu    sync.Mutex
	phase int
	done  map[dlq.Origin][]int // phases in which the message succeeded
}

func newRunLedger() *runLedger { return &runLedger{done: map[dlq.Origin][]int{}} }

func (l *runLedger) succeeded(o dlq.Origin) {
	o = dlq.Origin{Partition: o.Partition, Offset: o.Offset} // one topic per test
	l.mu.Lock()
	l.done[o] = append(l.done[o], l.phase)
	l.mu.Unlock()
}

func (l *runLedger) next() {
	l.mu.Lock()
	l.phase++
	l.mu.Unlock()
}

// count returns how many messages succeeded at least once, and how many
// runs were repeats of a success.
func (l *runLedger) count() (unique, reruns int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ph := range l.done {
		unique++
		reruns += len(ph) - 1
	}
	return unique, reruns
}

// ledgerBaselineEnv set to 1 runs each ledger test a second time with
// plain commits (kafkaadapter.PlainCommits: the watermark alone, what the
// map improves on), measured and logged, not asserted: the "before" of
// docs/benchmarks.md.
const ledgerBaselineEnv = "SLUICE_LEDGER_BASELINE"

// ledgerModes runs f with the settled map ("map") and, with
// ledgerBaselineEnv=1, with plain commits ("plain").
func ledgerModes(t *testing.T, f func(t *testing.T, plain bool)) {
	t.Run("map", func(t *testing.T) { f(t, false) })
	if os.Getenv(ledgerBaselineEnv) == "1" {
		t.Run("plain", func(t *testing.T) { f(t, true) })
	}
}

// mode names a ledger run and returns the member options it uses.
func mode(plain bool) (string, []func(*kafkaadapter.Source)) {
	if plain {
		return "plain watermark", []func(*kafkaadapter.Source){kafkaadapter.PlainCommits}
	}
	return "settled map", nil
}

// TestSettledMapGracefulRestart: one message in ~100 fails once and waits
// 3 s for its retry, so the commit point lags far behind the work done; a
// graceful stop commits the map of what was settled above it, and the
// consumer started next does not run any of that again.
func TestSettledMapGracefulRestart(t *testing.T) { ledgerModes(t, testSettledMapGracefulRestart) }

func testSettledMapGracefulRestart(t *testing.T, plain bool) {
	name, opts := mode(plain)
	const n, parts = 3000, 2
	topic := cluster.Topic(t, "mapstop", parts)
	group := kafkatest.UniqueName("mapstop")
	produceN(t, topic, n, 64, nil)
	l := newRunLedger()
	route := consumer.Route{
		Workers: 8,
		Retry:   consumer.RetryPolicy{MaxAttempts: 5, BaseDelay: 3 * time.Second, MaxDelay: 3 * time.Second},
		Handler: func(_ context.Context, m *consumer.Message) error {
			time.Sleep(500 * time.Microsecond)
			if m.Origin.Offset%97 == 5 && m.Attempt == 1 {
				return errors.New("not yet")
			}
			l.succeeded(m.Origin)
			return nil
		},
	}
	a := startMember(t, testConfig(group, topic), route, opts...)
	waitFor(t, 30*time.Second, "half the work", func() bool { u, _ := l.count(); return u >= n/2 })
	a.stop(t)
	first, _ := l.count()
	l.next()
	b := startMember(t, testConfig(group, topic), route, opts...)
	waitFor(t, 60*time.Second, "all the work", func() bool { u, _ := l.count(); return u >= n })
	b.stop(t)
	_, reruns := l.count()
	sa, sb := a.src.Stats(), b.src.Stats()
	t.Logf("ledger: graceful restart, %s, %s: %d succeeded before the stop; after it %d re-runs, %d records skipped as settled (%d partition maps)",
		cluster.Kind(), name, first, reruns, sb.SkippedSettled, sb.MapsRestored)
	if plain {
		return
	}
	if reruns != 0 {
		t.Errorf("%d messages that had succeeded ran again after a graceful stop", reruns)
	}
	if sb.SkippedSettled == 0 || sb.MapsRestored == 0 {
		t.Errorf("the map was not used: %+v (first member %+v)", sb, sa)
	}
}

// TestSettledMapRebalance: members join and leave a group under load,
// with messages retried for 1 s holding each partition's commit point
// back; at each rebalance the final commit carries the map, and no message
// that succeeded runs again anywhere.
func TestSettledMapRebalance(t *testing.T) { ledgerModes(t, testSettledMapRebalance) }

func testSettledMapRebalance(t *testing.T, plain bool) {
	name, opts := mode(plain)
	const n, parts = 4000, 4
	topic := cluster.Topic(t, "maprebal", parts)
	group := kafkatest.UniqueName("maprebal")
	produceN(t, topic, n, 64, nil)
	l := newRunLedger()
	route := consumer.Route{
		Workers: 8,
		Retry:   consumer.RetryPolicy{MaxAttempts: 5, BaseDelay: time.Second, MaxDelay: time.Second},
		Handler: func(_ context.Context, m *consumer.Message) error {
			time.Sleep(time.Millisecond)
			if m.Origin.Offset%89 == 3 && m.Attempt == 1 {
				return errors.New("not yet")
			}
			l.succeeded(m.Origin)
			return nil
		},
	}
	progress := func(k int) func() bool { return func() bool { u, _ := l.count(); return u >= k } }
	a := startMember(t, testConfig(group, topic), route, opts...)
	waitFor(t, 30*time.Second, "first progress", progress(n/5))
	b := startMember(t, testConfig(group, topic), route, opts...)
	waitFor(t, 30*time.Second, "progress with two", progress(2*n/5))
	c := startMember(t, testConfig(group, topic), route, opts...)
	waitFor(t, 30*time.Second, "progress with three", progress(3*n/5))
	a.stop(t)
	waitFor(t, 30*time.Second, "progress after a left", progress(4*n/5))
	b.stop(t)
	waitFor(t, 60*time.Second, "all the work", progress(n))
	c.stop(t)
	_, reruns := l.count()
	var skipped, maps, stale, gens int64
	for _, m := range []*member{a, b, c} {
		s := m.src.Stats()
		skipped, maps, stale, gens = skipped+s.SkippedSettled, maps+s.MapsRestored, stale+s.StaleSettles, gens+s.Generations
	}
	t.Logf("ledger: rebalances, %s, %s: %d generations; %d re-runs of succeeded messages, %d records skipped as settled (%d partition maps), %d stale settles",
		cluster.Kind(), name, gens, reruns, skipped, maps, stale)
	if plain {
		return
	}
	if reruns != 0 {
		t.Errorf("%d messages that had succeeded ran again across rebalances", reruns)
	}
	if skipped == 0 {
		t.Error("no rebalance used a map")
	}
}

// The SIGKILL case: a child process (this test binary) consumes and logs
// each success, with its time, before its handler returns; the parent
// kills it mid-run, consumes the rest, and counts what ran twice: only
// work settled after the child's last commit may, so at most about one
// commit interval of successes.
const killChildEnv = "SLUICE_KILL_CHILD"

var retryLater = consumer.RetryPolicy{MaxAttempts: 5, BaseDelay: 2 * time.Second, MaxDelay: 2 * time.Second}

func TestSettledMapKill(t *testing.T) {
	if os.Getenv(killChildEnv) != "" {
		killChild(t)
		return
	}
	ledgerModes(t, testSettledMapKill)
}

func testSettledMapKill(t *testing.T, plain bool) {
	name, opts := mode(plain)
	const n, parts = 8000, 2
	const interval = 250 * time.Millisecond
	topic := cluster.Topic(t, "mapkill", parts)
	group := kafkatest.UniqueName("mapkill")
	produceN(t, topic, n, 64, nil)
	log := filepath.Join(t.TempDir(), "runs")
	cmd := exec.Command(os.Args[0], "-test.run=^TestSettledMapKill$", "-test.count=1")
	cmd.Env = append(os.Environ(), killChildEnv+"="+strings.Join([]string{topic, group, log, interval.String(), strconv.FormatBool(plain)}, ","),
		kafkatest.EnvBrokers+"="+strings.Join(cluster.Brokers, ","))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 60*time.Second, "the child's progress", func() bool { return len(readRuns(t, log)) >= n/2 })
	killed := time.Now()
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()
	child := readRuns(t, log)

	l := newRunLedger()
	for o := range child {
		l.succeeded(o)
	}
	l.next()
	cfg := testConfig(group, topic)
	cfg.CommitInterval = interval
	m := startMember(t, cfg, consumer.Route{Workers: 8, Retry: retryLater, Handler: func(_ context.Context, m *consumer.Message) error {
		l.succeeded(m.Origin)
		return nil
	}}, opts...)
	waitFor(t, 60*time.Second, "all the work", func() bool { u, _ := l.count(); return u >= n })
	m.stop(t)
	_, reruns := l.count()
	var firstAt, lastAt time.Time
	for _, at := range child {
		if firstAt.IsZero() || at.Before(firstAt) {
			firstAt = at
		}
		if at.After(lastAt) {
			lastAt = at
		}
	}
	t.Logf("child ran from %v to %v before the kill", killed.Sub(firstAt), killed.Sub(lastAt))
	late, tooOld := 0, 0
	cut := killed.Add(-interval - interval/2) // one interval, and the commit's round trip
	for o, at := range child {
		if at.After(cut) {
			late++
		}
		if len(l.done[o]) > 1 && !at.After(cut) {
			tooOld++
		}
	}
	t.Logf("ledger: SIGKILL, %s, %s: the child succeeded %d times before SIGKILL, %d in its last %v; %d re-runs after it (%d of work older than that; %d skipped as settled by the map)",
		cluster.Kind(), name, len(child), late, interval+interval/2, reruns, tooOld, m.src.Stats().SkippedSettled)
	if plain {
		return
	}
	if tooOld > 0 {
		t.Errorf("%d re-runs of work settled more than a commit interval before the kill", tooOld)
	}
}

// readRuns reads the child's log: partition offset unix-nanos per line.
func readRuns(t *testing.T, path string) map[dlq.Origin]time.Time {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[dlq.Origin]time.Time{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var p int32
		var off, at int64
		if _, err := fmt.Sscan(sc.Text(), &p, &off, &at); err != nil {
			continue // a line cut by the kill
		}
		o := dlq.Origin{Partition: p, Offset: off}
		if _, ok := out[o]; !ok {
			out[o] = time.Unix(0, at)
		}
	}
	return out
}

func killChild(t *testing.T) {
	args := strings.Split(os.Getenv(killChildEnv), ",")
	topic, group, path := args[0], args[1], args[2]
	interval, _ := time.ParseDuration(args[3])
	plain, _ := strconv.ParseBool(args[4])
	_, opts := mode(plain)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(group, topic)
	cfg.CommitInterval = interval
	m := startMember(t, cfg, consumer.Route{Workers: 8, Retry: retryLater, Handler: func(_ context.Context, m *consumer.Message) error {
		time.Sleep(4 * time.Millisecond) // 2,000/s: the kill comes after several commits
		if m.Origin.Offset%97 == 5 && m.Attempt == 1 {
			return errors.New("not yet") // holds its partition's commit point for 2 s
		}
		// One write per success, before the ack: the kernel has it even
		// if the process dies the next instant.
		_, err := f.WriteString(strconv.Itoa(int(m.Origin.Partition)) + " " + strconv.FormatInt(m.Origin.Offset, 10) + " " +
			strconv.FormatInt(time.Now().UnixNano(), 10) + "\n")
		return err
	}}, opts...)
	defer m.stop(t)
	time.Sleep(5 * time.Minute) // until the parent kills it
}

// TestSettledMapForeignMetadata: a commit that carries no sluice map for
// its own offset is a plain watermark. Each partition of a topic is
// committed at the same offset by a plain (simple) commit, as another
// client or a sluice from before the map leaves it: no metadata, another
// client's opaque metadata, junk behind sluice's prefix, a sluice map
// written for another offset; the consumer that starts next runs every
// record from the commit point on, skipping none. The control partition,
// committed with a map for its offset, skips exactly what the map lists:
// the test can tell the two apart.
func TestSettledMapForeignMetadata(t *testing.T) {
	const at = 40
	control := kafkaadapter.EncodeSettled(at, [2]int64{at + 5, at + 15}, [2]int64{at + 30, at + 31})
	metas := []struct{ name, meta string }{
		{"older sluice (none)", ""},
		{"another client", "AQAAAAEAAAAAAAAAAQ=="},
		{"another client's text", "host=worker-7;ts=1764730000"},
		{"junk after the prefix", "sluice:s1:!not base64!"},
		{"map of another offset", kafkaadapter.EncodeSettled(at-3, [2]int64{at + 5, at + 15})},
		{"control: map of this offset", control},
	}
	skipped := map[int64]bool{}
	for o := int64(at + 5); o < at+15; o++ {
		skipped[o] = true
	}
	skipped[at+30] = true
	ctl := len(metas) - 1
	parts := len(metas)
	topic := cluster.Topic(t, "mapforeign", parts)
	group := kafkatest.UniqueName("mapforeign")
	end := produceN(t, topic, 150*parts, 32, nil)
	commits := map[string][]kafka.OffsetCommit{}
	for p, m := range metas {
		if end[p] < at+40 {
			t.Fatalf("partition %d has %d records: too few for the test", p, end[p])
		}
		commits[topic] = append(commits[topic], kafka.OffsetCommit{Partition: p, Offset: at, Metadata: m.meta})
	}
	simpleCommit(t, group, commits)

	var mu sync.Mutex
	ran := map[dlq.Origin]int{}
	want := 0
	for p := range metas {
		want += int(end[p] - at)
	}
	want -= len(skipped)
	m := startMember(t, testConfig(group, topic), consumer.Route{Handler: func(_ context.Context, m *consumer.Message) error {
		mu.Lock()
		ran[dlq.Origin{Partition: m.Origin.Partition, Offset: m.Origin.Offset}]++
		mu.Unlock()
		return nil
	}})
	waitFor(t, 60*time.Second, "every record from the commit point on", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(ran) >= want
	})
	m.stop(t)
	mu.Lock()
	defer mu.Unlock()
	for p, meta := range metas {
		missing, extra := 0, 0
		for o := int64(0); o < end[p]; o++ {
			n := ran[dlq.Origin{Partition: int32(p), Offset: o}]
			expect := o >= at && !(p == ctl && skipped[o])
			switch {
			case expect && n == 0:
				missing++
			case !expect && n > 0:
				extra++
			}
		}
		if missing > 0 || extra > 0 {
			t.Errorf("partition %d (%s, metadata %q): %d records from the commit point on not run, %d run that should not have been",
				p, meta.name, meta.meta, missing, extra)
		}
	}
	st := m.src.Stats()
	if st.SkippedSettled != int64(len(skipped)) || st.MapsRestored != 1 {
		t.Errorf("skipped %d records in %d partition maps, want %d in 1 (the control's)", st.SkippedSettled, st.MapsRestored, len(skipped))
	}
}

// simpleCommit commits offsets for group outside any generation, as a
// tool or a standalone client does, retrying while the coordinator loads.
func simpleCommit(t *testing.T, group string, topics map[string][]kafka.OffsetCommit) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		res, err := cluster.Client().OffsetCommit(ctx, &kafka.OffsetCommitRequest{GroupID: group, GenerationID: -1, Topics: topics})
		if err == nil {
			for _, ps := range res.Topics {
				for _, p := range ps {
					if p.Error != nil && err == nil {
						err = p.Error
					}
				}
			}
		}
		var kerr kafka.Error
		if err == nil {
			return
		}
		if !errors.As(err, &kerr) || !kerr.Temporary() || ctx.Err() != nil {
			t.Fatalf("commit: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
