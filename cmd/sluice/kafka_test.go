package main

import (
	"context"
	"strings"
	"testing"
	"time"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/dlq"
)

// kafkaTopics are the fixture's topic names: unique, so the suite also
// runs on a shared real broker ($KAFKA_BROKERS). normalize shows them as
// dlq-000000000000 and orders-000000000000 (same length: columns hold).
type kafkaTopics struct{ dlq, orders string }

func (k kafkaTopics) normalize(s string) string {
	zero := func(name string) string {
		i := strings.LastIndexByte(name, '-')
		return name[:i+1] + strings.Repeat("0", len(name)-i-1)
	}
	return strings.NewReplacer(k.dlq, zero(k.dlq), k.orders, zero(k.orders)).Replace(s)
}

// kafkaFixture is a cluster (kfake unless $KAFKA_BROKERS) with a
// dead-letter topic holding three letters from the orders topic (two
// permanent, one replayed 3 times), and the park topic <dlq>.parked.
func kafkaFixture(t *testing.T) (string, kafkaTopics) {
	t.Helper()
	c := kafkatest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := kafkaTopics{dlq: kafkatest.UniqueName("dlq"), orders: kafkatest.UniqueName("orders")}
	for _, topic := range []string{k.dlq, k.orders, k.dlq + ".parked"} {
		if err := c.CreateTopic(ctx, topic, 1); err != nil {
			t.Fatal(err)
		}
	}
	sink, err := kafkaadapter.NewDeadLetterSink(c.Kafka(), k.dlq)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	at := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	for i, replays := range []int{0, 0, 3} {
		l := &dlq.Letter{Key: []byte("order-" + string(rune('a'+i))), Value: []byte(`{"n":` + string(rune('0'+i)) + `}`),
			Route: "orders", Class: dlq.ClassPermanent, Err: "bad order", Attempts: 1, Replays: replays,
			FirstFailure: at, LastFailure: at.Add(time.Duration(i) * time.Minute), Headers: map[string][]string{"Tenant": {"acme"}},
			Origin: dlq.Origin{Topic: k.orders, Partition: 0, Offset: int64(40 + i), Group: "orders"}}
		if err := sink.Write(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	return strings.Join(c.Brokers, ","), k
}

func TestKafkaCommands(t *testing.T) {
	brokers, topics := kafkaFixture(t)
	k := []string{"--brokers", brokers, "--topic", topics.dlq}
	for _, tc := range []struct {
		name, cmd string
		code      int
	}{
		{"kafka_ls", "ls --letters", 0},
		{"kafka_show", "show 0/1", 0},
		{"kafka_replay_dry_run", "replay --dry-run --allow " + topics.orders, exitPartial},
	} {
		out, errOut, code := run(t, append(append([]string{"dlq"}, strings.Fields(tc.cmd)...), k...)...)
		if code != tc.code {
			t.Fatalf("%s: exit %d: %s", tc.cmd, code, errOut)
		}
		golden(t, tc.name, topics.normalize(out))
	}
	out, errOut, code := run(t, append([]string{"dlq", "replay", "--rate", "inf", "--allow", "orders-*"}, k...)...)
	if code != exitPartial || !strings.HasPrefix(out, "replayed 2, parked 1") {
		t.Fatalf("replay: exit %d: %q %q", code, out, errOut)
	}
	out, _, _ = run(t, append([]string{"dlq", "ls"}, k...)...)
	if topics.normalize(out) != "topic dlq-000000000000 (group sluice-replay): 0 letters\n" {
		t.Fatalf("after replay: %q", out)
	}
	// The parked letter is in <dlq>.parked; the replayed messages are in
	// orders without their envelope (so they list as malformed letters).
	out, _, _ = run(t, "dlq", "ls", "--brokers", brokers, "--topic", topics.dlq+".parked")
	if !strings.Contains(out, ": 1 letters") {
		t.Fatalf("parked: %q", out)
	}
	out, _, _ = run(t, "dlq", "ls", "--brokers", brokers, "--topic", topics.orders)
	if !strings.Contains(out, ": 2 letters") || !strings.Contains(out, "(malformed)") {
		t.Fatalf("orders: %q", out)
	}
	// The origin topic is not a dead-letter store: purge refuses it.
	_, errOut, code = run(t, "dlq", "purge", "--yes", "--brokers", brokers, "--topic", topics.orders)
	if code != exitError || !strings.Contains(errOut, "is not a sluice dead-letter store") {
		t.Fatalf("purge of the origin topic: %d %q", code, errOut)
	}
}

func TestKafkaPurgeAndErrors(t *testing.T) {
	brokers, topics := kafkaFixture(t)
	k := []string{"--brokers", brokers, "--topic", topics.dlq}
	_, errOut, code := run(t, append([]string{"dlq", "purge", "--filter", "class=permanent", "--yes"}, k...)...)
	if code != exitUsage || !strings.Contains(errOut, "Kafka cannot delete single records") {
		t.Fatalf("filtered purge: %d %q", code, errOut)
	}
	out, _, code := run(t, append([]string{"dlq", "purge", "--yes", "--upto", "end"}, k...)...)
	if code != 0 || topics.normalize(out) != "purged 3 letters from topic dlq-000000000000 (group sluice-replay)\n" {
		t.Fatalf("purge: %d %q", code, out)
	}
	out, _, _ = run(t, append([]string{"dlq", "ls"}, k...)...)
	if topics.normalize(out) != "topic dlq-000000000000 (group sluice-replay): 0 letters\n" {
		t.Fatalf("after purge: %q", out)
	}
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"dlq", "ls", "--brokers", brokers, "--topic", "nope-" + topics.dlq}, exitError, `topic "nope-` + topics.dlq + `" not found`},
		{[]string{"dlq", "ls", "--brokers", "127.0.0.1:1", "--topic", "dlq"}, exitError, `cannot reach Kafka at 127.0.0.1:1`},
		{[]string{"dlq", "ls", "--brokers", brokers}, exitUsage, "Kafka needs --topic"},
		{[]string{"dlq", "show", "zero", "--brokers", brokers, "--topic", topics.dlq}, exitUsage, "want partition/offset"},
	} {
		_, errOut, code := run(t, tc.args...)
		if code != tc.code || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %d and %q", tc.args, code, errOut, tc.code, tc.want)
		}
	}
}

