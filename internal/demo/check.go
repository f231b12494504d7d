package demo

import (
	"regexp"
	"strconv"
	"strings"
	"testing"
)

var ordersLine = regexp.MustCompile(`(?m)^orders\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)/(\d+)`)

// CheckStory fails tb unless out, an example's printed table, shows the
// story ending well: every one of orders orders settled (succeeded,
// expired or dead-lettered) with poison of them in the DLQ and some
// expired, the orders route within its window, and finished before the
// reports route.
func CheckStory(tb testing.TB, out string, orders, poison int) {
	tb.Helper()
	if !strings.Contains(out, "orders finished in") || !strings.Contains(out, "not starved") {
		tb.Fatalf("orders did not finish before reports:\n%s", out)
	}
	// orders fetched succeeded expired retried dead-lettered goodput peak/window
	m := ordersLine.FindStringSubmatch(out)
	if m == nil {
		tb.Fatalf("no orders line:\n%s", out)
	}
	n := make([]int, len(m))
	for i := 1; i < len(m); i++ {
		n[i], _ = strconv.Atoi(m[i])
	}
	if n[1] != orders || n[5] != poison || n[2]+n[3]+n[5] != orders || n[3] == 0 {
		tb.Fatalf("orders line %q: want %d fetched, all settled, %d dead letters, some expired", m[0], orders, poison)
	}
	if n[7] > n[8] {
		tb.Fatalf("peak %d above window %d", n[7], n[8])
	}
}
