package fleet

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"
)

// End is how an instance's process ended.
type End int8

const (
	Running    End = iota // still running (or never started)
	Terminated            // SIGTERM: a graceful stop
	Killed                // SIGKILL
)

func (e End) String() string {
	switch e {
	case Terminated:
		return "terminated"
	case Killed:
		return "killed"
	}
	return "running"
}

// Cause says why a message was handled again: what happened to the
// instance that handled it the time before.
type Cause int8

const (
	// CauseKillInFlight: the previous instance was killed after handling
	// the message and before the broker had its settlement (it was in the
	// instance's window).
	CauseKillInFlight Cause = iota
	// CauseKillSettled: the previous instance was killed after it settled
	// the message but before the settlement was committed (Kafka commits
	// each CommitInterval; the next owner starts from the last commit and
	// its settled-offset map).
	CauseKillSettled
	// CauseGraceful: the previous instance had stopped gracefully
	// (SIGTERM) before the message was handled again.
	CauseGraceful
	// CauseLive: the previous instance was still running: its partition
	// was revoked before it settled in time (Kafka RevokeGrace), or its
	// AckWait ran out (NATS).
	CauseLive
	numCauses
)

var causeNames = [numCauses]string{"kill, in flight", "kill, settled after the last commit", "graceful stop", "previous handler alive"}

func (c Cause) String() string { return causeNames[c] }

type handling struct {
	inst    int
	at      time.Time
	settled bool
}

type instance struct {
	end     End
	endedAt time.Time
	settles []time.Time // when each of its settlements was reported
}

// maxID bounds the ids a ledger accepts (a garbled line must not make it
// allocate without limit).
const maxID = 1 << 24

// Ledger records which instance handled and settled each produced message
// (ids 0..n-1), and how each instance ended. It is safe for concurrent use.
type Ledger struct {
	mu       sync.Mutex
	produced int
	handled  [][]handling
	insts    map[int]*instance
	unknown  int // lines about ids out of range, or settled before handled
	// redelivered counts handlings of a message the broker had delivered
	// before (NATS: the held messages of a killed instance, after AckWait).
	redelivered int
}

// NewLedger returns an empty ledger.
func NewLedger() *Ledger { return &Ledger{insts: map[int]*instance{}} }

// Produced records that the broker has every id below n.
func (l *Ledger) Produced(n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.produced = max(l.produced, n)
	l.grow(n)
}

// grow makes room for ids below n. A consumer may report an id before the
// producer has heard the broker's acknowledgement of it.
func (l *Ledger) grow(n int) {
	for len(l.handled) < n {
		l.handled = append(l.handled, nil)
	}
}

// ProducedCount returns the number of ids produced.
func (l *Ledger) ProducedCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.produced
}

func (l *Ledger) inst(id int) *instance {
	in := l.insts[id]
	if in == nil {
		in = &instance{}
		l.insts[id] = in
	}
	return in
}

// Handled records that instance inst finished handling message id, which
// the broker delivered for the attempt-th time (NATS counts deliveries;
// Kafka has no count: always 1).
func (l *Ledger) Handled(inst, id, attempt int, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.inst(inst)
	if attempt > 1 {
		l.redelivered++
	}
	if id < 0 || id >= maxID {
		l.unknown++
		return
	}
	l.grow(id + 1)
	l.handled[id] = append(l.handled[id], handling{inst: inst, at: at})
}

// Settled records that instance inst settled message id (its last
// handling of it).
func (l *Ledger) Settled(inst, id int, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	in := l.inst(inst)
	in.settles = append(in.settles, at)
	if id < 0 || id >= len(l.handled) { // no handled line before it
		l.unknown++
		return
	}
	hs := l.handled[id]
	for i := len(hs) - 1; i >= 0; i-- {
		if hs[i].inst == inst {
			hs[i].settled = true
			return
		}
	}
	l.unknown++ // settled without a handled line: the protocol is broken
}

// Ended records how instance inst ended.
func (l *Ledger) Ended(inst int, how End, at time.Time) {
	l.mu.Lock()
	defer l.mu.Unlock()
	in := l.inst(inst)
	in.end, in.endedAt = how, at
}

// Missing returns how many produced ids no instance has handled yet.
func (l *Ledger) Missing() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, hs := range l.handled[:l.produced] {
		if len(hs) == 0 {
			n++
		}
	}
	return n
}

// Bounds is what the settlement contract allows a killed instance to leave
// behind to be handled again.
type Bounds struct {
	// Window is an instance's route window: what it may hold unsettled.
	Window int
	// CommitLag is how long a settled message may stay uncommitted (Kafka:
	// the CommitInterval plus a commit's round trip); 0 where the broker
	// has a settlement once it is confirmed (NATS).
	CommitLag time.Duration
}

