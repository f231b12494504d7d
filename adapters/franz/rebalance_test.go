package franzadapter_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	franzadapter "github.com/sluice-go/sluice/adapters/franz"
	"github.com/sluice-go/sluice/consumer"
)

// A second member joins while the first works through a backlog: the
// first is revoked the partitions that move (with kgo's default
// cooperative-sticky balancer only those; with an eager balancer all of
// them, then reassigned), commits them, and every message is handled;
// settled work is not handed to the new owner again beyond what was in
// flight.
func TestRebalanceHandsOver(t *testing.T) {
	for _, c := range []struct {
		name     string
		balancer kgo.GroupBalancer
		keepsAll bool // the first member keeps partitions across the rebalance
	}{{"cooperative-sticky", kgo.CooperativeStickyBalancer(), true}, {"eager-range", kgo.RangeBalancer(), false}} {
		t.Run(c.name, func(t *testing.T) {
			const n = 400
			topic := newTopic(t, "rebalance", 4)
			produce(t, topic, values(n, 10), false)
			group := uniqueName("rebalance")
			var mu sync.Mutex
			seen := map[string]int{}
			all := make(chan struct{})
			handler := func(ctx context.Context, m *consumer.Message) error {
				time.Sleep(2 * time.Millisecond)
				mu.Lock()
				seen[string(m.Value)]++
				if len(seen) == n {
					select {
					case <-all:
					default:
						close(all)
					}
				}
				mu.Unlock()
				return nil
			}
			member := func() (*franzadapter.Source, *consumer.Consumer) {
				src, err := franzadapter.NewSource(franzadapter.Config{CommitInterval: 100 * time.Millisecond},
					append(groupOpts(group, topic), kgo.Balancers(c.balancer))...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { _ = src.Close() })
				cons, err := consumer.New(consumer.Options{}, consumer.Route{Name: "rebalance", Source: src, Workers: 2,
					Window: consumer.WindowPolicy{Messages: 16, Bytes: 1 << 20}, Handler: handler})
				if err != nil {
					t.Fatal(err)
				}
				return src, cons
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var wg sync.WaitGroup
			run := func(cons *consumer.Consumer) {
				wg.Add(1)
				go func() {
					defer wg.Done()
					if err := cons.Run(ctx); err != nil {
						t.Error(err)
					}
				}()
			}
			a, ca := member()
			run(ca)
			waitFor(t, 30*time.Second, func() bool { mu.Lock(); defer mu.Unlock(); return len(seen) >= 40 })
			b, cb := member()
			run(cb)
			waitFor(t, 60*time.Second, func() bool { return len(a.Assigned()[topic]) > 0 && len(b.Assigned()[topic]) > 0 })
			select {
			case <-all:
			case <-time.After(60 * time.Second):
				mu.Lock()
				t.Fatalf("handled %d of %d", len(seen), n)
			}
			cancel()
			wg.Wait()
			sa, sb := a.Stats(), b.Stats()
			if sa.Revokes == 0 {
				t.Fatalf("the first member was never revoked a partition: %+v", sa)
			}
			if c.keepsAll && sa.Revokes >= 4 {
				t.Fatalf("cooperative rebalancing revoked %d partitions of 4 from the first member", sa.Revokes)
			}
			dups := 0
			mu.Lock()
			for _, k := range seen {
				dups += k - 1
			}
			mu.Unlock()
			// Only what was handed out or buffered when the partitions moved
			// may run twice: at most a window plus a commit interval's work.
			if dups > 16+64 {
				t.Fatalf("%d messages handled twice", dups)
			}
			t.Logf("first member: %d revokes, %d stale settlements, %d dropped; second: %d assignments; %d duplicates",
				sa.Revokes, sa.StaleSettles, sa.Dropped, sb.Assignments, dups)
		})
	}
}

func waitFor(t *testing.T, d time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
