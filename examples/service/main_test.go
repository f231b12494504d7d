package main

import (
	"bytes"
	"context"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/consumer"
)

// childEnv makes the test binary run main instead of the tests: the
// Prometheus test starts instances of the service as processes of their own.
const childEnv = "SLUICE_SERVICE_INSTANCE"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		main()
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

var tableLine = regexp.MustCompile(`(?m)^(\w+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)/(\d+)`)

// table parses the routes' table run prints at the end: route -> fetched,
// succeeded, expired, retried, dead-lettered, goodput, peak, window.
func table(t *testing.T, out string) map[string][8]int {
	t.Helper()
	rows := map[string][8]int{}
	for _, m := range tableLine.FindAllStringSubmatch(out, -1) {
		var r [8]int
		for i := range r {
			r[i], _ = strconv.Atoi(m[i+2])
		}
		rows[m[1]] = r
	}
	return rows
}

// One instance on its own, on the embedded NATS server and kfake (or
// $KAFKA_BROKERS): every route does work, poison orders are dead-lettered,
// failed first attempts retried, windows kept, and it stops cleanly. It runs
// until that work is done (at least 2 s, at most a minute), not for a fixed
// 4 s: under -race -cpu 1 on a busy machine 4 s fetched 166 orders, before
// the first poison one (one in 200), and the test failed.
func TestRunsAlone(t *testing.T) {
	_, url := natstest.Start(t)
	kc := kafkatest.Start(t)
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	begin := time.Now()
	done := func(s []consumer.RouteStats) bool {
		if time.Since(begin) < 2*time.Second {
			return false
		}
		for _, r := range s {
			if r.Goodput() == 0 {
				return false
			}
			if r.Name == "orders" && (r.Settled[consumer.OutcomeDeadLettered] == 0 || r.Settled[consumer.OutcomeRetried] == 0) {
				return false
			}
		}
		return len(s) == 3
	}
	err := run(ctx, &out, config{natsURL: url, brokers: kc.Brokers, rate: 400, runFor: time.Minute, until: done})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	rows := table(t, out.String())
	for _, route := range []string{"orders", "reports", "payments"} {
		r, ok := rows[route]
		if !ok {
			t.Fatalf("no %s row", route)
		}
		if r[0] == 0 || r[5] == 0 {
			t.Errorf("%s: fetched %d, goodput %d: no work done", route, r[0], r[5])
		}
		if r[6] > r[7] {
			t.Errorf("%s: peak %d above window %d", route, r[6], r[7])
		}
	}
	if o := rows["orders"]; o[4] == 0 || o[3] == 0 {
		t.Errorf("orders: %d dead-lettered, %d retried; want poison dead-lettered and first failures retried", o[4], o[3])
	}
	if !strings.Contains(out.String(), "metrics at http://") {
		t.Error("the metrics address is not printed")
	}
}

func TestBadRate(t *testing.T) {
	if err := run(context.Background(), &bytes.Buffer{}, config{rate: -1}); err == nil || !strings.Contains(err.Error(), "negative") {
		t.Fatalf("run with -rate -1: %v, want an error naming it", err)
	}
}
