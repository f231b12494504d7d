package consumer_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
)

// simCrashWatch names the seeds a crash of the test binary interrupts. A
// panic in consumer code inside a seed's bubble (a goroutine the consumer
// started) cannot be recovered by the test, so the process dies with the
// panic's stack and nothing says which seed ran. So TestSimulation keeps
// the seeds running in a file and hands its crash output
// (runtime/debug.SetCrashOutput) to a small helper process (sh) that waits
// for the test binary to go away: when it crashed, the file is still there
// and the helper prints
//
//	sim: the test binary crashed while running seed(s) 12 13: replay with SLUICE_SIM_SEED=<seed> ...
//
// to the test's stderr; after a normal end the file is gone and it prints
// nothing. A test timeout is a crash too. Without sh (or if anything here
// fails) the test runs without the watch.
type simCrashWatch struct {
	mu      sync.Mutex
	path    string
	running []uint64
	w       *os.File
	helper  *exec.Cmd
}

func newSimCrashWatch(t *testing.T) *simCrashWatch {
	cw := &simCrashWatch{path: filepath.Join(t.TempDir(), "running-seeds")}
	r, w, err := os.Pipe()
	if err != nil {
		return cw
	}
	defer r.Close()
	cmd := exec.Command("sh", "-c", `cat >/dev/null; if [ -s "$1" ]; then echo "sim: the test binary crashed while running seed(s) $(cat "$1"): replay with SLUICE_SIM_SEED=<seed> go test ./consumer -run TestSimulation -v" >&2; fi`, "sh", cw.path)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = r, os.Stderr, os.Stderr
	if cmd.Start() != nil {
		w.Close()
		return cw
	}
	if debug.SetCrashOutput(w, debug.CrashOptions{}) != nil {
		w.Close()
		_ = cmd.Wait()
		return cw
	}
	cw.w, cw.helper = w, cmd
	return cw
}

// begin and end bracket one seed's run.
func (cw *simCrashWatch) begin(seed uint64) {
	cw.update(func() { cw.running = append(cw.running, seed) })
}

func (cw *simCrashWatch) end(seed uint64) {
	cw.update(func() {
		if i := slices.Index(cw.running, seed); i >= 0 {
			cw.running = slices.Delete(cw.running, i, i+1)
		}
	})
}

func (cw *simCrashWatch) update(f func()) {
	if cw.helper == nil {
		return
	}
	cw.mu.Lock()
	defer cw.mu.Unlock()
	f()
	s := make([]string, len(cw.running))
	for i, seed := range cw.running {
		s[i] = strconv.FormatUint(seed, 10)
	}
	_ = os.WriteFile(cw.path, []byte(strings.Join(s, " ")), 0o600)
}

// close ends the watch after a normal end: the helper prints nothing.
func (cw *simCrashWatch) close() {
	if cw.helper == nil {
		return
	}
	_ = os.Remove(cw.path)
	_ = debug.SetCrashOutput(nil, debug.CrashOptions{})
	cw.w.Close()
	_ = cw.helper.Wait()
}
