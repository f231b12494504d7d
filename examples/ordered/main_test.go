package main

import (
	"bytes"
	"testing"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/consumer"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The example's claim, as a test: every event is applied under each
// ordering; ByKey and ByPartition apply none out of order, Unordered does
// (its failed events come back after later ones), and ByKey is several
// times faster than ByPartition.
func TestOrderings(t *testing.T) {
	var out bytes.Buffer
	results, err := run(&out)
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
	if by[consumer.ByKey].took*2 > by[consumer.ByPartition].took {
		t.Errorf("ByKey took %v, ByPartition %v: no parallelism", by[consumer.ByKey].took, by[consumer.ByPartition].took)
	}
}
