package consumer_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"

	"github.com/sluice-go/sluice/consumer"
)

// The simulation's configuration: everything a seed decides before the run
// (routes, traffic, which faults may happen). Each part is drawn from its own
// stream (simRand), so a shrunk run (fewer routes, fewer messages, fewer
// fault kinds: simLimits) keeps every other draw of the seed unchanged.

// Fault kinds a seed may enable; simLimits.faults masks them when shrinking.
const (
	fFetchError uint32 = 1 << iota
	fSourceClosed
	fSettleFail
	fSettleHang
	fSettlePending
	fKeepAliveFail
	fSinkFail
	fSinkHang
	fSinkSlow
	fHandlerFail
	fHandlerSlow
	fHandlerStuck
	fDuplicate
	fDeafFetch  // a fetch in flight hands over what arrives after ctx ended (a pull batch, a client's buffer)
	nFaultKinds = iota
)

var faultNames = [...]string{"fetch-error", "source-closed", "settle-fail", "settle-hang", "settle-pending",
	"keepalive-fail", "sink-fail", "sink-hang", "sink-slow", "handler-fail", "handler-slow", "handler-stuck", "duplicate", "deaf-fetch"}

func faultString(mask uint32) string {
	var s []string
	for i := range nFaultKinds {
		if mask&(1<<i) != 0 {
			s = append(s, faultNames[i])
		}
	}
	if len(s) == 0 {
		return "none"
	}
	return strings.Join(s, ",")
}

// simLimits shrinks a seed's run: which of its drawn routes run, how many
// messages each has at most, which fault kinds may happen.
type simLimits struct {
	routes uint8 // bit i: route i runs
	msgs   int
	faults uint32
	// drop lists, per route, messages left out ("" none): their IDs as
	// comma-separated numbers or ranges ("3,7-9").
	drop [4]string
}

var fullLimits = simLimits{routes: 0xf, msgs: 1 << 20, faults: 1<<nFaultKinds - 1}

func (l simLimits) String() string {
	s := fmt.Sprintf("routes=%04b,msgs=%d,faults=%x", l.routes, l.msgs, l.faults)
	for i, d := range l.drop {
		if d != "" {
			s += fmt.Sprintf(" drop%d=%s", i, d)
		}
	}
	return s
}

func parseLimits(s string) (simLimits, error) {
	l := fullLimits
	fields := strings.Fields(s)
	if len(fields) == 0 {
		return l, fmt.Errorf("empty limits")
	}
	if _, err := fmt.Sscanf(fields[0], "routes=%b,msgs=%d,faults=%x", &l.routes, &l.msgs, &l.faults); err != nil {
		return l, err
	}
	for _, f := range fields[1:] {
		var i int
		var d string
		if _, err := fmt.Sscanf(f, "drop%d=%s", &i, &d); err != nil || i < 0 || i >= len(l.drop) {
			return l, fmt.Errorf("bad %q", f)
		}
		l.drop[i] = d
	}
	return l, nil
}

// dropped reports whether message id is in the list (see simLimits.drop).
func dropped(list string, id int) bool {
	for _, part := range strings.Split(list, ",") {
		var lo, hi int
		if n, _ := fmt.Sscanf(part, "%d-%d", &lo, &hi); n == 2 {
			if id >= lo && id <= hi {
				return true
			}
		} else if n == 1 && id == lo {
			return true
		}
	}
	return false
}

// idList writes ids (sorted) as a drop list.
func idList(ids []int) string {
	var parts []string
	for i := 0; i < len(ids); {
		j := i
		for j+1 < len(ids) && ids[j+1] == ids[j]+1 {
			j++
		}
		if j > i {
			parts = append(parts, fmt.Sprintf("%d-%d", ids[i], ids[j]))
		} else {
			parts = append(parts, fmt.Sprint(ids[i]))
		}
		i = j + 1
	}
	return strings.Join(parts, ",")
}

// simRand returns the stream of draws for one part of a seed's run.
func simRand(seed uint64, parts ...uint64) *rand.Rand {
	h := uint64(0x9e3779b97f4a7c15)
	for _, p := range parts {
		h ^= p + 0x9e3779b97f4a7c15 + h<<6 + h>>2
		h *= 0xff51afd7ed558ccd
		h ^= h >> 33
	}
	return rand.New(rand.NewPCG(seed, h))
}

// Stream tags.
const (
	tagGlobal = iota + 1
	tagRoute
	tagMsg
	tagFetch
	tagSettle
	tagKeepAlive
	tagSink
	tagHandler
	tagFaults
	tagBatch
	tagBatchRun
	tagFresh
)

type deadlineKind int8

const (
	dlNone deadlineKind = iota
	dlPast
	dlTight
	dlFar
)

type temperament int8

