package kafkaadapter_test

import (
	"context"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kmsg"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/consumer"
)

// flakyConn closes its connection on every k-th write across all
// connections of one dialer: a fetch (or any request) dies mid-flight.
type flakyDialer struct {
	k      int64
	writes atomic.Int64
	drops  atomic.Int64
}

func (d *flakyDialer) dial(ctx context.Context, network, addr string) (net.Conn, error) {
	c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	return &flakyConn{Conn: c, d: d}, nil
}

type flakyConn struct {
	net.Conn
	d *flakyDialer
}

func (c *flakyConn) Write(p []byte) (int, error) {
	if c.d.writes.Add(1)%c.d.k == 0 {
		c.d.drops.Add(1)
		_ = c.Conn.Close()
		return 0, errors.New("flaky: connection dropped")
	}
	return c.Conn.Write(p)
}

// TestConnectionDrops drops the fetch connection on every 7th request:
// fetches fail and are retried, nothing is lost and commits stay correct.
func TestConnectionDrops(t *testing.T) {
	const n, parts = 3000, 4
	topic := cluster.Topic(t, "drops", parts)
	group := kafkatest.UniqueName("drops")
	end := produceN(t, topic, n, 32, nil)
	l := newLedger(t, topic)
	fd := &flakyDialer{k: 7}
	flaky := &kafkaadapter.Cluster{Brokers: cluster.Brokers}
	kafkaadapter.SetDial(flaky, fd.dial)
	cfg := testConfig(group, topic)
	cfg.Cluster = flaky
	cfg.FetchMaxBytes = 16 << 10 // many small fetches
	cfg.OnCommit = l.onCommit
	m := startMember(t, cfg, consumer.Route{Workers: 8, Handler: func(ctx context.Context, m *consumer.Message) error {
		l.finish(m.Origin)
		return nil
	}})
	waitFor(t, 40*time.Second, "all committed", func() bool { return committedAll(group, topic, end) })
	m.stop(t)
	st := m.src.Stats()
	unique, dups := l.counts()
	t.Logf("%s: %d unique, %d dups, %d connections dropped, stats %+v", cluster.Kind(), unique, dups, fd.drops.Load(), st)
	if int64(unique) != total(end) {
		t.Fatalf("finished %d of %d; missing %v", unique, total(end), l.missing(end))
	}
	if fd.drops.Load() == 0 || st.FetchErrors == 0 {
		t.Errorf("no fault was injected: drops %d, fetch errors %d", fd.drops.Load(), st.FetchErrors)
	}
	for _, f := range l.failures() {
		t.Error(f)
	}
}

// TestCommitFailures refuses every other OffsetCommit (kfake only): the
// watermark is committed again later, nothing is lost or committed early.
func TestCommitFailures(t *testing.T) {
	if cluster.Real() {
		t.Skip("needs kfake's ControlKey to fail OffsetCommit; a real broker cannot be told to")
	}
	const n, parts = 2000, 4
	topic := cluster.Topic(t, "commitfail", parts)
	group := kafkatest.UniqueName("commitfail")
	end := produceN(t, topic, n, 32, nil)
	l := newLedger(t, topic)
	var seen, refused atomic.Int64
	cluster.Fake.ControlKey(kmsg.OffsetCommit.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.Fake.KeepControl()
		r := req.(*kmsg.OffsetCommitRequest)
		if r.Group != group || seen.Add(1)%2 == 0 {
			return nil, nil, false
		}
		refused.Add(1)
		resp := r.ResponseKind().(*kmsg.OffsetCommitResponse)
		for _, rt := range r.Topics {
			tt := kmsg.NewOffsetCommitResponseTopic()
			tt.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				pp := kmsg.NewOffsetCommitResponseTopicPartition()
				pp.Partition = rp.Partition
				pp.ErrorCode = 7 // REQUEST_TIMED_OUT
				tt.Partitions = append(tt.Partitions, pp)
			}
			resp.Topics = append(resp.Topics, tt)
		}
		return resp, nil, true
	})
	cfg := testConfig(group, topic)
	cfg.CommitInterval = 20 * time.Millisecond
	cfg.OnCommit = l.onCommit
	m := startMember(t, cfg, consumer.Route{Workers: 8, Handler: func(ctx context.Context, m *consumer.Message) error {
		time.Sleep(100 * time.Microsecond)
		l.finish(m.Origin)
		return nil
	}})
	waitFor(t, 40*time.Second, "all committed", func() bool { return committedAll(group, topic, end) })
	m.stop(t)
	st := m.src.Stats()
	unique, _ := l.counts()
	t.Logf("refused %d commits, stats %+v", refused.Load(), st)
	if int64(unique) != total(end) {
		t.Fatalf("finished %d of %d", unique, total(end))
	}
	if refused.Load() == 0 || st.CommitErrors == 0 {
		t.Errorf("no commit was refused: %d / %+v", refused.Load(), st)
	}
	for _, f := range l.failures() {
		t.Error(f)
	}
}

