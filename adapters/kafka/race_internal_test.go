//go:build race

package kafkaadapter

// simSeeds is TestSimulation's default seed count. The model runs in one
// goroutine, so the race detector finds nothing in it and only slows it
// several times over: under -race it plays fewer seeds.
const simSeeds = 200