const (
	good temperament = iota
	flaky
	poison
)

type simMsg struct {
	ID       int
	Key      string // "" none
	Part     int32
	Size     int64
	At       time.Duration // arrival after the start
	Deadline deadlineKind
	DlOff    time.Duration // deadline offset from arrival
	Crit     string        // criticality header; "" none
	Cost     int           // cost header; 0 none
	NoOrigin bool          // Origin left empty (sluicetest.Source does)
	Temper   temperament
}

type simRoute struct {
	Index          int
	Workers        int
	Ordering       consumer.Ordering
	WinMsgs        int
	WinBytes       int64
	Cost           bool
	CostMaxRunning int
	QueueOrder     consumer.QueueOrder
	Drop           consumer.DropPolicy
	MaxLength      int
	MaxCost        int
	QueueTarget    time.Duration // Overload.Queue.Target: 0 automatic, -1 off
	NoExpiry       bool
	ShedNear       time.Duration
	OnShed         consumer.ShedAction
	ShedDelay      time.Duration
	MaxAttempts    int
	BaseDelay      time.Duration
	MaxDelay       time.Duration
	RetryBudget    int // 0 none, 1 shared, 2 own
	MaxDeliver     int
	Sink           bool
	OnExpired      consumer.ExpiredAction
	OnOversize     consumer.OversizeAction
	OnOverloaded   consumer.OverloadedAction
	AckWait        time.Duration
	KeepAlive      time.Duration
	Adaptive       bool
	Reserved       int64
	Crit           int
	// A batch route (BatchHandler) and its BatchPolicy.
	Batch       bool
	BatchMax    int
	BatchBytes  int64
	BatchLinger time.Duration
	Msgs        []simMsg
}

// batchMax and batchBytes are the route's batch bounds in force (the
// defaults of BatchPolicy filled in).
func (r *simRoute) batchMax() int {
	if r.BatchMax == 0 {
		return consumer.DefaultBatchMessages
	}
	return r.BatchMax
}

func (r *simRoute) batchBytes() int64 {
	if r.BatchBytes == 0 {
		return max(1, r.WinBytes/int64(2*r.Workers))
	}
	return r.BatchBytes
}

type simConfig struct {
	Seed     uint64
	Limits   simLimits
	Grace    time.Duration
	Span     time.Duration // arrivals happen within it
	StopAt   time.Duration // Run's ctx ends then
	Budget   int64         // 0: none
	Resource bool
	Hook     bool
	Drift    bool // slow handlers get faster over the run
	Focus    int  // swarm: 1 ordered routes with few keys, costs and deadlines; 2 dead letters on last deliveries
	Faults   uint32
	Routes   []*simRoute
}

func (c *simConfig) has(f uint32) bool { return c.Faults&f != 0 }

func pick[T any](r *rand.Rand, xs ...T) T { return xs[r.IntN(len(xs))] }

func durBetween(r *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(r.Int64N(int64(hi-lo)+1))
}

// genConfig draws seed's configuration, shrunk by lim.
func genConfig(seed uint64, lim simLimits) *simConfig {
	g := simRand(seed, tagGlobal)
	c := &simConfig{Seed: seed, Limits: lim}
	c.Grace = pick(g, 10*time.Millisecond, 100*time.Millisecond, 500*time.Millisecond, 2*time.Second) + time.Duration(g.IntN(1000))*time.Microsecond
	c.Span = durBetween(g, 50*time.Millisecond, 2*time.Second)
	c.StopAt = durBetween(g, c.Span/5, c.Span*3/2) + 317*time.Microsecond
	c.Resource = g.IntN(5) == 0
	c.Hook = g.IntN(5) != 0
	c.Drift = g.IntN(2) == 0
	c.Focus = pick(g, 0, 0, 0, 0, 1, 2)
	nRoutes := 1 + g.IntN(4)
	budget := g.IntN(4) == 0
	// Faults: each kind on with its own probability, so many seeds are calm.
	f := simRand(seed, tagFaults)
	for i := range nFaultKinds {
		if f.IntN(3) != 0 {
			c.Faults |= 1 << i
		}
	}
	if c.Focus == 2 {
		c.Faults |= fSinkFail
	}
	c.Faults &= lim.faults
	for i := range nRoutes {
		r := genRoute(seed, i, c)
		if lim.routes&(1<<i) == 0 {
			continue
		}
		n := len(r.Msgs)
		r.Msgs = r.Msgs[:min(n, lim.msgs)]
		if lim.drop[i] != "" {
			kept := r.Msgs[:0]
			for _, m := range r.Msgs {
				if !dropped(lim.drop[i], m.ID) {
					kept = append(kept, m)
				}
			}
			r.Msgs = kept
		}
		c.Routes = append(c.Routes, r)
	}
	if budget {
		var total int64
		for _, r := range c.Routes {
			total += r.WinBytes
		}
		c.Budget = max(total/2, 256)
	} else {
		for _, r := range c.Routes {
			r.Reserved = 0
		}
	}
	return c
}

