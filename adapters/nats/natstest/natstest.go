package natstest

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Run starts a JetStream-enabled server on 127.0.0.1 with a random port,
// storing streams in storeDir. The caller shuts it down with Shutdown and
// WaitForShutdown.
func Run(storeDir string) (*server.Server, error) { return RunAt(storeDir, -1) }

// RunAt is Run on a given port (-1: random). Restarting a server on the
// same store dir and port lets a client reconnect and find its streams.
func RunAt(storeDir string, port int) (*server.Server, error) {
	opts := &server.Options{
		Host:      "127.0.0.1",
		Port:      port,
		JetStream: true,
		StoreDir:  storeDir,
		NoLog:     true,
		NoSigs:    true,
	}
	s, err := server.NewServer(opts)
	if err != nil {
		return nil, err
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		s.WaitForShutdown()
		return nil, errors.New("natstest: server not ready after 10s")
	}
	return s, nil
}

// Start runs a server for tb, with its store in tb.TempDir, and shuts it
// down in tb.Cleanup. It returns the server and its client URL.
func Start(tb testing.TB) (*server.Server, string) {
	tb.Helper()
	s, err := Run(tb.TempDir())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s, s.ClientURL()
}

// JetStream starts a server for tb (as Start) and returns a JetStream
// context on a connection closed in tb.Cleanup.
func JetStream(tb testing.TB) jetstream.JetStream {
	tb.Helper()
	_, url := Start(tb)
	nc, err := nats.Connect(url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return js
}
