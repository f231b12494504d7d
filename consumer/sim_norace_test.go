//go:build !race

package consumer_test

// simDefaultSeeds is TestSimulation's seed count (SLUICE_SIM_SEEDS overrides
// it).
const simDefaultSeeds = 2000