// TestRetryTopicWriteFails refuses produce requests to the retry topic
// (kfake only): the originals stay unsettled and are retried in process,
// their partition is not committed past them, and after a restart without
// the fault everything completes.
func TestRetryTopicWriteFails(t *testing.T) {
	if cluster.Real() {
		t.Skip("needs kfake's ControlKey to fail Produce to one topic")
	}
	const n, parts = 20, 1
	topic := cluster.Topic(t, "retryfail", parts)
	retryTopic := cluster.Topic(t, "retryfail-r", 1)
	group := kafkatest.UniqueName("retryfail")
	end := produceN(t, topic, n, 16, nil)
	l := newLedger(t, topic)
	var refusing atomic.Bool
	refusing.Store(true)
	var refused atomic.Int64
	cluster.Fake.ControlKey(kmsg.Produce.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		cluster.Fake.KeepControl()
		r := req.(*kmsg.ProduceRequest)
		if !refusing.Load() || len(r.Topics) == 0 || r.Topics[0].Topic != retryTopic {
			return nil, nil, false
		}
		refused.Add(1)
		resp := r.ResponseKind().(*kmsg.ProduceResponse)
		for _, rt := range r.Topics {
			tt := kmsg.NewProduceResponseTopic()
			tt.Topic = rt.Topic
			for _, rp := range rt.Partitions {
				pp := kmsg.NewProduceResponseTopicPartition()
				pp.Partition = rp.Partition
				pp.ErrorCode = 29 // TOPIC_AUTHORIZATION_FAILED: not retried by the writer
				tt.Partitions = append(tt.Partitions, pp)
			}
			resp.Topics = append(resp.Topics, tt)
		}
		return resp, nil, true
	})
	var failing sync.Map
	handler := func(ctx context.Context, m *consumer.Message) error {
		i := msgIndex(m)
		if i == 3 {
			if _, again := failing.LoadOrStore(i, true); !again || refusing.Load() {
				return errors.New("retry me later")
			}
		}
		l.finish(m.Origin)
		return nil
	}
	cfg := testConfig(group, topic)
	cfg.RetryTopic = retryTopic
	cfg.LocalRetryMaxDelay = time.Millisecond
	route := consumer.Route{Workers: 2, Handler: handler,
		Retry: consumer.RetryPolicy{MaxAttempts: 1000, BaseDelay: 20 * time.Millisecond, MaxDelay: 20 * time.Millisecond}}
	m := startMember(t, cfg, route)
	waitFor(t, 20*time.Second, "refused retry writes", func() bool { return refused.Load() >= 3 })
	waitFor(t, 20*time.Second, "other messages done", func() bool { u, _ := l.counts(); return u == n-1 })
	time.Sleep(3 * cfg.CommitInterval)
	m.stop(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got, err := cluster.Committed(ctx, group, topic, parts)
	if err != nil {
		t.Fatal(err)
	}
	st := m.src.Stats()
	t.Logf("refused %d, committed %v, stats %+v", refused.Load(), got, st)
	if st.RetryWriteErrors == 0 {
		t.Errorf("no retry write failed: %+v", st)
	}
	// The failing message is the 4th produced; round robin over one
	// partition puts it at offset 3.
	if got[0] > 3 {
		t.Fatalf("committed %d past the message whose retry write failed", got[0])
	}
	refusing.Store(false)
	m2 := startMember(t, cfg, route)
	waitFor(t, 30*time.Second, "all committed after restart", func() bool { return committedAll(group, topic, end) })
	m2.stop(t)
	if u, _ := l.counts(); u != n {
		t.Fatalf("finished %d of %d", u, n)
	}
}
