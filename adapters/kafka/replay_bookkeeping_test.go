package kafkaadapter_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/dlq"
)

// flakyTarget passes batches to the real target, refusing the letters
// whose value is in down (a transient error: the run stops).
type flakyTarget struct {
	real *kafkaadapter.ReplayTarget
	down map[string]bool
}

func (f *flakyTarget) Publish(ctx context.Context, m *dlq.Outgoing) error {
	return f.PublishBatch(ctx, []*dlq.Outgoing{m})[0]
}

func (f *flakyTarget) PublishBatch(ctx context.Context, ms []*dlq.Outgoing) []error {
	errs := make([]error, len(ms))
	var pass []*dlq.Outgoing
	var at []int
	for i, m := range ms {
		if f.down[string(m.Value)] {
			errs[i] = errors.New("injected: not enough replicas")
			continue
		}
		pass, at = append(pass, m), append(at, i)
	}
	if len(pass) > 0 {
		if res := f.real.PublishBatch(ctx, pass); res != nil {
			for j, e := range res {
				errs[at[j]] = e
			}
		}
	}
	return errs
}

// TestKafkaReplayResumeDoesNotRepeatConfirmed (issue 12.6): one letter of
// a batch fails and the run stops; the letters after it that the target
// confirmed are not republished by the resumed pass, although the failed
// one holds the partition's committed offset back (they travel in the
// commit's metadata).
func TestKafkaReplayResumeDoesNotRepeatConfirmed(t *testing.T) {
	const n = 8
	dlqTopic := cluster.Topic(t, "dlq", 1)
	origin := cluster.Topic(t, "orders", 3)
	seedLetters(t, dlqTopic, origin, n, permanent)
	group := "replay-" + dlqTopic
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rp, _ := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{origin}, Rate: math.Inf(1), Burst: n, Attempts: 1})
	src := newLetterSource(t, dlqTopic, group)
	rep, err := rp.Run(ctx, src, &flakyTarget{real: newTarget(t), down: map[string]bool{"2": true}})
	closeSource(t, src)
	if !errors.Is(err, dlq.ErrPublish) || rep.Replayed != n-1 {
		t.Fatalf("first pass: %+v %v", rep, err)
	}
	again := newLetterSource(t, dlqTopic, group)
	rep, err = rp.Run(ctx, again, newTarget(t))
	closeSource(t, again)
	if err != nil || rep.Replayed != 1 {
		t.Fatalf("resumed pass: %+v %v, want only the failed letter replayed", rep, err)
	}
	lost, dups := countValues(readTopic(t, origin), n)
	if lost != 0 || dups != 0 {
		t.Fatalf("origin topic: %d lost, %d duplicated", lost, dups)
	}
	third := newLetterSource(t, dlqTopic, group)
	defer closeSource(t, third)
	if third.Remaining() != 0 {
		t.Fatalf("a third pass still has %d letters", third.Remaining())
	}
}
