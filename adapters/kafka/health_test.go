package kafkaadapter_test

import (
	"context"
	"net"
	"strings"
	"testing"
	"time"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
)

// The Source reports through SourceInfo.Ready whether its group formed: a
// route whose brokers cannot be reached stays not ready, with the reason;
// one on a live cluster becomes ready once it has its assignment.
func TestHealthGroupFormed(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there now

	topic := cluster.Topic(t, "health", 2)
	group := kafkatest.UniqueName("health")
	cfg := testConfig(group, topic)
	cfg.Cluster = &kafkaadapter.Cluster{Brokers: []string{dead}}
	down := startMember(t, cfg, consumer.Route{Workers: 1, Handler: func(context.Context, *consumer.Message) error { return nil }})
	defer down.stop(t)

	up := startMember(t, testConfig(group+"-up", topic), consumer.Route{Workers: 1, Handler: func(context.Context, *consumer.Message) error { return nil }})
	defer up.stop(t)
	waitFor(t, 30*time.Second, "the live member ready", func() bool {
		return up.c.Health().Routes[0].State == consumer.StateIdle
	})
	if ok, why := up.c.Health().Ready(); !ok {
		t.Fatalf("not ready: %s", why)
	}
	rh := down.c.Health().Routes[0]
	if rh.State != consumer.StateNotReady || !strings.Contains(rh.Reason, "source not ready: kafka source: joining group "+group) {
		t.Fatalf("member without a broker: %+v", rh)
	}
}
