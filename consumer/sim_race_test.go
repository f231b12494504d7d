//go:build race

package consumer_test

// simDefaultSeeds is TestSimulation's seed count under the race detector,
// which runs each seed about ten times slower.
const simDefaultSeeds = 600
