package fleet_test

import (
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/fleet"
)

// The ledger tells lost messages from duplicates, and each duplicate's
// cause from what happened to the instance that handled it before.
func TestLedgerCauses(t *testing.T) {
	t0 := time.Unix(1000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	l := fleet.NewLedger()
	l.Produced(8)
	// Instance 0 is killed at 1000 ms: id 0 was settled long before (no
	// duplicate), id 1 settled 500 ms before the kill (within the commit
	// lag: handled again), id 2 handled but not settled (in flight).
	l.Handled(0, 0, 1, at(100))
	l.Settled(0, 0, at(100))
	l.Handled(0, 1, 1, at(500))
	l.Settled(0, 1, at(500))
	l.Handled(0, 2, 1, at(990))
	l.Ended(0, fleet.Killed, at(1000))
	l.Handled(1, 1, 1, at(7000))
	l.Settled(1, 1, at(7000))
	l.Handled(1, 2, 2, at(7000)) // NATS: the second delivery
	l.Settled(1, 2, at(7000))
	// Instance 2 stops gracefully at 2000 ms; id 3 comes again after it.
	l.Handled(2, 3, 1, at(1500))
	l.Settled(2, 3, at(1500))
	l.Ended(2, fleet.Terminated, at(2000))
	l.Handled(1, 3, 1, at(2500))
	l.Settled(1, 3, at(2500))
	// Instance 1 handles id 4 twice while alive (a revoked partition).
	l.Handled(1, 4, 1, at(3000))
	l.Handled(1, 4, 1, at(3100))
	l.Settled(1, 4, at(3100))
	// id 5 is handled, never settled; 6 and 7 are lost.
	l.Handled(1, 5, 1, at(3200))
	// A line about an id never produced.
	l.Handled(1, 9, 1, at(3300))

	if got := l.Missing(); got != 2 {
		t.Errorf("Missing = %d, want 2", got)
	}
	r := l.Report(fleet.Bounds{Window: 1, CommitLag: 700 * time.Millisecond})
	t.Log("\n" + r.String())
	if r.NumLost != 2 || len(r.Lost) != 2 || r.Lost[0] != 6 || r.Lost[1] != 7 {
		t.Errorf("lost %d %v, want ids 6 and 7", r.NumLost, r.Lost)
	}
	if r.Unique != 6 || r.Unsettled != 1 || r.Unknown != 1 {
		t.Errorf("unique %d, unsettled %d, unknown %d; want 6, 1, 1", r.Unique, r.Unsettled, r.Unknown)
	}
	want := map[fleet.Cause]int{fleet.CauseKillInFlight: 1, fleet.CauseKillSettled: 1, fleet.CauseGraceful: 1, fleet.CauseLive: 1}
	for c, n := range want {
		if r.ByCause[c] != n {
			t.Errorf("%s: %d duplicates, want %d", c, r.ByCause[c], n)
		}
	}
	if r.Redelivered != 1 {
		t.Errorf("%d handled on a redelivery, want 1", r.Redelivered)
	}
	if r.Duplicates != 4 {
		t.Errorf("%d duplicates, want 4", r.Duplicates)
	}
	// The kill's bound: the window (1) plus what it settled within the
	// commit lag (id 1 at 500 ms, not id 0 at 100 ms): 2, and it caused 2.
	if len(r.Kills) != 1 || r.Kills[0].Bound != 2 || r.Kills[0].InFlight != 1 || r.Kills[0].SettledLate != 1 {
		t.Errorf("kills %+v, want one with bound 2, 1 in flight, 1 settled late", r.Kills)
	}
	if len(r.OverBound) != 0 {
		t.Errorf("over bound: %+v", r.OverBound)
	}

	// Without the commit lag (NATS: a settled message is never redelivered)
	// the same kill is over its bound.
	if r := l.Report(fleet.Bounds{Window: 1}); len(r.OverBound) != 1 {
		t.Errorf("without commit lag: over bound %+v, want the kill", r.OverBound)
	}
}
