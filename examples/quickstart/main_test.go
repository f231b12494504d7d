package main

import (
	"bytes"
	"testing"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/demo"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The README's main job, as a test: it runs to the end and its table shows
// every order settled, the poison ones dead-lettered, the window kept, and
// orders not starved by reports.
func TestRunsTheStory(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	demo.CheckStory(t, out.String(), numOrders, numPoison)
}
