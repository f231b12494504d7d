package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
)

// The tests write into a real PostgreSQL: the one SLUICE_TEST_PG_DSN names,
// or an embedded one started once for the package. They skip only when the
// embedded server's binaries cannot be fetched, and say so.

var (
	testDSN  string
	skipWhy  string
	pgServer *embeddedPG
)

func TestMain(m *testing.M) {
	if pgChild() {
		return
	}
	testDSN = os.Getenv("SLUICE_TEST_PG_DSN")
	if testDSN == "" {
		pg, err := startPostgres(os.Stderr)
		switch {
		case errors.Is(err, ErrNoBinaries):
			skipWhy = fmt.Sprintf("SKIP: no PostgreSQL: %v", err)
		case err != nil:
			fmt.Fprintln(os.Stderr, "embedded PostgreSQL:", err)
			os.Exit(1)
		default:
			pgServer, testDSN = pg, pg.DSN
		}
	}
	code := m.Run()
	if pgServer != nil {
		if err := pgServer.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop PostgreSQL:", err)
			code = 1
		}
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func testStore(t *testing.T) *store {
	t.Helper()
	if testDSN == "" {
		t.Skip(skipWhy)
	}
	st, err := openStore(context.Background(), testDSN, 10)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(st.Close)
	return st
}

func testNATS(t *testing.T) broker {
	t.Helper()
	return natsBroker{js: natstest.JetStream(t)}
}

// check asserts that every order ended: the poison ones dead-lettered,
// the others written once and acked.
func check(t *testing.T, res result, rows int, poison uint64) {
	t.Helper()
	t.Log(res)
	if res.Rows != rows || res.Dead != poison || res.Succeeded != uint64(res.Orders)-poison || res.Expired != 0 {
		t.Fatalf("%v: want %d rows, %d dead-lettered, the rest acked", res, rows, poison)
	}
	if res.PeakHeld > res.WindowLimit {
		t.Fatalf("held %d > window %d", res.PeakHeld, res.WindowLimit)
	}
}

// The batch route writes every order once, in batches, and dead-letters
// only the orders that cannot be decoded: one poison row does not fail
// its batch.
func TestBatchRouteNATS(t *testing.T) {
	st := testStore(t)
	res, err := runOnce(context.Background(), testNATS(t), st, runConfig{Batch: true, Workers: 8}, orders("o", 3000, 100))
	if err != nil {
		t.Fatal(err)
	}
	check(t, res, 2970, 30)
	if res.Batches == 0 || res.BatchMsgs != 3000 || res.Batches >= 3000 {
		t.Fatalf("%d batches for %d messages", res.Batches, res.BatchMsgs)
	}
}

// The same route on Kafka (kfake, or $KAFKA_BROKERS).
func TestBatchRouteKafka(t *testing.T) {
	st := testStore(t)
	res, err := runOnce(context.Background(), &kafkaBroker{cl: kafkatest.Start(t)}, st, runConfig{Batch: true, Workers: 8}, orders("k", 2000, 100))
	if err != nil {
		t.Fatal(err)
	}
	check(t, res, 1980, 20)
}

// The per-message route the benchmark compares with writes the same rows.
func TestSingleRoute(t *testing.T) {
	st := testStore(t)
	res, err := runOnce(context.Background(), testNATS(t), st, runConfig{Workers: 8}, orders("s", 500, 100))
	if err != nil {
		t.Fatal(err)
	}
	check(t, res, 495, 5)
}

// A redelivered order (here: the same orders delivered twice) is written
// once: ON CONFLICT DO NOTHING through the staging table, within a batch
// and across batches.
func TestRedeliveryIsIdempotent(t *testing.T) {
	st := testStore(t)
	msgs := orders("r", 1000, 0)
	msgs = append(msgs, msgs[:300]...)
	msgs = append(msgs, msgs[500:510]...)
	res, err := runOnce(context.Background(), testNATS(t), st, runConfig{Batch: true, Workers: 8}, msgs)
	if err != nil {
		t.Fatal(err)
	}
	check(t, res, 1000, 0)
}

// Orders whose deadline has passed are settled as expired and never
// written: 0 rows for them, and no row written after its deadline.
func TestExpiredOrdersWriteNoRows(t *testing.T) {
	st := testStore(t)
	msgs := orders("e", 1000, 0)
	now := time.Now()
	for i := range msgs {
		msgs[i].Deadline = now.Add(time.Hour)
		if i%2 == 0 {
			msgs[i].Deadline = now.Add(-time.Second)
		}
	}
	res, err := runOnce(context.Background(), testNATS(t), st, runConfig{Batch: true, Workers: 8}, msgs)
	if err != nil {
		t.Fatal(err)
	}
	t.Log(res)
	written, err := st.CountIDs(context.Background(), res.ExpiredIDs)
	if err != nil {
		t.Fatal(err)
	}
	late, err := st.WrittenLate(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if res.Expired != 500 || len(res.ExpiredIDs) != 500 || written != 0 || res.Rows != 500 || late != 0 {
		t.Fatalf("%v: %d expired ids, %d of them written, %d rows written late", res, len(res.ExpiredIDs), written, late)
	}
}
