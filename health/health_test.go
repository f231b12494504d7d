package health_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/health"
	"github.com/sluice-go/sluice/sluicetest"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	res, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res.StatusCode, string(b)
}

// until polls url until it answers code with a body containing want.
func until(t *testing.T, url string, code int, want string) string {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		got, body := get(t, url)
		if got == code && strings.Contains(body, want) {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %d %q, want %d with %q", url, got, body, code, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A handler that hangs: /healthz turns 503 once the route has been stuck
// for StuckAfter plus the grace, /readyz 503 as soon as it is stuck, and
// both 200 again once the handler returns.
func TestHangingHandlerFailsLivenessAndRecovers(t *testing.T) {
	src := sluicetest.NewSource()
	release := make(chan struct{})
	c, err := consumer.New(consumer.Options{Health: consumer.HealthPolicy{StuckAfter: 200 * time.Millisecond}}, consumer.Route{
		Name: "orders", Source: src, Workers: 1,
		Handler: func(ctx context.Context, m *consumer.Message) error { <-release; return nil },
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(health.Handler(c, health.Options{Grace: 300 * time.Millisecond}))
	defer srv.Close()

	if code, body := get(t, srv.URL+"/readyz"); code != 503 || !strings.Contains(body, `route "orders" stopped: Run has not started`) {
		t.Fatalf("before Run: %d %q", code, body)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- c.Run(ctx) }()
	until(t, srv.URL+"/readyz", 200, "route orders: idle")

	src.Publish("m", nil, nil, time.Time{})
	begin := time.Now()
	body := until(t, srv.URL+"/readyz", 503, "route orders: stuck")
	if !strings.Contains(body, "holds 1 messages and settled none for") {
		t.Fatalf("readyz: %q", body)
	}
	body = until(t, srv.URL+"/healthz", 503, `route "orders" stuck since`)
	if d := time.Since(begin); d < 500*time.Millisecond {
		t.Fatalf("liveness failed %v after the fetch, before StuckAfter + Grace", d)
	}
	close(release)
	until(t, srv.URL+"/healthz", 200, "ok\nroute orders: idle")
	until(t, srv.URL+"/readyz", 200, "ok\n")
	cancel()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	until(t, srv.URL+"/readyz", 503, "shutting down")
	if code, _ := get(t, srv.URL+"/healthz"); code != 200 {
		t.Fatalf("a stopped consumer is not live: %d", code)
	}
}

type fixed struct {
	mu sync.Mutex
	h  consumer.Health
}

func (f *fixed) Health() consumer.Health { f.mu.Lock(); defer f.mu.Unlock(); return f.h }

// A reason is data: a newline in a broker's error text does not forge a
// line of the answer; other methods than GET and HEAD are refused.
func TestAnswerShape(t *testing.T) {
	now := time.Now()
	f := &fixed{h: consumer.Health{At: now, Routes: []consumer.RouteHealth{{
		Route: "a", State: consumer.StateNotReady, Since: now,
		Reason: "source not ready: " + errors.New("down\nroute a: idle since x: fine").Error(),
	}}}}
	srv := httptest.NewServer(health.Handler(f, health.Options{}))
	defer srv.Close()
	code, body := get(t, srv.URL+"/readyz")
	if code != 503 || strings.Count(body, "\n") != 2 || !strings.Contains(body, "down route a: idle") {
		t.Fatalf("%d %q", code, body)
	}
	res, err := http.Head(srv.URL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 503 || res.Header.Get("Content-Type") != "text/plain; charset=utf-8" {
		t.Fatalf("HEAD: %d %v", res.StatusCode, res.Header)
	}
	res, err = http.Post(srv.URL+"/healthz", "text/plain", nil)
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("POST: %d", res.StatusCode)
	}
	if code, _ := get(t, srv.URL+"/other"); code != 404 {
		t.Fatalf("/other: %d", code)
	}
}
