//go:build !race

package natsadapter

const raceEnabled = false
