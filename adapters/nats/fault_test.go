package natsadapter_test

import (
	"context"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/natstest"
)

// faultRig is a server on a fixed port and store dir, so it can be
// restarted under a connected client, plus a reconnecting client.
type faultRig struct {
	mu   sync.Mutex
	srv  *server.Server
	dir  string
	port int
	nc   *nats.Conn
	js   jetstream.JetStream
}

func newFaultRig(t *testing.T) *faultRig {
	t.Helper()
	r := &faultRig{dir: t.TempDir()}
	s, err := natstest.RunAt(r.dir, -1)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(s.ClientURL())
	r.port, _ = strconv.Atoi(u.Port())
	r.srv = s
	r.nc, err = nats.Connect(s.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond),
		nats.ReconnectJitter(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	if r.js, err = jetstream.New(r.nc); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		r.nc.Close()
		r.mu.Lock()
		defer r.mu.Unlock()
		r.srv.Shutdown()
		r.srv.WaitForShutdown()
	})
	return r
}

// restart stops the server, waits down, and starts it again on the same
// port and store.
func (r *faultRig) restart(t *testing.T, down time.Duration) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.srv.Shutdown()
	r.srv.WaitForShutdown()
	time.Sleep(down)
	s, err := natstest.RunAt(r.dir, r.port)
	if err != nil {
		t.Fatal(err)
	}
	r.srv = s
}

// faultRun consumes n published messages while fault runs once after
// `after` handled messages, and checks that every message was handled
// and the consumer ends with nothing pending. It returns the duplicates.
func faultRun(t *testing.T, r *faultRig, n, after int, fault func()) (dups int64, s consumer.RouteStats) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if _, err := r.js.CreateStream(ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	publish(t, ctx, r.js, n)
	const window = 32
	src, err := natsadapter.NewSourceFor(ctx, r.js, "WORK", jetstream.ConsumerConfig{Durable: "fault", AckWait: 2 * time.Second},
		window, natsadapter.SourceOptions{PollWait: 200 * time.Millisecond, AckTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	seen := map[int]int{}
	var handled, dup atomic.Int64
	c, err := consumer.New(consumer.Options{ShutdownGrace: time.Second}, consumer.Route{Name: "fault", Source: src,
		Workers: 4, MaxInFlight: window, MaxInFlightBytes: 1 << 20,
		Retry: consumer.RetryPolicy{MaxAttempts: 100, BaseDelay: time.Millisecond, MaxDelay: 50 * time.Millisecond},
		Handler: func(_ context.Context, m *consumer.Message) error {
			time.Sleep(200 * time.Microsecond)
			id, _ := strconv.Atoi(m.Headers.Get("Id"))
			mu.Lock()
			seen[id]++
			if seen[id] > 1 {
				dup.Add(1)
			}
			mu.Unlock()
			handled.Add(1)
			return nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	complete := func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) == n
	}
	runUntil(t, c, 45*time.Second, func() bool {
		if complete() {
			info, err := src.Consumer().Info(ctx)
			return err == nil && info.NumAckPending == 0 && info.NumPending == 0
		}
		return false
	}, func() {
		if handled.Load() >= int64(after) {
			once.Do(fault)
		}
	})
	return dup.Load(), c.Stats()[0]
}

func TestServerRestartMidStream(t *testing.T) {
	r := newFaultRig(t)
	const n = 3000
	dups, s := faultRun(t, r, n, 1000, func() { r.restart(t, 300*time.Millisecond) })
	// Acks in flight when the server went down are lost (DoubleAck reports
	// it), so those messages come back after AckWait: duplicates, bounded
	// by what was in flight.
	t.Logf("restart: duplicates %d, settle errors %d, fetch errors %d, fetched %d", dups, s.SettleErrors, s.FetchErrors, s.Fetched)
	if dups > 2*32 {
		t.Fatalf("%d duplicates, more than two windows", dups)
	}
}

func TestClientDisconnectMidBatch(t *testing.T) {
	r := newFaultRig(t)
	const n = 3000
	dups, s := faultRun(t, r, n, 1000, func() {
		cid, err := r.nc.GetClientID()
		if err != nil {
			t.Error(err)
			return
		}
		r.mu.Lock()
		defer r.mu.Unlock()
		if err := r.srv.DisconnectClientByID(cid); err != nil {
			t.Error(err)
		}
	})
	t.Logf("disconnect: duplicates %d, settle errors %d, fetch errors %d, fetched %d", dups, s.SettleErrors, s.FetchErrors, s.Fetched)
	if dups > 2*32 {
		t.Fatalf("%d duplicates, more than two windows", dups)
	}
}
