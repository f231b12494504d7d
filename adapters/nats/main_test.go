package natsadapter_test

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/adapters/nats/natstest"
)

// serveEnv makes the test binary a NATS server instead (see
// newServerProcess): benchmarks keep the broker's heap and CPU out of the
// consumer's.
const serveEnv = "SLUICE_NATSTEST_SERVE_DIR"

func TestMain(m *testing.M) {
	if dir := os.Getenv(serveEnv); dir != "" {
		os.Exit(serve(dir))
	}
	code := m.Run()
	stopSharedServer()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: errors on successful test run: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
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

// serverProcess is a nats-server running in a child process (or, with
// SLUICE_BENCH_BROKER=embedded, in this one: then cpu-ns/msg includes the
// broker's work and srv-cpu-ns/msg is not reported).
type serverProcess struct {
	url  string
	cmd  *exec.Cmd
	stop func()
}

// newServerProcess starts this test binary in serve mode on dir.
func newServerProcess(dir string) (*serverProcess, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe)
	cmd.Env = append(os.Environ(), serveEnv+"="+dir)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	stop := func() {
		_ = stdin.Close()
		_ = cmd.Wait()
	}
	line, err := bufio.NewReader(stdout).ReadString('\n')
	if err != nil {
		stop()
		return nil, fmt.Errorf("server process: %w", err)
	}
	return &serverProcess{url: strings.TrimSpace(line), cmd: cmd, stop: stop}, nil
}

// cpu returns the CPU time the server process has used (-1 if unknown).
func (p *serverProcess) cpu() time.Duration {
	if p.cmd == nil {
		return -1
	}
	return procCPU(p.cmd.Process.Pid)
}

var shared struct {
	once sync.Once
	dir  string
	p    *serverProcess
	err  error
}

// sharedServer is one server process for every benchmark of the run,
// started on first use and stopped by TestMain.
func sharedServer(tb testing.TB) *serverProcess {
	tb.Helper()
	shared.once.Do(func() {
		shared.dir, shared.err = os.MkdirTemp("", "sluice-natsbench")
		if shared.err != nil {
			return
		}
		if os.Getenv("SLUICE_BENCH_BROKER") == "embedded" {
			s, err := natstest.Run(shared.dir)
			if err != nil {
				shared.err = err
				return
			}
			shared.p = &serverProcess{url: s.ClientURL(), stop: func() { s.Shutdown(); s.WaitForShutdown() }}
			return
		}
		shared.p, shared.err = newServerProcess(shared.dir)
	})
	if shared.err != nil {
		tb.Fatal(shared.err)
	}
	return shared.p
}

func stopSharedServer() {
	if shared.p != nil {
		shared.p.stop()
	}
	if shared.dir != "" {
		_ = os.RemoveAll(shared.dir)
	}
}
