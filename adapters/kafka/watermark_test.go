package kafkaadapter_test

import (
	"errors"
	"math/rand/v2"
	"testing"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/consumer"
)

func TestWatermarkRandomOrder(t *testing.T) {
	w := kafkaadapter.NewWatermark()
	if _, ok := w.Point(); ok {
		t.Fatal("point before any delivery")
	}
	// Offsets with gaps (compaction, transaction markers).
	var offs []int64
	for o := int64(100); len(offs) < 5000; o += 1 + int64(rand.IntN(3)) {
		offs = append(offs, o)
		if !w.Deliver(o) {
			t.Fatalf("deliver %d refused", o)
		}
	}
	if w.Deliver(offs[10]) {
		t.Fatal("an offset below the last delivered one was accepted")
	}
	settled := map[int64]bool{}
	last := int64(-1)
	for _, i := range rand.Perm(len(offs)) {
		if !w.Settle(offs[i]) {
			t.Fatalf("settle %d refused", offs[i])
		}
		settled[offs[i]] = true
		if off, ok := w.Commit(); ok {
			if off <= last {
				t.Fatalf("commit went back: %d after %d", off, last)
			}
			for _, o := range offs {
				if o >= off {
					break
				}
				if !settled[o] {
					t.Fatalf("commit point %d passes unsettled %d", off, o)
				}
			}
			w.Committed(off)
			last = off
		}
	}
	if w.Settle(offs[0]) {
		t.Fatal("second settle accepted")
	}
	if p, _ := w.Point(); p != offs[len(offs)-1]+1 || w.Pending() != 0 {
		t.Fatalf("final point %d pending %d", p, w.Pending())
	}
	if w.LastCommitted() != offs[len(offs)-1]+1 {
		t.Fatalf("last committed %d", w.LastCommitted())
	}
}

func TestConfigValidation(t *testing.T) {
	cfg := testConfig("g", "t")
	src, err := kafkaadapter.NewSource(cfg)
	if err != nil {
		t.Fatal(err)
	}
	limits := consumer.RouteLimits{Route: "a", Messages: 8, Bytes: 1 << 20}
	if _, err := src.Attach(limits); err != nil {
		t.Fatal(err)
	}
	if _, err := src.Attach(limits); err != nil {
		t.Fatalf("the same route attaching again (a retried New): %v", err)
	}
	other := limits
	other.Route = "b"
	if _, err := src.Attach(other); !errors.Is(err, consumer.ErrInvalidOption) {
		t.Fatalf("a second route attached the same Source: %v", err)
	}
	_ = src.Close()
	cfg = testConfig("g", "t")
	cfg.RetryTopic = "t"
	if _, err := kafkaadapter.NewSource(cfg); err == nil {
		t.Fatal("retry topic equal to a source topic accepted")
	}
}