func genRoute(seed uint64, i int, c *simConfig) *simRoute {
	g := simRand(seed, tagRoute, uint64(i))
	r := &simRoute{Index: i}
	r.Workers = 1 + g.IntN(4)
	r.Ordering = pick(g, consumer.Unordered, consumer.Unordered, consumer.ByKey, consumer.ByPartition)
	if g.IntN(3) != 0 {
		r.WinMsgs = 1 + g.IntN(12)
	}
	r.WinBytes = pick[int64](g, 300, 1000, 4000, 1<<20)
	if g.IntN(4) == 0 {
		r.Cost = true
		if g.IntN(2) == 0 {
			r.CostMaxRunning = 1 + g.IntN(20)
		}
	}
	r.QueueOrder = pick(g, consumer.QueueFIFO, consumer.QueueFIFO, consumer.QueueLIFO, consumer.QueueCheapestFirst)
	r.Drop = pick(g, consumer.DropNewest, consumer.DropOldest, consumer.DropRandom, consumer.DropLowestCriticality)
	if g.IntN(3) == 0 {
		r.MaxLength = 1 + g.IntN(4)
	}
	if r.Cost && g.IntN(3) == 0 {
		r.MaxCost = 1 + g.IntN(30)
	}
	r.NoExpiry = g.IntN(6) == 0
	if g.IntN(3) == 0 {
		r.ShedNear = durBetween(g, time.Millisecond, 30*time.Millisecond)
	}
	r.OnShed = pick(g, consumer.ShedNak, consumer.ShedAck)
	r.ShedDelay = pick(g, 0, 5*time.Millisecond, 50*time.Millisecond)
	r.MaxAttempts = 1 + g.IntN(5)
	r.BaseDelay = durBetween(g, time.Millisecond, 30*time.Millisecond)
	r.MaxDelay = r.BaseDelay * time.Duration(1+g.IntN(8))
	r.RetryBudget = pick(g, 0, 0, 1, 2)
	if g.IntN(2) == 0 {
		r.MaxDeliver = 1 + g.IntN(5)
		r.MaxAttempts = min(r.MaxAttempts, r.MaxDeliver)
	}
	r.Sink = g.IntN(4) != 0
	r.OnExpired = pick(g, consumer.ExpiredAck, consumer.ExpiredTerm, consumer.ExpiredDeadLetter, consumer.ExpiredDeadLetter)
	r.OnOversize = pick(g, consumer.OversizeAdmitAlone, consumer.OversizeDeadLetter)
	r.OnOverloaded = pick(g, consumer.OverloadedNak, consumer.OverloadedDeadLetter)
	if g.IntN(3) == 0 {
		r.AckWait = durBetween(g, 30*time.Millisecond, 600*time.Millisecond)
		if g.IntN(5) == 0 {
			r.KeepAlive = -1
		}
	}
	r.Adaptive = g.IntN(6) == 0
	if g.IntN(3) == 0 {
		r.Reserved = int64(g.IntN(int(r.WinBytes / 2)))
	}
	r.Crit = g.IntN(4)
	// Drawn from a stream of its own, so the draws above keep their seeds.
	switch f := simRand(seed, tagFresh, uint64(i)); f.IntN(3) {
	case 0:
		r.QueueTarget = -1
	case 1:
		r.QueueTarget = durBetween(f, time.Millisecond, 60*time.Millisecond)
	}
	if c.Focus == 2 {
		r.Sink = true
		r.MaxDeliver = 1 + g.IntN(2)
		r.MaxAttempts = min(r.MaxAttempts, r.MaxDeliver)
		r.OnExpired, r.OnOversize = consumer.ExpiredDeadLetter, consumer.OversizeDeadLetter
		if g.IntN(2) == 0 {
			r.Ordering = consumer.Unordered
		}
	}
	if c.Focus == 1 {
		// Swarm testing: some seeds pile features onto one place, where
		// they meet (ordered keys, costs, deadlines, dead letters).
		r.Ordering = pick(g, consumer.ByKey, consumer.ByPartition)
		r.Cost = true
		r.NoExpiry = false
		r.OnExpired = consumer.ExpiredDeadLetter
		r.Sink = true
	}

	// Batch routes draw from their own stream: the other draws of a seed
	// stay what they were before batch routes entered the simulation.
	if bg := simRand(seed, tagBatch, uint64(i)); bg.IntN(3) == 0 {
		r.Batch = true
		r.BatchMax = pick(bg, 0, 1, 2, 3, 5, 10, 100)
		r.BatchBytes = pick[int64](bg, 0, 0, 150, 600, 5000)
		r.BatchLinger = pick(bg, 0, 0, time.Millisecond, 10*time.Millisecond, 80*time.Millisecond)
		r.CostMaxRunning = 0 // refused with a BatchHandler
	}

	nMsgs := 1 + g.IntN(60)
	if g.IntN(8) == 0 {
		nMsgs = 100 + g.IntN(200)
	}
	nKeys := 1 + g.IntN(8)
	for j := range nMsgs {
		m := simRand(seed, tagMsg, uint64(i), uint64(j))
		s := simMsg{ID: j}
		if m.IntN(5) != 0 {
			if m.IntN(2) == 0 {
				s.Key = "hot"
			} else {
				s.Key = fmt.Sprintf("k%d", m.IntN(nKeys))
			}
		}
		s.Part = int32(m.IntN(3))
		if c.Focus == 1 {
			s.Key, s.Part = pick(m, "hot", "hot", "k1"), int32(m.IntN(2))
		}
		s.Size = 1 + m.Int64N(200)
		if m.IntN(20) == 0 {
			s.Size = r.WinBytes + 1 + m.Int64N(500) // larger than the window
		}
		s.At = time.Duration(m.Int64N(int64(c.Span)))
		switch k := m.IntN(10); {
		case k < 4:
		case k < 5:
			s.Deadline, s.DlOff = dlPast, -durBetween(m, time.Millisecond, 100*time.Millisecond)
		case k < 6:
			s.Deadline, s.DlOff = dlTight, durBetween(m, time.Millisecond, 60*time.Millisecond)
		case k < 8:
			s.Deadline, s.DlOff = dlTight, durBetween(m, 50*time.Millisecond, 1500*time.Millisecond)
		default:
			s.Deadline, s.DlOff = dlFar, durBetween(m, 10*time.Second, time.Hour)
		}
		if m.IntN(4) == 0 {
			s.Crit = pick(m, "SHEDDABLE", "SHEDDABLE_PLUS", "CRITICAL", "CRITICAL_PLUS", "bogus")
		}
		if m.IntN(3) == 0 || c.Focus == 1 {
			s.Cost = 1 + m.IntN(30)
		}
		if c.Focus == 1 && s.Deadline != dlNone {
			s.Deadline, s.DlOff = dlTight, durBetween(m, 20*time.Millisecond, 600*time.Millisecond)
		}
		s.NoOrigin = m.IntN(3) == 0
		switch k := m.IntN(10); {
		case k < 6:
			s.Temper = good
		case k < 8:
			s.Temper = flaky
		default:
			s.Temper = poison
		}
		r.Msgs = append(r.Msgs, s)
	}
	return r
}

