package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/dlq"
)

// kafkaBackend is a dead-letter topic seen through a replay group: the
// letters "in the queue" are those after the group's committed offsets.
type kafkaBackend struct {
	cluster *kafkaadapter.Cluster
	topic   string
	group   string
	tgt     *kafkaadapter.ReplayTarget
	sinks   []*kafkaadapter.DeadLetterSink
}

func connectKafka(ctx context.Context, f *connFlags) (backend, error) {
	if f.topic == "" {
		return nil, usageError{errors.New("--brokers needs --topic, the dead-letter topic")}
	}
	var brokers []string
	for _, b := range strings.Split(f.brokers, ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	group := f.group
	if group == "" {
		group = kafkaadapter.DefaultReplayGroup
	}
	b := &kafkaBackend{cluster: &kafkaadapter.Cluster{Brokers: brokers}, topic: f.topic, group: group}
	// One metadata round trip: a bad address or a missing topic fails here,
	// clearly, rather than in the middle of a command.
	tr := &kafka.Transport{}
	defer tr.CloseIdleConnections()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	client := &kafka.Client{Addr: kafka.TCP(brokers...), Transport: tr}
	md, err := client.Metadata(cctx, &kafka.MetadataRequest{Topics: []string{f.topic}})
	if err != nil {
		return nil, fmt.Errorf("cannot reach Kafka at %q: %w", f.brokers, err)
	}
	for _, t := range md.Topics {
		if t.Name == f.topic && t.Error == nil && len(t.Partitions) > 0 {
			return b, nil
		}
	}
	return nil, fmt.Errorf("topic %q %w on %s (--topic names the dead-letter topic)", f.topic, errNoStream, f.brokers)
}

func (b *kafkaBackend) describe() string {
	return fmt.Sprintf("topic %s (group %s)", b.topic, b.group)
}

func (b *kafkaBackend) open(ctx context.Context) (dlq.Source, func(), error) {
	src, err := kafkaadapter.NewLetterSource(ctx, kafkaadapter.LetterSourceConfig{Cluster: b.cluster, Topic: b.topic, Group: b.group})
	if err != nil {
		return nil, nil, err
	}
	return src, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = src.Close(cctx)
	}, nil
}

func (b *kafkaBackend) get(ctx context.Context, id string) (*dlq.Letter, string, error) {
	id = strings.TrimPrefix(id, b.topic+"/")
	id = strings.Replace(id, "@", "/", 1)
	l, err := kafkaadapter.GetLetter(ctx, b.cluster, b.topic, id)
	if errors.Is(err, dlq.ErrInvalidOption) {
		return nil, "", usageError{err}
	}
	if err != nil {
		return nil, "", err
	}
	return l, b.topic + "/" + strings.Replace(id, "/", "@", 1), nil
}

func (b *kafkaBackend) target() dlq.Target {
	if b.tgt == nil {
		b.tgt, _ = kafkaadapter.NewReplayTarget(b.cluster, kafkaadapter.ReplayTargetOptions{}) // brokers are non-empty here
	}
	return b.tgt
}

func (b *kafkaBackend) park(ctx context.Context, name string) (dlq.Sink, error) {
	s, err := kafkaadapter.NewDeadLetterSink(b.cluster, name)
	if err != nil {
		return nil, err
	}
	b.sinks = append(b.sinks, s)
	return s, nil
}

// purgeAll moves the replay group past every letter: Kafka cannot delete
// single records, so the topic keeps them for other groups.
func (b *kafkaBackend) purgeAll(ctx context.Context) (int, error) {
	src, done, err := b.open(ctx)
	if err != nil {
		return 0, err
	}
	defer done()
	n := 0
	for {
		batch, err := src.Fetch(ctx, 256)
		if errors.Is(err, dlq.ErrDrained) {
			break
		}
		if err != nil {
			return n, err
		}
		for _, p := range batch {
			p.Leave()
			n++
		}
	}
	return n, src.(*kafkaadapter.LetterSource).Commit(ctx)
}

func (b *kafkaBackend) close() {
	if b.tgt != nil {
		_ = b.tgt.Close()
	}
	for _, s := range b.sinks {
		_ = s.Close()
	}
}
