package main

import (
	"os"
	"testing"

	"go.uber.org/goleak"
)

// childEnv makes the test binary run the CLI (main) instead of the tests:
// tests that send signals or run a printed command start it as a process.
const childEnv = "SLUICE_CLI_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "1" {
		main()
		return
	}
	goleak.VerifyTestMain(m)
}
