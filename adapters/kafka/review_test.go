package kafkaadapter_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
)

// fetchAll fetches from src until want messages came or timeout passed,
// acking each unless keep is set, and returns them.
func fetchAll(t *testing.T, src *kafkaadapter.Source, want int, timeout time.Duration, ack bool) []*consumer.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var got []*consumer.Message
	for len(got) < want && ctx.Err() == nil {
		ms, err := src.Fetch(ctx, want-len(got), 1<<20)
		if err != nil && ctx.Err() == nil {
			t.Fatalf("fetch: %v", err)
		}
		for _, m := range ms {
			if ack {
				settle(t, m, consumer.Settlement{Op: consumer.SettleAck})
			}
		}
		got = append(got, ms...)
	}
	return got
}

// TestRetryTopicSurvivesRestart: with StartOffset LastOffset, a retry copy
// written before the group ever committed its retry partition (the copy is
// still waiting for its not-before) must come back after a restart. Before
// the fix, the new generation resolved LastOffset for the uncommitted
// retry partition again and skipped the copy, whose original was already
// committed: the message was lost.
func TestRetryTopicSurvivesRestart(t *testing.T) {
	topic := cluster.Topic(t, "rtrestart", 1)
	retryTopic := cluster.Topic(t, "rtrestart-r", 1)
	group := kafkatest.UniqueName("rtrestart")
	cfg := testConfig(group, topic)
	cfg.StartOffset = kafka.LastOffset
	cfg.RetryTopic = retryTopic
	cfg.LocalRetryMaxDelay = 10 * time.Millisecond

	src := attachedSource(t, cfg, testWindow)
	defer src.Close()
	waitFor(t, 20*time.Second, "assignment", func() bool { return len(src.Assigned()[topic]) == 1 })
	// Produce until the fetcher, which starts at the end, sees a message.
	var msgs []*consumer.Message
	for i := 0; len(msgs) == 0; i++ {
		if i == 20 {
			t.Fatal("no message fetched")
		}
		produceN(t, topic, 1, 16, nil)
		msgs = fetchAll(t, src, 1, 500*time.Millisecond, false)
	}
	const delay = 2 * time.Second
	settle(t, msgs[0], consumer.Settlement{Op: consumer.SettleNak, Delay: delay})
	if st := src.Stats(); st.RetryWrites != 1 {
		t.Fatalf("retry writes %d, want 1: %+v", st.RetryWrites, st)
	}
	end := endOffsets(t, topic)
	waitFor(t, 10*time.Second, "original committed", func() bool { return committedAll(group, topic, end) })
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}

	src2 := attachedSource(t, cfg, testWindow)
	defer src2.Close()
	got := fetchAll(t, src2, 1, 20*time.Second, true)
	if len(got) != 1 {
		t.Fatalf("the retry copy never came back after the restart (stats %+v)", src2.Stats())
	}
	if got[0].Attempt != 2 || got[0].Origin.Topic != topic || got[0].Origin.Offset != msgs[0].Origin.Offset {
		t.Fatalf("retry copy: attempt %d origin %+v, want attempt 2 of %+v", got[0].Attempt, got[0].Origin, msgs[0].Origin)
	}
}

