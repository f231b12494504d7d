package fleet_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/internal/fleet"
)

// downstream is a service the whole fleet calls: it runs at most limit
// calls at once, each taking cost, and refuses the rest at once with 503.
type downstream struct {
	limit    int64
	cost     time.Duration
	running  atomic.Int64
	mu       sync.Mutex
	accepted map[string]int
	refused  map[string]int
}

func (d *downstream) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	inst := r.URL.Query().Get("instance")
	if d.running.Add(1) > d.limit {
		d.running.Add(-1)
		d.count(d.refused, inst)
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	time.Sleep(d.cost) // the call's work
	d.running.Add(-1)
	d.count(d.accepted, inst)
}

func (d *downstream) count(m map[string]int, inst string) {
	d.mu.Lock()
	m[inst]++
	d.mu.Unlock()
}

// totals returns the calls accepted and refused so far, and the accepted
// ones per instance.
func (d *downstream) totals() (acc, ref int, per map[string]int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	per = map[string]int{}
	for k, v := range d.accepted {
		acc += v
		per[k] = v
	}
	for _, v := range d.refused {
		ref += v
	}
	return acc, ref, per
}

// TestFleetOverload: four instances share a downstream that takes 6 calls
// at once (750 calls/s at 8 ms) and refuses the rest; together they could
// make 16 at once. Without overload control the fleet keeps offering its
// 16 and most calls are refused; with each instance's own AdaptiveLimit
// (and Throttle) reading only its own refusals, the fleet backs off to
// about what the downstream takes, with no coordination between the
// instances.
func TestFleetOverload(t *testing.T) {
	p := runPlan(t)
	bin := buildMember(t)
	tg := natsTarget(t)
	ds := &downstream{limit: 6, cost: cost, accepted: map[string]int{}, refused: map[string]int{}}
	srv := httptest.NewServer(ds)
	defer srv.Close()
	dest := tg.create(t, "fleet-overload")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	const backlog = 40000
	if err := tg.produce(ctx, dest, 0, backlog); err != nil {
		t.Fatal(err)
	}
	capacityDS := float64(ds.limit) / cost.Seconds()
	type result struct {
		accepted, refused, limits float64
		share                     string
	}
	results := map[string]result{}
	modes := []struct {
		name  string
		flags []string
	}{
		{"none", nil},
		{"adaptive", []string{"-adaptive"}},
		{"throttle", []string{"-throttle"}},
		{"adaptive+throttle", []string{"-adaptive", "-throttle"}},
	}
	for _, m := range modes {
		durable := kafkatest.UniqueName("overload")
		args := append(tg.args(dest, durable), "-downstream", srv.URL)
		f := &fleet.Fleet{Bin: bin, Args: append(args, m.flags...), LogDir: t.TempDir()}
		for range 4 {
			if _, err := f.Start(); err != nil {
				t.Fatal(err)
			}
		}
		for _, pr := range f.All() {
			if err := pr.Ready(ctx); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(3 * time.Second) // warm-up: the limits find their level
		a0, r0, per0 := ds.totals()
		start := time.Now()
		var limitSum, samples float64
		for time.Since(start) < p.measure {
			time.Sleep(250 * time.Millisecond) // one sample of every instance's limit
			for _, pr := range f.All() {
				limitSum += float64(min(pr.Window().Limit, workers)) // it runs at most Workers at once
			}
			samples++
		}
		a1, r1, per1 := ds.totals()
		secs := time.Since(start).Seconds()
		_, broker, _ := tg.settled(ctx, dest, durable) // what the durable holds: ack-pending counts nak'd messages waiting out their delay
		stopAll(t, f)
		var shares []string
		for _, pr := range f.All() {
			id := fmt.Sprint(pr.ID)
			shares = append(shares, fmt.Sprintf("%.0f", float64(per1[id]-per0[id])/secs))
		}
		res := result{accepted: float64(a1-a0) / secs, refused: float64(r1-r0) / secs, limits: limitSum / samples, share: strings.Join(shares, "/")}
		results[m.name] = res
		t.Logf("overload control %-18s accepted %4.0f calls/s (%.0f%% of the downstream's %.0f), refused %5.0f/s (%.2f per accepted); concurrency the instances allowed themselves, summed: %.1f (downstream: %d); accepted per instance %s; durable: %s",
			m.name, res.accepted, 100*res.accepted/capacityDS, capacityDS, res.refused, res.refused/res.accepted, res.limits, ds.limit, res.share, broker)
	}
	none, ad := results["none"], results["adaptive"]
	if ad.refused/ad.accepted > none.refused/none.accepted/2 {
		t.Errorf("AdaptiveLimit per instance: %.2f refused per accepted call, without it %.2f: want at most half", ad.refused/ad.accepted, none.refused/none.accepted)
	}
	if ad.limits < 0.5*float64(ds.limit) || ad.limits > 2*float64(ds.limit) {
		t.Errorf("AdaptiveLimit per instance: the instances allowed themselves %.1f calls at once together; the downstream takes %d", ad.limits, ds.limit)
	}
	if ad.accepted == 0 {
		t.Error("AdaptiveLimit per instance: nothing accepted")
	}
}