// TestKafkaPurgeOnlyWhatWasShown (issue 12.13): purge counts and prints
// --upto; a letter written afterwards survives purge --yes --upto.
func TestKafkaPurgeOnlyWhatWasShown(t *testing.T) {
	brokers, topics := kafkaFixture(t)
	k := []string{"--brokers", brokers, "--topic", topics.dlq}
	_, errOut, code := run(t, append([]string{"dlq", "purge"}, k...)...)
	if code != exitError || !strings.Contains(errOut, "3 letters in topic") || !strings.Contains(errOut, "add --yes --upto 0@2 to purge them") {
		t.Fatalf("count: %d %q", code, errOut)
	}
	sink, err := kafkaadapter.NewDeadLetterSink(&kafkaadapter.Cluster{Brokers: strings.Split(brokers, ",")}, topics.dlq)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sink.Write(ctx, &dlq.Letter{Value: []byte("late"), Class: dlq.ClassPermanent, Err: "late",
		Origin: dlq.Origin{Topic: topics.orders, Partition: 0, Offset: 99}}); err != nil {
		t.Fatal(err)
	}
	_ = sink.Close()
	out, errOut, code := run(t, append([]string{"dlq", "purge", "--yes", "--upto", "0@2"}, k...)...)
	if code != 0 || !strings.Contains(out, "purged 3 letters") {
		t.Fatalf("purge: %d %q %q", code, out, errOut)
	}
	out, _, _ = run(t, append([]string{"dlq", "ls"}, k...)...)
	if !strings.Contains(out, ": 1 letters") {
		t.Fatalf("after purge: %q", out)
	}
	_, errOut, code = run(t, append([]string{"dlq", "purge", "--yes", "--upto", "57"}, k...)...)
	if code != exitUsage || !strings.Contains(errOut, "want partition@offset") {
		t.Fatalf("bad --upto: %d %q", code, errOut)
	}
}
