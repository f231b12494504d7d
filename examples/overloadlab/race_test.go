//go:build race

package main

// raceEnabled is true under the race detector, which slows the broker
// client, the embedded server and sluice several times over, so goodput
// figures measured against a capacity taken outside it mean nothing.
const raceEnabled = true
