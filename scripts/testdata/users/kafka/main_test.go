package main

import (
	"testing"

	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
)

// kafkatest (the kfake cluster) is reachable from a user's tests.
func TestCluster(t *testing.T) {
	if kafkatest.Start(t).Kafka() == nil {
		t.Fatal("no cluster")
	}
}
