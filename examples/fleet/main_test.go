package main

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/adapters/nats/natstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// syncBuffer is the instance's stdout in the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// One instance on an embedded NATS server writes the ledger protocol: it
// is ready, handles and settles every message once (an h line before its
// s line), and on its graceful stop reports a window peak within -window
// and its final counts.
func TestReportsTheLedgerProtocol(t *testing.T) {
	const n = 200
	_, url := natstest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub := connect(t, url)
	if _, err := pub.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := pub.Publish(ctx, "t.m", []byte(strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	var out syncBuffer
	c := config{broker: "nats", natsURL: url, stream: "T", durable: "d", ackWait: 5 * time.Second, pending: 256,
		workers: 4, window: 8, cost: time.Millisecond, grace: 5 * time.Second, every: 20 * time.Millisecond, instance: "t"}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- run(runCtx, c, newReporter(&out)) }()
	tk := time.NewTicker(10 * time.Millisecond)
	defer tk.Stop()
	for strings.Count(out.String(), "\ns ") < n-1 { // the first line is "ready"
		select {
		case <-ctx.Done():
			t.Fatalf("not all settled:\n%s", out.String())
		case <-tk.C:
		}
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if lines[0] != "ready" {
		t.Errorf("first line %q, want ready", lines[0])
	}
	handled, settled := map[string]int{}, map[string]int{}
	var last, exit string
	for _, l := range lines {
		kind, rest, _ := strings.Cut(l, " ")
		switch kind {
		case "h":
			id, attempt, _ := strings.Cut(rest, " ")
			if attempt != "1" {
				t.Errorf("line %q: want attempt 1", l)
			}
			handled[id]++
		case "s":
			if handled[rest] == 0 {
				t.Errorf("%s settled before it was handled", rest)
			}
			settled[rest]++
		case "w":
			last = rest
		case "x":
			exit = rest
		}
	}
	if len(handled) != n || len(settled) != n {
		t.Errorf("%d handled, %d settled; want %d each", len(handled), len(settled), n)
	}
	var hook, peak, limit int
	if f := strings.Fields(last); len(f) < 3 {
		t.Fatalf("window line %q", last)
	} else {
		hook, _ = strconv.Atoi(f[0])
		peak, _ = strconv.Atoi(f[1])
		limit, _ = strconv.Atoi(f[2])
	}
	if hook < 1 || hook > c.window || peak > c.window || limit != c.window {
		t.Errorf("window line %q: want peaks in 1..%d and limit %d", last, c.window, c.window)
	}
	if exit != strconv.Itoa(n)+" "+strconv.Itoa(n) {
		t.Errorf("exit line %q, want %d fetched and succeeded", exit, n)
	}
}

func connect(t *testing.T, url string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url)
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
