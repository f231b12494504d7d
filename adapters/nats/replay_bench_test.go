package natsadapter_test

import (
	"math"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/dlq"
)

// BenchmarkReplayPace measures the replay pace on the embedded server: one
// replayer moves 35,000 letters at 1,000/s (about 35 s) and the target's
// stored timestamps are counted per 10 s window and per 100 ms bucket.
// Reported: worst-window-% (largest deviation of a full 10 s window from
// 10,000) and busiest-100ms-x (busiest full bucket over the mean). A
// benchmark, not a test: on a loaded machine the process can stall, and a
// stall longer than the pacer's 50 ms catch-up costs rate.
//
//	go test ./adapters/nats -run '^$' -bench ReplayPace -benchtime 1x
func BenchmarkReplayPace(b *testing.B) {
	const n, perSecond = 35000, 1000
	for range b.N {
		r := newReplayRig(b)
		r.seed(b, "pay", n, nil)
		rp, err := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{"orders.>"}, Rate: perSecond})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := rp.Run(r.ctx, r.source(b, ""), natsadapter.NewReplayTarget(r.js)); err != nil {
			b.Fatal(err)
		}
		got := r.readAll(b, "ORDERS")
		win := buckets(got, 10*time.Second)
		worst := 0.0
		for _, c := range win {
			if d := (float64(c) - 10000) / 100; math.Abs(d) > math.Abs(worst) {
				worst = d
			}
		}
		peak, _ := peakToMean(got, 100*time.Millisecond)
		b.ReportMetric(worst, "worst-window-%")
		b.ReportMetric(peak, "busiest-100ms-x")
		b.Logf("10 s windows %v, worst %+.2f%%, busiest 100 ms bucket %.2f× the mean", win, worst, peak)
	}
}

// BenchmarkReplaySpread starts 8 replayers together, each on its own DLQ
// subject at 250/s (1,250 letters each, 5 s), into one target, and reports
// the target's busiest 100 ms bucket over the mean (busiest-100ms-x).
//
//	go test ./adapters/nats -run '^$' -bench ReplaySpread -benchtime 1x
func BenchmarkReplaySpread(b *testing.B) {
	const replayers, each, perSecond = 8, 1250, 250
	for range b.N {
		r := newReplayRig(b)
		for i := range replayers {
			r.seed(b, "r"+strconv.Itoa(i), each, nil)
		}
		rp, err := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{"orders.>"}, Rate: perSecond})
		if err != nil {
			b.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, replayers)
		for i := range replayers {
			src := r.source(b, r.sink.Subject("r"+strconv.Itoa(i)))
			wg.Go(func() { _, errs[i] = rp.Run(r.ctx, src, natsadapter.NewReplayTarget(r.js)) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		got := r.readAll(b, "ORDERS")
		if len(got) != replayers*each {
			b.Fatalf("landed %d of %d", len(got), replayers*each)
		}
		peak, n := peakToMean(got, 100*time.Millisecond)
		b.ReportMetric(peak, "busiest-100ms-x")
		b.Logf("8 × 250/s: busiest 100 ms bucket %.2f× the mean over %d buckets", peak, n)
	}
}

// buckets counts stored times per full window from the first one.
func buckets(got []stored, width time.Duration) []int {
	at := make([]time.Time, len(got))
	for i, m := range got {
		at[i] = m.at
	}
	slices.SortFunc(at, func(a, b time.Time) int { return a.Compare(b) })
	n := int(at[len(at)-1].Sub(at[0]) / width)
	counts := make([]int, n)
	for _, t := range at {
		if k := int(t.Sub(at[0]) / width); k < n {
			counts[k]++
		}
	}
	return counts
}

// peakToMean returns the busiest full bucket of the stored times over the
// mean of the full buckets, and the number of buckets.
func peakToMean(got []stored, width time.Duration) (float64, int) {
	counts := buckets(got, width)
	if len(counts) == 0 {
		return math.Inf(1), 0
	}
	total := 0
	for _, c := range counts {
		total += c
	}
	return float64(slices.Max(counts)) / (float64(total) / float64(len(counts))), len(counts)
}
