package main

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/sluice-go/sluice/dlq"
)

// progress reports a long replay on stderr: on a terminal one line
// rewritten in place (at most 10 times a second), otherwise a plain line
// every interval (10 s unless --progress says).
type progress struct {
	w        io.Writer
	tty      bool
	every    time.Duration
	mu       sync.Mutex
	last     time.Time
	drawn    bool
	lastLine string
}

func newProgress(w io.Writer, every time.Duration) *progress {
	p := &progress{w: w, tty: isTerminal(w), every: every}
	if p.every <= 0 {
		p.every = 10 * time.Second
		if p.tty {
			p.every = 100 * time.Millisecond
		}
	}
	return p
}

// line formats a progress report: count, rate, parked/refused, ETA.
func progressLine(p dlq.Progress) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d moved (replayed %d, parked %d", p.Moved(), p.Replayed, p.Parked)
	if p.Refused > 0 {
		fmt.Fprintf(&b, ", refused %d", p.Refused)
	}
	b.WriteString(")")
	if left := p.Held + p.Skipped + p.Malformed; left > 0 {
		fmt.Fprintf(&b, ", %d left in place", left)
	}
	fmt.Fprintf(&b, ", %.1f/s, %v", p.Rate, p.Elapsed.Round(time.Second))
	if p.Remaining >= 0 {
		fmt.Fprintf(&b, ", %d to go, ETA %v", p.Remaining, p.ETA.Round(time.Second))
	}
	return b.String()
}

func (p *progress) update(pr dlq.Progress) {
	if pr.Done {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if now.Sub(p.last) < p.every {
		return
	}
	p.last = now
	line := progressLine(pr)
	if p.tty {
		fmt.Fprintf(p.w, "\r\x1b[K%s", line)
		p.drawn = true
		return
	}
	fmt.Fprintln(p.w, line)
}

// finish ends the rewritten line, so what follows starts on its own.
func (p *progress) finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.drawn {
		fmt.Fprintln(p.w)
		p.drawn = false
	}
}
