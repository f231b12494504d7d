package sluicetest_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/sluicetest"
)

func fetch(t *testing.T, src *sluicetest.Source, n int, bytes int64) []*consumer.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	msgs, err := src.Fetch(ctx, n, bytes)
	if err != nil {
		t.Fatalf("Fetch: %v", err)
	}
	return msgs
}

func settle(t *testing.T, m *consumer.Message, op consumer.SettleOp, delay time.Duration) {
	t.Helper()
	if err := sluicetest.Settle(context.Background(), m, consumer.Settlement{Op: op, Delay: delay}); err != nil {
		t.Fatalf("Settle: %v", err)
	}
}

func TestFetchHonoursCountAndBytes(t *testing.T) {
	src := sluicetest.NewSource()
	for _, id := range []string{"a", "b", "c"} {
		src.PublishSized(id, nil, nil, time.Time{}, 10)
	}
	src.PublishSized("big", nil, nil, time.Time{}, 100)
	if got := fetch(t, src, 2, 1000); len(got) != 2 {
		t.Fatalf("count bound: got %d messages, want 2", len(got))
	}
	// 25 bytes hold c (10) but not big (100) behind it.
	if got := fetch(t, src, 10, 25); len(got) != 1 || string(got[0].Key) != "c" {
		t.Fatalf("byte bound: got %d messages", len(got))
	}
	// A message larger than the byte bound travels alone, so it is never stuck.
	if got := fetch(t, src, 10, 25); len(got) != 1 || string(got[0].Key) != "big" {
		t.Fatalf("oversized message: got %d messages", len(got))
	}
	asks := src.Asks()
	if len(asks) != 3 || asks[1] != (sluicetest.Ask{Messages: 10, Bytes: 25}) {
		t.Fatalf("asks: %+v", asks)
	}
}

func TestLedgerRecordsViolations(t *testing.T) {
	src := sluicetest.NewSource()
	src.Publish("m", nil, nil, time.Time{})
	m := fetch(t, src, 1, 1<<20)[0]
	settle(t, m, consumer.SettleAck, 0)
	settle(t, m, consumer.SettleAck, 0) // a second settlement of the same delivery
	ledger, violations := src.Ledger()
	if ledger["m"].Acks != 2 || !ledger["m"].Settled() || ledger["m"].Pending {
		t.Fatalf("ledger: %+v", ledger["m"])
	}
	if len(violations) != 1 || !strings.Contains(violations[0], "settled twice") {
		t.Fatalf("violations: %q", violations)
	}
}

func TestNakRedeliversWithAttempt(t *testing.T) {
	src := sluicetest.NewSource()
	src.RedeliverFirst = true
	src.Publish("a", nil, nil, time.Time{})
	src.Publish("b", nil, nil, time.Time{})
	a := fetch(t, src, 1, 1<<20)[0]
	settle(t, a, consumer.SettleNak, 0)
	// RedeliverFirst: the nak'd message comes back ahead of b.
	again := fetch(t, src, 1, 1<<20)[0]
	if string(again.Key) != "a" || again.Attempt != 2 {
		t.Fatalf("redelivery: key %q attempt %d, want a / 2", again.Key, again.Attempt)
	}
	settle(t, again, consumer.SettleTerm, 0)
	ledger, violations := src.Ledger()
	if r := ledger["a"]; r.Deliveries != 2 || r.Naks != 1 || r.Terms != 1 || r.Dropped {
		t.Fatalf("ledger: %+v", r)
	}
	if len(violations) != 0 {
		t.Fatalf("violations: %q", violations)
	}
}

func TestHonorDelayHoldsTheRedelivery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		src.HonorDelay = true
		src.Publish("m", nil, nil, time.Time{})
		settle(t, fetch(t, src, 1, 1<<20)[0], consumer.SettleNak, time.Second)
		time.Sleep(999 * time.Millisecond)
		if q := src.Queued(); q != 0 {
			t.Fatalf("queued %d before the nak's delay passed", q)
		}
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if q := src.Queued(); q != 1 {
			t.Fatalf("queued %d after the delay, want 1", q)
		}
	})
}

func TestConfirmManual(t *testing.T) {
	src := sluicetest.NewSource()
	src.Confirm = sluicetest.ConfirmManual
	for _, id := range []string{"a", "b"} {
		src.Publish(id, nil, nil, time.Time{})
	}
	msgs := fetch(t, src, 2, 1<<20)
	settle(t, msgs[0], consumer.SettleAck, 0)
	if src.Awaiting() != 1 || src.Settled() != 0 {
		t.Fatalf("before confirmation: awaiting %d settled %d", src.Awaiting(), src.Settled())
	}
	if n := src.ConfirmPending(nil); n != 1 || src.Settled() != 1 {
		t.Fatalf("confirmed %d, settled %d", n, src.Settled())
	}
	// A refused settlement is dropped: the broker redelivers the message.
	settle(t, msgs[1], consumer.SettleAck, 0)
	if n := src.ConfirmPending(errors.New("broker refused")); n != 1 {
		t.Fatalf("confirmed %d", n)
	}
	again := fetch(t, src, 1, 1<<20)[0]
	if string(again.Key) != "b" || again.Attempt != 2 || src.Settled() != 1 {
		t.Fatalf("after a refused ack: key %q attempt %d settled %d", again.Key, again.Attempt, src.Settled())
	}
}

func TestFetchFailuresAndClose(t *testing.T) {
	src := sluicetest.NewSource()
	boom := errors.New("broker down")
	src.FailFetches(func(n int) error {
		if n == 1 {
			return boom
		}
		return nil
	})
	src.Publish("m", nil, nil, time.Time{})
	if _, err := src.Fetch(context.Background(), 1, 1<<20); !errors.Is(err, boom) {
		t.Fatalf("first fetch: %v, want %v", err, boom)
	}
	src.Close()
	if got := fetch(t, src, 1, 1<<20); len(got) != 1 {
		t.Fatalf("closed source still hands out what it holds: got %d", len(got))
	}
	if _, err := src.Fetch(context.Background(), 1, 1<<20); !errors.Is(err, consumer.ErrClosed) {
		t.Fatalf("empty closed source: %v, want ErrClosed", err)
	}
}

func TestSinkFailWith(t *testing.T) {
	var sink sluicetest.Sink
	down := errors.New("dlq down")
	sink.FailWith(func(*dlq.Letter) error { return down })
	if err := sink.Write(context.Background(), &dlq.Letter{}); !errors.Is(err, down) {
		t.Fatalf("Write: %v", err)
	}
	sink.FailWith(nil)
	if err := sink.Write(context.Background(), &dlq.Letter{}); err != nil {
		t.Fatalf("Write: %v", err)
	}
	if sink.Writes() != 2 || len(sink.Letters()) != 1 {
		t.Fatalf("writes %d letters %d, want 2 / 1", sink.Writes(), len(sink.Letters()))
	}
}

func TestRunUntilReportsTheLimit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		src := sluicetest.NewSource()
		c, err := consumer.New(consumer.Options{}, consumer.Route{Name: "r", Source: src,
			Handler: func(context.Context, *consumer.Message) error { return nil }})
		if err != nil {
			t.Fatal(err)
		}
		_, err = sluicetest.RunUntil(context.Background(), c, time.Second, func([]consumer.RouteStats) bool { return false })
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("RunUntil: %v, want DeadlineExceeded", err)
		}
	})
}
