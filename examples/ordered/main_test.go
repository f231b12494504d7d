package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/consumer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The example's claim, as a test: every event is applied under each
// ordering; ByKey and ByPartition apply none out of order, Unordered does
// (its failed events come back after later ones), ByPartition runs one
// event at a time and ByKey runs accounts in parallel. The parallelism is
// judged by the handler runs that overlapped, not by timing: "ByKey at
// least twice as fast as ByPartition" is a ratio of two wall-clock runs,
// which a loaded machine (other work starting between the two) can bend
// either way. The times are logged.
func TestOrderings(t *testing.T) {
	// A bound for a broken run, not a pace: ByPartition applies the 3,000
	// events one at a time, and each 1 ms sleep took over 15 ms on a loaded
	// machine (the example's own 60 s ran out there).
	ctx, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	var out bytes.Buffer
	results, err := run(ctx, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	by := map[consumer.Ordering]result{}
	for _, r := range results {
		by[r.ordering] = r
		if r.applied != events || r.retries == 0 {
			t.Errorf("%s: applied %d of %d events, %d retries", r.ordering, r.applied, events, r.retries)
		}
	}
	if by[consumer.ByKey].outOfOrder != 0 || by[consumer.ByPartition].outOfOrder != 0 {
		t.Errorf("an ordered route applied events out of order: %+v", results)
	}
	if by[consumer.Unordered].outOfOrder == 0 {
		t.Errorf("the unordered route applied every event in order: the example shows nothing")
	}
	if p := by[consumer.ByPartition].peak; p != 1 {
		t.Errorf("ByPartition ran %d events at once, want one at a time", p)
	}
	if p := by[consumer.ByKey].peak; p < 2 {
		t.Errorf("ByKey ran at most %d event at once (ByKey took %v, ByPartition %v): no parallelism",
			p, by[consumer.ByKey].took, by[consumer.ByPartition].took)
	}
}
