package consumer_test

import (
	"testing"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/sluicetest"
)

// maxCoreAllocs is what the core path may allocate per message in steady
// state: nothing per message; a few allocations per fetched batch or timer
// tick amortised over it (a round is 2,000 messages).
const maxCoreAllocs = 0.05

// TestCorePathAllocatesNothingPerMessage guards the consumer's own path
// (window, queue, workers, settlement) against an allocation per message:
// one added anywhere on it makes the average 1 or more. (A message with a
// deadline still costs its handler's context.WithDeadline: 4 allocations.)
func TestCorePathAllocatesNothingPerMessage(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	for _, tc := range []struct {
		name string
		opts consumer.Options
	}{{"plain", consumer.Options{}}, {"hook", consumer.Options{Hook: nopHook{}}}} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := sluicetest.AllocsPerMessage(tc.opts, nil, nil, 20, 2000)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%.4f allocs/message", got)
			if got > maxCoreAllocs {
				t.Fatalf("core path allocates %.3f times per message, want at most %.2f", got, maxCoreAllocs)
			}
		})
	}
}
