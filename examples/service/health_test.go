package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/sluice-go/sluice/adapters/nats/natstest"
)

// service is one instance run by a test, with its health address.
type service struct {
	base string // http://host:port
	stop func() error
}

// startService runs the service with cfg (metrics on a free port) until
// stop, which returns run's error.
func startService(t *testing.T, cfg config) *service {
	t.Helper()
	cfg.metricsAddr = "127.0.0.1:0"
	pr, pw := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		err := run(ctx, pw, cfg)
		pw.Close()
		errc <- err
	}()
	var mu sync.Mutex
	var log strings.Builder
	addr := make(chan string, 1)
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(pr)
		for sc.Scan() {
			mu.Lock()
			log.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if a, ok := strings.CutPrefix(sc.Text(), "metrics at http://"); ok {
				addr <- strings.TrimSuffix(a, "/metrics")
			}
		}
	}()
	s := &service{}
	var once sync.Once
	var runErr error
	s.stop = func() error {
		once.Do(func() {
			cancel()
			runErr = <-errc
			<-scanned
			if runErr != nil {
				mu.Lock()
				t.Logf("service output:\n%s", log.String())
				mu.Unlock()
			}
		})
		return runErr
	}
	t.Cleanup(func() { _ = s.stop() })
	select {
	case a := <-addr:
		s.base = "http://" + a
	case err := <-errc:
		t.Fatalf("run: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("no metrics address after 30 s")
	}
	return s
}

func probe(t *testing.T, u string) (int, string) {
	t.Helper()
	res, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

// await polls u until it answers code with a body containing want.
func await(t *testing.T, u string, code int, want string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, body := probe(t, u)
		if got == code && strings.Contains(body, want) {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %d %q; want %d with %q", u, got, body, code, want)
		}
		time.Sleep(25 * time.Millisecond) // polling the probe, as a platform does
	}
}

// A handler that hangs: the orders route becomes stuck (/readyz 503 at
// once, /healthz 503 after the grace, so a platform restarts the
// process; the -healthcheck probe exits 1), and both answer 200 again
// once the handler returns.
func TestHealthHangingHandler(t *testing.T) {
	_, natsURL := natstest.Start(t)
	release := make(chan struct{})
	var hang atomic.Bool
	svc := startService(t, config{natsURL: natsURL, stuckAfter: 300 * time.Millisecond, grace: 300 * time.Millisecond,
		beforeOrder: func(context.Context) {
			if hang.Load() {
				<-release
			}
		}})
	await(t, svc.base+"/readyz", 200, "route orders: idle")
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(svc.base, "http://"))
	var out bytes.Buffer
	if code := healthcheck(&out, "0.0.0.0:"+port); code != 0 {
		t.Fatalf("healthcheck exit %d: %s", code, out.String())
	}

	hang.Store(true)
	publishOrder(t, natsURL)
	body := await(t, svc.base+"/readyz", 503, "route orders: stuck")
	if !strings.Contains(body, "holds 1 messages and settled none for") || !strings.Contains(body, "route reports: idle") {
		t.Fatalf("readyz: %s", body)
	}
	await(t, svc.base+"/healthz", 503, `route "orders" stuck since`)
	out.Reset()
	if code := healthcheck(&out, "0.0.0.0:"+port); code != 1 || !strings.Contains(out.String(), "503 Service Unavailable") {
		t.Fatalf("healthcheck exit %d: %s", code, out.String())
	}
	close(release)
	await(t, svc.base+"/healthz", 200, "ok\n")
	await(t, svc.base+"/readyz", 200, "route orders: idle")
	_, metrics := probe(t, svc.base+"/metrics")
	if !strings.Contains(metrics, `sluice_route_state{criticality="CRITICAL",route="orders",state="idle"} 1`) {
		t.Fatalf("metrics lack the route state:\n%s", grepLines(metrics, "sluice_route_state"))
	}
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}
}

