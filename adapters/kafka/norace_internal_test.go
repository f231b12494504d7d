//go:build !race

package kafkaadapter

// simSeeds is TestSimulation's default seed count (see race_internal_test.go).
const simSeeds = 1000
