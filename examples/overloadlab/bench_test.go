package main

import (
	"context"
	"slices"
	"testing"
	"time"
)

// BenchmarkIsolation is the lab's isolation check as a benchmark: each
// iteration runs a CRITICAL orders route at half its nominal capacity next
// to a SHEDDABLE reports route, once with reports idle and once with every
// report handler stuck, on the embedded NATS server, 3 s each, interleaved.
// It reports the median p99 of the orders in both phases and their ratio
// (the target: at most 1.2, or within +2 ms).
//
//	go test ./examples/overloadlab -run '^$' -bench Isolation -benchtime 3x
func BenchmarkIsolation(b *testing.B) {
	cfg, err := parseFlags([]string{"-iso-duration", "3s"}, nil)
	if err != nil {
		b.Fatal(err)
	}
	br, err := newBroker("nats", "", false, cfg.payload)
	if err != nil {
		b.Fatal(err)
	}
	defer br.close()
	rate := cfg.isoLoad * float64(cfg.workers) / cfg.cost.Seconds()
	var idle, stuck []time.Duration
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		for _, s := range []bool{false, true} {
			row, err := isoTrial(ctx, br, cfg, rate, s, i)
			if err != nil {
				b.Fatal(err)
			}
			if s {
				stuck = append(stuck, row.p99)
			} else {
				idle = append(idle, row.p99)
			}
		}
	}
	med := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)/2]) / float64(time.Millisecond)
	}
	mi, ms := med(idle), med(stuck)
	b.ReportMetric(mi, "idle-p99-ms")
	b.ReportMetric(ms, "stuck-p99-ms")
	b.ReportMetric(ms/mi, "stuck/idle")
}
