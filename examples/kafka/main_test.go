package main

import (
	"bytes"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The README's main job, as a test: it runs to the end, every order is
// settled (succeeded, expired or dead-lettered) with the poison ones in the
// DLQ, the orders route finishes before the reports route, and no route
// exceeds its window.
func TestRunsTheStory(t *testing.T) {
	var out bytes.Buffer
	if err := run(&out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	text := out.String()
	t.Log("\n" + text)
	if !strings.Contains(text, "orders finished in") || !strings.Contains(text, "not starved") {
		t.Fatal("orders did not finish before reports")
	}
	// orders fetched succeeded expired retried dead-lettered goodput peak/window
	m := regexp.MustCompile(`(?m)^orders\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)/(\d+)`).FindStringSubmatch(text)
	if m == nil {
		t.Fatal("no orders line")
	}
	if m[1] != "3000" || m[5] != "10" || atoi(m[2])+atoi(m[3])+atoi(m[5]) != 3000 || atoi(m[3]) == 0 {
		t.Fatalf("orders line %q: want 3000 fetched, all settled, 10 dead letters, some expired", m[0])
	}
	if atoi(m[7]) > atoi(m[8]) {
		t.Fatalf("peak %s above window %s", m[7], m[8])
	}
}

func atoi(s string) int {
	n, _ := strconv.Atoi(s)
	return n
}