// KillReport is one SIGKILL's share of the duplicates.
type KillReport struct {
	Inst int
	At   time.Time
	// InFlight and SettledLate are the duplicates it caused: messages it
	// had handled but not settled, and settled within CommitLag of the kill.
	InFlight, SettledLate int
	// Bound is Window plus what it settled within CommitLag before the kill.
	Bound int
}

// Report is the ledger's account at the end of a run.
type Report struct {
	Produced int
	Unique   int   // ids handled at least once
	Lost     []int // produced ids nobody handled (the first 20)
	NumLost  int
	// Unsettled counts ids handled but never reported settled by anyone.
	Unsettled int
	// Duplicates counts handlings beyond the first, by cause.
	Duplicates int
	ByCause    [numCauses]int
	Kills      []KillReport
	// OverBound lists the kills whose duplicates exceed their bound.
	OverBound []KillReport
	Unknown   int // protocol lines about ids never produced
	// Redelivered counts handlings of messages the broker had delivered
	// before: on NATS, those a killed instance held (handled or not) come
	// back after AckWait. Kafka does not count deliveries (always 0).
	Redelivered int
}

// Report tallies the ledger against b.
func (l *Ledger) Report(b Bounds) Report {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := Report{Produced: l.produced, Unknown: l.unknown, Redelivered: l.redelivered}
	for _, hs := range l.handled[l.produced:] {
		if len(hs) > 0 {
			r.Unknown++ // handled, but never produced
		}
	}
	kills := map[int]*KillReport{}
	for id, hs := range l.handled[:l.produced] {
		if len(hs) == 0 {
			r.NumLost++
			if len(r.Lost) < 20 {
				r.Lost = append(r.Lost, id)
			}
			continue
		}
		r.Unique++
		if !slices.ContainsFunc(hs, func(h handling) bool { return h.settled }) {
			r.Unsettled++
		}
		for j := 1; j < len(hs); j++ {
			prev, again := hs[j-1], hs[j]
			in := l.insts[prev.inst]
			c := CauseLive
			if in.end != Running && !in.endedAt.After(again.at) {
				switch {
				case in.end == Terminated:
					c = CauseGraceful
				case prev.settled:
					c = CauseKillSettled
				default:
					c = CauseKillInFlight
				}
			}
			r.Duplicates++
			r.ByCause[c]++
			if c == CauseKillInFlight || c == CauseKillSettled {
				k := kills[prev.inst]
				if k == nil {
					k = &KillReport{Inst: prev.inst, At: in.endedAt}
					kills[prev.inst] = k
				}
				if c == CauseKillSettled {
					k.SettledLate++
				} else {
					k.InFlight++
				}
			}
		}
	}
	for id, in := range l.insts {
		if in.end != Killed {
			continue
		}
		k := kills[id]
		if k == nil {
			k = &KillReport{Inst: id, At: in.endedAt}
		}
		late := 0
		for _, t := range in.settles {
			if !t.Before(in.endedAt.Add(-b.CommitLag)) {
				late++
			}
		}
		k.Bound = b.Window + late
		r.Kills = append(r.Kills, *k)
		if k.InFlight+k.SettledLate > k.Bound {
			r.OverBound = append(r.OverBound, *k)
		}
	}
	sort.Slice(r.Kills, func(i, j int) bool { return r.Kills[i].At.Before(r.Kills[j].At) })
	return r
}

// String is the report as a few lines of text.
func (r Report) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "produced %d, handled %d unique, lost %d", r.Produced, r.Unique, r.NumLost)
	if r.NumLost > 0 {
		fmt.Fprintf(&b, " (first: %v)", r.Lost)
	}
	fmt.Fprintf(&b, ", never reported settled %d\n", r.Unsettled)
	fmt.Fprintf(&b, "handled on a redelivery %d; duplicates %d:", r.Redelivered, r.Duplicates)
	for c := range numCauses {
		fmt.Fprintf(&b, " %s %d;", c, r.ByCause[c])
	}
	b.WriteString("\n")
	for _, k := range r.Kills {
		fmt.Fprintf(&b, "  SIGKILL of instance %d: %d duplicates (%d in flight, %d settled after the last commit), bound %d\n",
			k.Inst, k.InFlight+k.SettledLate, k.InFlight, k.SettledLate, k.Bound)
	}
	if r.Unknown > 0 {
		fmt.Fprintf(&b, "%d protocol lines about unknown ids\n", r.Unknown)
	}
	return b.String()
}
