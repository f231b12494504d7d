package fleet_test

import (
	"fmt"
	"time"

	"github.com/sluice-go/sluice/internal/fleet"
)

// A ledger of two instances: the first is killed after handling message 1
// and before settling it, so the second handles it again.
func ExampleLedger() {
	now := time.Now()
	l := fleet.NewLedger()
	l.Produced(3)
	l.Handled(0, 0, 1, now)
	l.Settled(0, 0, now)
	l.Handled(0, 1, 1, now)
	l.Ended(0, fleet.Killed, now.Add(time.Millisecond))
	for id := 1; id < 3; id++ {
		l.Handled(1, id, 1, now.Add(time.Second))
		l.Settled(1, id, now.Add(time.Second))
	}
	r := l.Report(fleet.Bounds{Window: 16})
	fmt.Printf("lost %d, duplicates %d (%s: %d)\n", r.NumLost, r.Duplicates, fleet.CauseKillInFlight, r.ByCause[fleet.CauseKillInFlight])
	// Output: lost 0, duplicates 1 (kill, in flight: 1)
}
