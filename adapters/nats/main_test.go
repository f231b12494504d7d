package natsadapter_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"testing"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/internal/natstest"
)

// serveEnv makes the test binary a NATS server instead (see
// startServerProcess): the memory benchmark keeps the broker's heap out of
// the consumer's.
const serveEnv = "SLUICE_NATSTEST_SERVE_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(serveEnv); dir != "" {
		os.Exit(serve(dir))
	}
	goleak.VerifyTestMain(m)
}

// serve runs a server on dir, prints its URL, and stops when stdin closes.
func serve(dir string) int {
	s, err := natstest.Run(dir)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Println(s.ClientURL())
	_, _ = io.Copy(io.Discard, bufio.NewReader(os.Stdin))
	s.Shutdown()
	s.WaitForShutdown()
	return 0
}