// A NATS server stopped under the service: its routes are not ready
// (/readyz 503, naming the connection), the process stays live (/healthz
// 200: a restart would not bring the broker back), and it is ready again
// once the server is back.
func TestHealthBrokerStopped(t *testing.T) {
	dir := t.TempDir()
	srv, err := natstest.RunAt(dir, -1)
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(srv.ClientURL())
	port, _ := strconv.Atoi(u.Port())
	var mu sync.Mutex
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	svc := startService(t, config{natsURL: srv.ClientURL(), stuckAfter: 30 * time.Second})
	await(t, svc.base+"/readyz", 200, "route orders: idle")

	mu.Lock()
	srv.Shutdown()
	srv.WaitForShutdown()
	mu.Unlock()
	// The first reason may be the last pull's answer ("409 Server
	// Shutdown", a CI run read it); once the client notices, it is the
	// connection's state.
	await(t, svc.base+"/readyz", 503, "route orders: not_ready")
	await(t, svc.base+"/readyz", 503, `source not ready: natsadapter: consumer "orders": connection RECONNECTING`)
	if code, body := probe(t, svc.base+"/healthz"); code != 200 {
		t.Fatalf("healthz with the broker down: %d %s", code, body)
	}
	_, metrics := probe(t, svc.base+"/metrics")
	if !strings.Contains(metrics, `sluice_route_state{criticality="CRITICAL",route="orders",state="not_ready"} 1`) {
		t.Fatalf("metrics:\n%s", grepLines(metrics, "sluice_route_state"))
	}

	mu.Lock()
	srv, err = natstest.RunAt(dir, port)
	mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	await(t, svc.base+"/readyz", 200, "route orders: idle")
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}
}

// A deleted durable: the Source recreates the consumer it created, so the
// route goes on (an order published afterwards is handled) and stays
// ready. A deleted stream cannot be recreated by the Source: the route has
// failed (/readyz 503 at once, /healthz 503 after the grace), and a
// restart of the service, which creates the stream again, brings it back.
func TestHealthDeletedDurable(t *testing.T) {
	_, natsURL := natstest.Start(t)
	var handled atomic.Int64
	cfg := config{natsURL: natsURL, stuckAfter: 30 * time.Second, grace: 200 * time.Millisecond,
		beforeOrder: func(context.Context) { handled.Add(1) }}
	svc := startService(t, cfg)
	await(t, svc.base+"/readyz", 200, "route orders: idle")
	js := jetStream(t, natsURL)
	ctx := context.Background()

	if err := js.DeleteConsumer(ctx, ordersStream, "orders"); err != nil {
		t.Fatal(err)
	}
	publishOrder(t, natsURL)
	deadline := time.Now().Add(30 * time.Second)
	for handled.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("no order handled 30 s after the durable was deleted")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := js.Consumer(ctx, ordersStream, "orders"); err != nil {
		t.Fatalf("the durable was not recreated: %v", err)
	}
	await(t, svc.base+"/readyz", 200, "route orders: idle")

	if err := js.DeleteStream(ctx, ordersStream); err != nil {
		t.Fatal(err)
	}
	body := await(t, svc.base+"/readyz", 503, "route orders: failed")
	if !strings.Contains(body, `stream "ORDERS" is gone`) || !strings.Contains(body, "only a restart brings the route back") {
		t.Fatalf("readyz: %s", body)
	}
	await(t, svc.base+"/healthz", 503, `route "orders" failed since`)
	if err := svc.stop(); !strings.Contains(fmt.Sprint(err), `stream "ORDERS" is gone`) {
		t.Fatalf("run: %v", err)
	}

	svc = startService(t, cfg) // the platform's restart
	await(t, svc.base+"/readyz", 200, "route orders: idle")
	await(t, svc.base+"/healthz", 200, "ok\n")
	if err := svc.stop(); err != nil {
		t.Fatal(err)
	}
}

func jetStream(t *testing.T, natsURL string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// publishOrder publishes one order without a deadline.
func publishOrder(t *testing.T, natsURL string) {
	t.Helper()
	js := jetStream(t, natsURL)
	if _, err := js.Publish(context.Background(), "orders.new", []byte("0")); err != nil {
		t.Fatal(err)
	}
}

func grepLines(s, substr string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
