package franzadapter_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	franzadapter "github.com/sluice-go/sluice/adapters/franz"
	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/internal/kafkacore"
)

// A replayed message goes back to its original partition while the topic
// has the partition count the letter recorded, to murmur2's partition with
// Rehash (or when the count changed), headers in their order; a topic that
// does not exist is undeliverable.
func TestReplayTargetPartitions(t *testing.T) {
	topic := newTopic(t, "replay", 4)
	key := []byte("order-7")
	hash := int32(kafkacore.KeyPartition(key, 4))
	origin := (hash + 1) % 4
	letter := func(count string) *dlq.Letter {
		return &dlq.Letter{Key: key, Value: []byte("v"), Origin: dlq.Origin{Topic: topic, Partition: origin, Offset: 9},
			Headers: map[string][]string{kafkacore.MetaOriginPartitions: {count}}}
	}
	out := func(l *dlq.Letter) *dlq.Outgoing {
		return &dlq.Outgoing{Topic: topic, Key: key, Value: []byte("v"), Letter: l,
			Headers: map[string][]string{"b": {"1"}, "a": {"2"}, franzadapter.HeaderOrder: {"b", "a"}, kafkacore.MetaOriginPartitions: {"4"}}}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, c := range []struct {
		name   string
		rehash bool
		count  string
		want   int32
	}{{"origin", false, "4", origin}, {"rehash", true, "4", hash}, {"count changed", false, "3", hash}} {
		target, err := franzadapter.NewReplayTarget(franzadapter.ReplayTargetOptions{Rehash: c.rehash}, kgo.SeedBrokers(brokers...))
		if err != nil {
			t.Fatal(err)
		}
		if err := target.Publish(ctx, out(letter(c.count))); err != nil {
			t.Fatal(err)
		}
		_ = target.Close()
		cl := client(t, kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {c.want: kgo.NewOffset().AtStart()}}))
		var got *kgo.Record
		for got == nil && ctx.Err() == nil {
			fs := cl.PollFetches(ctx)
			if rs := fs.Records(); len(rs) > 0 {
				got = rs[len(rs)-1]
			}
		}
		if got == nil || got.Partition != c.want {
			t.Fatalf("%s: not on partition %d", c.name, c.want)
		}
		var names []string
		for _, h := range got.Headers {
			names = append(names, h.Key)
		}
		if strings.Join(names, ",") != "b,a" {
			t.Fatalf("%s: headers %v, want b, a (metadata dropped)", c.name, names)
		}
		cl.Close()
	}
	target, err := franzadapter.NewReplayTarget(franzadapter.ReplayTargetOptions{}, kgo.SeedBrokers(brokers...))
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	short, cancelShort := context.WithTimeout(ctx, 5*time.Second)
	defer cancelShort()
	if err := target.Publish(short, &dlq.Outgoing{Topic: uniqueName("missing"), Value: []byte("v")}); !errors.Is(err, dlq.ErrUndeliverable) {
		t.Fatalf("replay to a missing topic: %v, want ErrUndeliverable", err)
	}
}