// String is the configuration in one block, for a failing seed's report.
func (c *simConfig) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "grace=%v span=%v stop=%v budget=%d resource=%v hook=%v drift=%v focus=%d faults=%s\n",
		c.Grace, c.Span, c.StopAt, c.Budget, c.Resource, c.Hook, c.Drift, c.Focus, faultString(c.Faults))
	for _, r := range c.Routes {
		fmt.Fprintf(&b, "  route r%d: workers=%d %v window=%d/%dB cost=%v/%d queue=%d drop=%d maxlen=%d maxcost=%d target=%v noexpiry=%v shednear=%v onshed=%d sheddelay=%v attempts=%d backoff=%v..%v retrybudget=%d maxdeliver=%d sink=%v onexpired=%d onoversize=%d onoverloaded=%d ackwait=%v keepalive=%v adaptive=%v reserved=%d crit=%d batch=%v/%d/%dB/%v msgs=%d\n",
			r.Index, r.Workers, r.Ordering, r.WinMsgs, r.WinBytes, r.Cost, r.CostMaxRunning, r.QueueOrder, r.Drop, r.MaxLength, r.MaxCost, r.QueueTarget,
			r.NoExpiry, r.ShedNear, r.OnShed, r.ShedDelay, r.MaxAttempts, r.BaseDelay, r.MaxDelay, r.RetryBudget, r.MaxDeliver,
			r.Sink, r.OnExpired, r.OnOversize, r.OnOverloaded, r.AckWait, r.KeepAlive, r.Adaptive, r.Reserved, r.Crit, r.Batch, r.BatchMax, r.BatchBytes, r.BatchLinger, len(r.Msgs))
		for _, m := range r.Msgs {
			fmt.Fprintf(&b, "    m%d key=%q part=%d size=%d at=%v deadline=%d%+v crit=%q cost=%d noorigin=%v temper=%d\n",
				m.ID, m.Key, m.Part, m.Size, m.At, m.Deadline, m.DlOff, m.Crit, m.Cost, m.NoOrigin, m.Temper)
		}
	}
	return b.String()
}
