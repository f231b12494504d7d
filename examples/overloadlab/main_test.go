package main

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if child, code := serveIfChild(); child {
		os.Exit(code) // the lab's NATS server process (see startServerProcess)
	}
	goleak.VerifyTestMain(m)
}

// TestSmoke runs a small lab on the embedded NATS server: at 2× and 5×
// capacity sluice's goodput must beat the unprotected consumer's and its
// handler must never start on an expired message, while the baseline
// demonstrably does.
func TestSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the lab for ~10 s")
	}
	smoke(t, "nats", "2,5")
}

// TestSmokeKafka is the same on Kafka (kfake in a child process), one step.
func TestSmokeKafka(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the lab for ~8 s")
	}
	smoke(t, "kafka", "3")
}

func smoke(t *testing.T, broker, steps string) {
	out := t.TempDir()
	cfg, err := parseFlags([]string{"-broker", broker, "-steps", steps, "-step-duration", "1500ms", "-capacity-duration", "1s",
		"-cost", "10ms", "-deadline", "250ms", "-out", out}, os.Stderr)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var log testWriter
	log.t = t
	rep, err := runLab(ctx, cfg, &log)
	if err != nil {
		t.Fatal(err)
	}
	if rep.capacity < 100 {
		t.Fatalf("capacity %.0f msg/s, want about %d", rep.capacity, 4*100)
	}
	if len(rep.steps) != len(cfg.steps) {
		t.Fatalf("%d steps, want %d", len(rep.steps), len(cfg.steps))
	}
	for _, s := range rep.steps {
		b, p := s.base, s.withSluice
		if p.goodput <= b.goodput {
			t.Errorf("%g×: sluice goodput %.0f/s not above the baseline's %.0f/s", s.load, p.goodput, b.goodput)
		}
		if p.wasted != 0 {
			t.Errorf("%g×: sluice started %d handler runs on expired messages", s.load, p.wasted)
		}
		if b.wasted == 0 {
			t.Errorf("%g×: the unprotected consumer never ran an expired message: the load did not overload it", s.load)
		}
		if p.peakInFlight > cfg.window {
			t.Errorf("%g×: sluice held %d messages, window %d", s.load, p.peakInFlight, cfg.window)
		}
		if p.expired+p.shed == 0 {
			t.Errorf("%g×: sluice neither expired nor shed anything at %g× load", s.load, s.load)
		}
	}
	for _, f := range []string{"steps.txt", "steps.png"} {
		st, err := os.Stat(filepath.Join(out, f))
		if err != nil || st.Size() == 0 {
			t.Errorf("%s not written: %v", f, err)
		}
	}
}

type testWriter struct{ t *testing.T }

func (w *testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}
