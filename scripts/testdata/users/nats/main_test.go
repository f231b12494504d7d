package main

import (
	"testing"

	"github.com/sluice-go/sluice/adapters/nats/natstest"
)

// natstest (the embedded nats-server) is reachable from a user's tests.
func TestEmbedded(t *testing.T) {
	if natstest.JetStream(t) == nil {
		t.Fatal("no JetStream")
	}
}