// TestRetryHoldDoesNotBlock: retry-topic records whose not-before is far
// off must not hold the prefetch budget while they wait. Before the fix,
// each waiting retry partition kept a FetchMaxBytes reservation for the
// whole wait, so a few of them took the whole buffer and the main topic
// stopped flowing until the retries were due.
func TestRetryHoldDoesNotBlock(t *testing.T) {
	const retryParts = 4
	topic := cluster.Topic(t, "rthold", 1)
	retryTopic := cluster.Topic(t, "rthold-r", retryParts)
	group := kafkatest.UniqueName("rthold")
	notBefore := time.Now().Add(2 * time.Minute)
	var retries []kafka.Message
	for i := range retryParts {
		retries = append(retries, kafka.Message{Value: []byte("r" + strconv.Itoa(i)), Headers: []kafka.Header{
			{Key: kafkaadapter.HeaderNotBefore, Value: []byte(notBefore.UTC().Format(time.RFC3339Nano))},
			{Key: kafkaadapter.HeaderAttempt, Value: []byte("2")},
		}})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := cluster.Produce(ctx, retryTopic, retries); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(group, topic)
	cfg.RetryTopic = retryTopic
	cfg.FetchMaxBytes = 32 << 10 // two fetches fill the budget
	window := consumer.WindowPolicy{Messages: 64, Bytes: 64 << 10}
	src := attachedSource(t, cfg, window)
	waitFor(t, 20*time.Second, "assignment", func() bool { return len(src.Assigned()[retryTopic]) == retryParts })
	time.Sleep(time.Second) // the retry partitions fetch their records and wait
	const n = 20
	produceN(t, topic, n, 64, nil)
	// Before the fix the main topic stopped until the retries were due:
	// its messages must all come before that (a fixed 5 s judged the
	// machine's load, not the hold).
	got := fetchAll(t, src, n, time.Until(notBefore)-10*time.Second, true)
	st := src.Stats()
	start := time.Now()
	if err := src.Close(); err != nil {
		t.Fatal(err)
	}
	// Close must not wait for the retries' not-before either: it returns
	// before they are due. (A fixed 5 s bound judged a loaded machine's
	// Close, which leaves the group, not the wait.)
	if d := time.Since(start); !time.Now().Before(notBefore) {
		t.Errorf("Close took %v, until the retries were due", d)
	}
	if len(got) != n {
		t.Fatalf("got %d of %d main-topic messages while retries wait for their not-before (stats %+v)", len(got), n, st)
	}
	for _, m := range got {
		if m.Origin.Topic != topic {
			t.Fatalf("a retry record was handed out before its not-before: %+v", m.Origin)
		}
	}
	if st.BufferedBytes > window.Bytes {
		t.Errorf("buffered %d bytes, budget %d", st.BufferedBytes, window.Bytes)
	}
}

// TestGroupErrorSurfaces: a configuration the broker refuses at join time
// (a session timeout below its minimum) is returned by Fetch, instead of a
// Source that silently never receives anything; a heartbeat interval that
// is not below the session timeout, or a RevokeGrace not below the
// rebalance timeout, is refused by NewSource.
func TestGroupErrorSurfaces(t *testing.T) {
	topic := cluster.Topic(t, "grouperr", 1)
	cfg := testConfig(kafkatest.UniqueName("grouperr"), topic)
	cfg.HeartbeatInterval = 7 * time.Second
	if _, err := kafkaadapter.NewSource(cfg); !errors.Is(err, consumer.ErrInvalidOption) {
		t.Fatalf("heartbeat above session timeout: got %v, want ErrInvalidOption", err)
	}
	cfg.HeartbeatInterval = 100 * time.Millisecond
	cfg.RevokeGrace = cfg.RebalanceTimeout
	if _, err := kafkaadapter.NewSource(cfg); !errors.Is(err, consumer.ErrInvalidOption) {
		t.Fatalf("RevokeGrace not below RebalanceTimeout: got %v, want ErrInvalidOption", err)
	}
	cfg.RevokeGrace = 500 * time.Millisecond
	for _, bad := range []func(*kafkaadapter.Config){
		func(c *kafkaadapter.Config) { c.LocalRetryMessages = -1 },
		func(c *kafkaadapter.Config) { c.LocalRetryBytes = -1 },
	} {
		c := cfg
		bad(&c)
		if _, err := kafkaadapter.NewSource(c); !errors.Is(err, consumer.ErrInvalidOption) {
			t.Fatalf("a negative in-process retry allowance: got %v, want ErrInvalidOption", err)
		}
	}
	cfg.SessionTimeout = time.Second // below the broker's 6 s minimum
	src := attachedSource(t, cfg, testWindow)
	defer src.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for {
		_, err := src.Fetch(ctx, 1, 1<<20)
		if errors.Is(err, kafka.InvalidSessionTimeout) {
			t.Logf("Fetch: %v", err)
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("Fetch never reported the refused session timeout (last: %v)", err)
		}
	}
}
