package fleet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Fleet runs instances of a consumer program as child processes and reads
// the line protocol each writes on its stdout (examples/fleet -report):
// their handled and settled messages go to the Ledger, their window
// reports to each Proc.
type Fleet struct {
	// Bin is the consumer program; Args its arguments (the same for
	// every instance, which gets -instance N appended).
	Bin  string
	Args []string
	// LogDir receives each instance's stderr as instance-N.log.
	LogDir string
	// Ledger, if set, receives the handled and settled lines.
	Ledger *Ledger

	settled atomic.Int64
	mu      sync.Mutex
	next    int
	procs   []*Proc
}

// Proc is one instance.
type Proc struct {
	ID  int
	cmd *exec.Cmd

	ready    chan struct{}
	done     chan struct{}
	waitErr  error
	settled  atomic.Int64
	mu       sync.Mutex
	end      End
	win      Window
	exited   bool
	exitLine string
}

// Window is what an instance last reported about what it holds.
type Window struct {
	HookPeak  int // the most messages held at once, counted by the instance's hook
	RoutePeak int // the route's own Window.Peak
	Limit     int // the window's message limit
	Held      int // held now
	Gen       int // Kafka: its generation (0 between generations)
	Parts     int // Kafka: partitions assigned
}

// Start starts one more instance. It does not wait for it to be ready.
func (f *Fleet) Start() (*Proc, error) {
	f.mu.Lock()
	id := f.next
	f.next++
	f.mu.Unlock()
	args := append(slices.Clone(f.Args), "-report", "-instance", strconv.Itoa(id))
	cmd := exec.Command(f.Bin, args...)
	logf, err := os.Create(filepath.Join(f.LogDir, fmt.Sprintf("instance-%d.log", id)))
	if err != nil {
		return nil, err
	}
	cmd.Stderr = logf
	out, err := cmd.StdoutPipe()
	if err != nil {
		_ = logf.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return nil, err
	}
	p := &Proc{ID: id, cmd: cmd, ready: make(chan struct{}), done: make(chan struct{})}
	f.mu.Lock()
	f.procs = append(f.procs, p)
	f.mu.Unlock()
	go func() {
		f.read(p, out)
		p.waitErr = cmd.Wait()
		_ = logf.Close()
		close(p.done)
	}()
	return p, nil
}

// read parses p's lines until its stdout closes.
func (f *Fleet) read(p *Proc, r io.Reader) {
	sc := bufio.NewScanner(r)
	readyOnce := sync.OnceFunc(func() { close(p.ready) })
	defer readyOnce()
	for sc.Scan() {
		line := sc.Text()
		now := time.Now()
		kind, rest, _ := strings.Cut(line, " ")
		switch kind {
		case "h", "s":
			idText, attemptText, _ := strings.Cut(rest, " ")
			id, err := strconv.Atoi(idText)
			if err != nil {
				continue
			}
			attempt, _ := strconv.Atoi(attemptText)
			if kind == "s" {
				p.settled.Add(1)
				f.settled.Add(1)
			}
			if f.Ledger != nil {
				if kind == "h" {
					f.Ledger.Handled(p.ID, id, attempt, now)
				} else {
					f.Ledger.Settled(p.ID, id, now)
				}
			}
		case "ready":
			readyOnce()
		case "w":
			var w Window
			if _, err := fmt.Sscan(rest, &w.HookPeak, &w.RoutePeak, &w.Limit, &w.Held, &w.Gen, &w.Parts); err == nil {
				p.mu.Lock()
				p.win = w
				p.mu.Unlock()
			}
		case "x":
			p.mu.Lock()
			p.exited, p.exitLine = true, rest
			p.mu.Unlock()
		}
	}
}

// Ready waits until p has joined (its "ready" line) or ends.
func (p *Proc) Ready(ctx context.Context) error {
	select {
	case <-p.ready:
	case <-ctx.Done():
		return ctx.Err()
	}
	select {
	case <-p.done:
		return fmt.Errorf("instance %d exited before it was ready: %v", p.ID, p.waitErr)
	default:
		return nil
	}
}

// Window returns what p last reported about its window.
func (p *Proc) Window() Window {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.win
}

// Settled returns how many settlements p reported.
func (p *Proc) Settled() int64 { return p.settled.Load() }

// Alive reports whether p has not been told to stop and has not exited.
func (p *Proc) Alive() bool {
	p.mu.Lock()
	end := p.end
	p.mu.Unlock()
	select {
	case <-p.done:
		return false
	default:
		return end == Running
	}
}

// End returns how p was stopped.
func (p *Proc) End() End {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.end
}

// Exited reports whether p exited after writing its final line (a graceful
// stop that completed), and that line.
func (p *Proc) Exited() (bool, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited, p.exitLine
}

// Err is the process's exit error once it is done (nil: exit status 0).
func (p *Proc) Err() error {
	<-p.done
	return p.waitErr
}

// Done is closed once the process has exited and its output is read.
func (p *Proc) Done() <-chan struct{} { return p.done }

// stop sends sig and records the end in the ledger.
func (f *Fleet) stop(p *Proc, sig syscall.Signal, how End) error {
	p.mu.Lock()
	if p.end != Running {
		p.mu.Unlock()
		return nil
	}
	p.end = how
	p.mu.Unlock()
	err := p.cmd.Process.Signal(sig)
	if how == Killed {
		// Nothing it writes after the signal: its pipe's last lines are
		// read before the ledger learns the time of death.
		<-p.done
	}
	if f.Ledger != nil {
		f.Ledger.Ended(p.ID, how, time.Now())
	}
	if errors.Is(err, os.ErrProcessDone) {
		err = nil
	}
	return err
}

// Terminate stops p gracefully (SIGTERM) and does not wait.
func (f *Fleet) Terminate(p *Proc) error { return f.stop(p, syscall.SIGTERM, Terminated) }

// Kill kills p (SIGKILL) and waits until it is gone.
func (f *Fleet) Kill(p *Proc) error { return f.stop(p, syscall.SIGKILL, Killed) }

// Live returns the instances still running.
func (f *Fleet) Live() []*Proc {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []*Proc
	for _, p := range f.procs {
		if p.Alive() {
			out = append(out, p)
		}
	}
	return out
}

// All returns every instance started.
func (f *Fleet) All() []*Proc {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]*Proc(nil), f.procs...)
}

// Settled returns the settlements reported by all instances.
func (f *Fleet) Settled() int64 { return f.settled.Load() }

// StopAll terminates every running instance and waits for all to exit;
// those still running after timeout are killed. It returns the exit errors
// of the instances that were terminated (a killed one's error is expected).
func (f *Fleet) StopAll(timeout time.Duration) error {
	for _, p := range f.Live() {
		_ = f.Terminate(p)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	var errs []error
	for _, p := range f.All() {
		select {
		case <-p.done:
		case <-ctx.Done():
			_ = p.cmd.Process.Kill()
			<-p.done
			errs = append(errs, fmt.Errorf("instance %d did not stop within %v", p.ID, timeout))
			continue
		}
		if p.End() != Killed && p.waitErr != nil {
			errs = append(errs, fmt.Errorf("instance %d: %v", p.ID, p.waitErr))
		}
	}
	return errors.Join(errs...)
}
