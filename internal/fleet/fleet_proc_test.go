package fleet_test

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/sluice-go/sluice/internal/fleet"
)

// The Fleet runs instances as processes, reads their lines into the
// ledger and their window reports, and records how each ended: a killed
// instance is gone when Kill returns, a terminated one finishes with its
// final line.
func TestFleetProcesses(t *testing.T) {
	t.Setenv(fakeEnv, "1")
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	led := fleet.NewLedger()
	led.Produced(10)
	f := &fleet.Fleet{Bin: exe, LogDir: t.TempDir(), Ledger: led}
	a, err := f.Start()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := a.Ready(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "a's window line", func() bool { return a.Window().Limit == 16 })
	b, err := f.Start()
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, ctx, "b's window line", func() bool { return b.Window().Limit == 16 })
	if w := a.Window(); w != (fleet.Window{HookPeak: 3, RoutePeak: 2, Limit: 16, Held: 1, Gen: 7, Parts: 3}) {
		t.Errorf("a's window %+v", w)
	}
	if a.Settled() != 10 || f.Settled() != 20 || len(f.Live()) != 2 {
		t.Errorf("settled %d and %d in all, %d live; want 10, 20, 2", a.Settled(), f.Settled(), len(f.Live()))
	}
	if err := f.Kill(a); err != nil {
		t.Fatal(err)
	}
	if a.Alive() || a.End() != fleet.Killed || a.Err() == nil {
		t.Errorf("after Kill: alive %v, end %v, exit %v", a.Alive(), a.End(), a.Err())
	}
	if ok, _ := a.Exited(); ok {
		t.Error("a killed instance wrote its final line")
	}
	if err := f.StopAll(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if ok, line := b.Exited(); !ok || line != "10 10" || b.End() != fleet.Terminated || b.Err() != nil {
		t.Errorf("b: exited %v %q, end %v, exit %v", ok, line, b.End(), b.Err())
	}
	// b handled every id again while a was alive.
	r := led.Report(fleet.Bounds{Window: 16})
	if r.NumLost != 0 || r.Duplicates != 10 || r.ByCause[fleet.CauseLive] != 10 || len(r.Kills) != 1 || r.Kills[0].Bound != 16 {
		t.Errorf("report:\n%s", r)
	}
}
