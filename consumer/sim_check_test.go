package consumer_test

import (
	"cmp"
	"context"
	"errors"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/dlq"
)

// The checker: the settlement contract of consumer/doc.go, one function per
// rule, each named after the doc's sentence (the same words appear in the
// package documentation's "# The settlement contract"). The handler start
// checks run as each handler starts; the ledger checks at every quiet moment
// of the run (synctest.Wait); the rest once Run has returned.
const (
	invOneOutcome     = "every fetched message ends in exactly one outcome"
	invOneSettlement  = "the broker is told at most one settlement per delivery, the one the outcome table names"
	invNoLateStart    = "no handler starts on a message past its deadline"
	invNeverRunLater  = "a settled message is never run later"
	invNotTwiceAtOnce = "no message runs twice at once"
	invKeyOrder       = "an ordered route runs one message of a key at a time, in delivery order"
	invWindow         = "the window and the Budget are never exceeded, and capacity comes back exactly once"
	invNothingLost    = "nothing is lost: a message is abandoned only where the contract says so"
	invLastNotNaked   = "a last delivery is never nak'd"
	invLetterFirst    = "a dead letter is written before its original is settled"
	invRunReturns     = "Run returns within ShutdownGrace + ShutdownSlack"
	invRunError       = "Run returns the error the contract names"
	invNoLeak         = "no goroutine outlives Run"
	invLedger         = "Fetched equals the sum of Settled plus Held, and counters never go backwards"
	invKeptAlive      = "a held message is kept alive"
	invHeldBackDelay  = "an ordered route runs a held-back message again only after its delay"
	invHandBackOrder  = "an ordered route hands a key's messages back in the order it took them"
	invBatchBounds    = "a batch holds at most MaxMessages messages and MaxBytes bytes (a larger message alone), and its ctx ends by its earliest deadline"
	invRiderNotFirst  = "a message of a batch is not acked ahead of an earlier message of its key in the batch"
)

// ---- at each handler start (w.mu held) ----

func (w *simWorld) checkStart(d *simDelivery, m *consumer.Message, now time.Time) {
	w.noHandlerStartsPastItsDeadline(d, m, now)
	w.settledMessageIsNeverRunLater(d)
	w.noMessageRunsTwiceAtOnce(d)
	w.orderedRouteRunsOneOfAKeyAtATimeInDeliveryOrder(d)
}

func (w *simWorld) noHandlerStartsPastItsDeadline(d *simDelivery, m *consumer.Message, now time.Time) {
	if dl, ok := m.Deadline(); ok && now.After(dl) {
		w.failf(invNoLateStart, "%s started %v after its deadline", d.id, now.Sub(dl))
	}
}

func (w *simWorld) settledMessageIsNeverRunLater(d *simDelivery) {
	switch {
	case d.settled != nil:
		w.failf(invNeverRunLater, "%s started after its outcome %v", d.id, d.settled.e.Outcome)
	case len(d.settles) > 0:
		w.failf(invNeverRunLater, "%s started after the broker was told %v", d.id, d.settles[0].s.Op)
	case d.letterStart != 0:
		w.failf(invNeverRunLater, "%s started after its dead letter was written", d.id)
	}
}

func (w *simWorld) noMessageRunsTwiceAtOnce(d *simDelivery) {
	if d.running > 1 {
		w.failf(invNotTwiceAtOnce, "%s runs %d times at once", d.id, d.running)
	}
}

// orderKey is the key an ordered route keeps order by; "" none.
func (w *simWorld) orderKey(d *simDelivery) string {
	r := w.broker(d).r
	switch r.Ordering {
	case consumer.ByKey:
		if d.lg.spec.Key == "" {
			return ""
		}
		return "k:" + d.lg.spec.Key
	case consumer.ByPartition:
		return "p:" + string(rune('0'+d.lg.spec.Part))
	}
	return ""
}

// released reports whether o no longer holds its key: settled, or
// dead-lettered without running (expired, oversize: Ordering, "Expiry":
// the key goes on; when such a letter's write fails, the route's letter
// retrier keeps it, off the key, for it never runs here). A message that
// ran and whose letter failed keeps its key until the letter is written.
func released(o *simDelivery) bool {
	return len(o.settles) > 0 || o.settled != nil || o.letterStart != 0 && !ranForItsOutcome(o)
}

// On a batch route a key's messages may run together in one batch, in
// delivery order (the riders after their key's head): an earlier message
// of the key before d in d's batch is not overtaking; that d is not acked
// ahead of it is checked once the run is over
// (ridersNotAckedAheadOfTheirKey).
func (w *simWorld) orderedRouteRunsOneOfAKeyAtATimeInDeliveryOrder(d *simDelivery) {
	k := w.orderKey(d)
	if k == "" {
		return
	}
	j := -1
	if d.batch != nil {
		j = slices.Index(d.batch.ds, d)
	}
	for _, o := range w.all {
		if o == d || o.lg.route != d.lg.route || w.orderKey(o) != k {
			continue
		}
		inBatch := j >= 0 && d.batch.before(o, j)
		if inBatch && o.fetchSeq > d.fetchSeq {
			w.failf(invKeyOrder, "%s runs in a batch after %s of its key, fetched later", d.id, o.id)
			continue
		}
		// Two deliveries of one message are told apart by Origin only: a
		// Source that leaves it empty may see both in one batch, in order.
		if inBatch && (o.lg != d.lg || d.lg.spec.NoOrigin) {
			w.riders = append(w.riders, simRiders{o, d, len(o.runs) - 1})
			continue
		}
		if o.running > 0 {
			w.failf(invKeyOrder, "%s started while %s of its key runs", d.id, o.id)
		}
		if o.fetchSeq < d.fetchSeq && o.lg != d.lg && !released(o) {
			w.overtaken = append(w.overtaken, [2]*simDelivery{o, d})
		}
	}
}

// checkBatch checks a batch as its handler starts; w.mu held.
func (w *simWorld) checkBatch(ctx context.Context, b *consumer.Batch) {
	if b.Len() == 0 {
		w.failf(invBatchBounds, "an empty batch ran")
		return
	}
	r := w.broker(w.deliveries[b.Messages[0]]).r
	if b.Len() > r.batchMax() {
		w.failf(invBatchBounds, "route r%d: a batch of %d (MaxMessages %d)", r.Index, b.Len(), r.batchMax())
	}
	if b.Len() > 1 && b.Bytes() > r.batchBytes() {
		w.failf(invBatchBounds, "route r%d: a batch of %d bytes in %d messages (MaxBytes %d)", r.Index, b.Bytes(), b.Len(), r.batchBytes())
	}
	var earliest time.Time
	for _, m := range b.Messages {
		if dl, ok := m.Deadline(); ok && (earliest.IsZero() || dl.Before(earliest)) {
			earliest = dl
		}
	}
	if bd, ok := b.Deadline(); ok != !earliest.IsZero() || ok && !bd.Equal(earliest) {
		w.failf(invBatchBounds, "route r%d: Batch.Deadline %v, earliest of its messages %v", r.Index, bd, earliest)
	}
	if !earliest.IsZero() {
		if dl, ok := ctx.Deadline(); !ok || dl.After(earliest) {
			w.failf(invBatchBounds, "route r%d: the batch's ctx ends %v (set: %v), its earliest deadline is %v", r.Index, dl, ok, earliest)
		}
	}
}

// overtakenOnlyByWhatNeverRuns judges the pairs recorded at handler
// starts: a later message of a key may start before an earlier one is
// settled only when the earlier one never runs and was expired without
// running (Ordering, "Expiry": the reaper takes it out of its key at once,
// and writes its letter afterwards, one at a time).
func (w *simWorld) overtakenOnlyByWhatNeverRuns() {
	for _, p := range w.overtaken {
		o, d := p[0], p[1]
		expired := o.letterTried == dlq.ClassExpired ||
			o.settled != nil && o.settled.e.Outcome == consumer.OutcomeExpired ||
			!w.cfg.Hook && len(o.settles) > 0 && o.settles[0].s.Op != consumer.SettleNak ||
			reapedBefore(o, d)
		if ranForItsOutcome(o) || !expired {
			w.failf(invKeyOrder, "%s started before %s, fetched earlier with its key, was settled", d.id, o.id)
		}
	}
}

// handedBackInOrder: the messages an ordered route hands back (a Nak, on
// shutdown) reach the broker in the order the route took them, per key, so
// a broker that redelivers in nak order (a JetStream durable) or from the
// last commit delivers the key in order again (order.go). Judged on each
// message's last settlement, by when it was sent; keys the broker
// redelivered on its own (a refused settlement, a duplicate) are left out.
func (w *simWorld) handedBackInOrder() {
	first := map[*simLogical]int64{}
	prev := map[*simLogical]*simDelivery{}
	dup := map[*simLogical]bool{}
	for _, d := range w.all { // in fetch order
		if _, ok := first[d.lg]; !ok {
			first[d.lg] = d.fetchSeq
		}
		if p := prev[d.lg]; p != nil && (len(p.settles) == 0 || p.settles[0].seq > d.fetchSeq) {
			dup[d.lg] = true // delivered again while held: the broker's own redelivery
		}
		prev[d.lg] = d
	}
	type back struct {
		first, nak int64
		id         string
	}
	keys := map[string][]back{}
	skip := map[string]bool{}
	for _, b := range w.routes {
		if b.r.Ordering == consumer.Unordered {
			continue
		}
		for _, l := range b.msgs {
			d := l.latest
			if d == nil {
				continue
			}
			k := w.orderKey(d)
			if k == "" {
				continue
			}
			k = itoa(b.r.Index) + "/" + k
			if l.refused || dup[l] {
				skip[k] = true
			}
			if l.done || l.lost != "" || len(d.settles) == 0 {
				continue
			}
			if s := d.settles[len(d.settles)-1]; s.s.Op == consumer.SettleNak {
				keys[k] = append(keys[k], back{first[l], s.seq, d.id})
			}
		}
	}
	for k, bs := range keys {
		if skip[k] {
			continue
		}
		slices.SortFunc(bs, func(a, b back) int { return cmp.Compare(a.first, b.first) })
		for i := 1; i < len(bs); i++ {
			if bs[i].nak < bs[i-1].nak {
				w.failf(invHandBackOrder, "key %s: %s was handed back after %s, taken after it", k, bs[i-1].id, bs[i].id)
				break
			}
		}
	}
}

// ridersNotAckedAheadOfTheirKey judges the (earlier, later) pairs of a key
// that ran in one batch: the later is not acked or terminated before the
// earlier one's settlement is sent (held and run again after it, when the
// earlier one failed); a nak (given back at shutdown) may come first, and
// so may the dead letter of a last delivery at shutdown (ClassShutdown: a
// message waiting for its key is not run then, as on a route with a
// Handler), and its expiry while it waits for its key again (the reaper's:
// Ordering, "Expiry").
func (w *simWorld) ridersNotAckedAheadOfTheirKey() {
	for _, p := range w.riders {
		o, d := p.o, p.d
		if o.runs[p.run].held {
			continue // d was held too: it is judged by its later batch
		}
		if len(d.settles) == 0 || d.settles[0].s.Op == consumer.SettleNak ||
			d.letterClass == consumer.ClassShutdown && d.settles[0].s.Op == consumer.SettleTerm {
			continue
		}
		told := d.settles[0].s
		expired := d.settled != nil && d.settled.e.Outcome == consumer.OutcomeExpired || d.letterTried == dlq.ClassExpired ||
			told.Op == consumer.SettleTerm && told.Reason == consumer.ErrExpired.Error() ||
			!w.cfg.Hook && !d.deadline.IsZero() && !d.settles[0].at.Before(d.deadline)
		if expired || !settledFromARun(d) {
			continue
		}
		if len(o.settles) == 0 || o.settles[0].seq > d.settles[0].seq {
			w.failf(invRiderNotFirst, "%s (%v) settled before %s, earlier of its key in its batch", d.id, d.settles[0].s.Op, o.id)
		}
	}
}

// reapedBefore reports whether o, never run for its outcome, was past its
// deadline when d first started and was then neither settled nor run: the
// reaper had taken it out of its key as expired (it takes every late
// waiting message at once, then writes their letters one at a time, so
// one hung write keeps the others waiting), and the shutdown abandoned it
// before its turn came.
func reapedBefore(o, d *simDelivery) bool {
	if ranForItsOutcome(o) || o.deadline.IsZero() || len(o.settles) > 0 || len(d.runs) == 0 ||
		d.runs[0].start.Before(o.deadline) {
		return false
	}
	return o.settled == nil || o.settled.e.Outcome == consumer.OutcomeAbandoned
}

// settledFromARun reports whether d's first settlement follows a run whose
// result applied: one after a held run only (or none) is a drop while it
// waited (an expiry, whose outcome a never-confirmed Ack hides), not the
// result of its run.
func settledFromARun(d *simDelivery) bool {
	var last *simRun
	for i := range d.runs {
		if d.runs[i].seq < d.settles[0].seq {
			last = &d.runs[i]
		}
	}
	return last != nil && !last.held
}

// ranForItsOutcome reports whether d ran with its result applied (a
// batch's held rider ran, but its result was not: it waited for its key
// again, and may expire there like a message that never ran).
func ranForItsOutcome(d *simDelivery) bool {
	for _, r := range d.runs {
		if !r.held {
			return true
		}
	}
	return false
}

// ---- at each quiet moment ----

// checkStats checks c's stats, quiet: no goroutine of the run is between
// two steps (synctest.Wait). It returns them as prev for the next call.
func (w *simWorld) checkStats(c *consumer.Consumer, prev []consumer.RouteStats, final bool) []consumer.RouteStats {
	st := c.Stats()
	w.mu.Lock()
	defer w.mu.Unlock()
	w.fetchedEqualsSettledPlusHeldAndCountersNeverGoBackwards(st, prev, final)
	w.windowAndBudgetNeverExceededCapacityBackOnce(st, final)
	w.expiredEarlyIsCountedOnceAmongExpired(st)
	if final {
		for _, s := range st {
			if s.Overload.Stale > 0 {
				simStaleSeeds.Add(1) // the short-queue rule acted in this seed
				break
			}
		}
	}
	return st
}

// simStaleSeeds counts the seeds in which a route settled a message as
// stale (the short-queue rule, fresh.go), so a run shows the rule is drawn.
var simStaleSeeds atomic.Int64

func (w *simWorld) fetchedEqualsSettledPlusHeldAndCountersNeverGoBackwards(st, prev []consumer.RouteStats, final bool) {
	for i, s := range st {
		var sum uint64
		for _, n := range s.Settled {
			sum += n
		}
		if s.Fetched != sum+uint64(s.Held) {
			w.failf(invLedger, "route %s: Fetched %d != Settled %d + Held %d", s.Name, s.Fetched, sum, s.Held)
		}
		handed := 0
		for _, d := range w.all {
			if "r"+itoa(d.lg.route) == s.Name {
				handed++
			}
		}
		if int(s.Fetched) != handed {
			w.failf(invLedger, "route %s: Fetched %d, the Source handed over %d", s.Name, s.Fetched, handed)
		}
		if final && s.Held != 0 {
			w.failf(invLedger, "route %s: %d still held after Run returned", s.Name, s.Held)
		}
		if prev == nil {
			continue
		}
		p := prev[i]
		back := s.Fetched < p.Fetched || s.KeepAlives < p.KeepAlives || s.Late < p.Late ||
			s.Errors.Handler < p.Errors.Handler || s.Errors.Settle < p.Errors.Settle || s.Errors.DeadLetter < p.Errors.DeadLetter ||
			s.Errors.Fetch < p.Errors.Fetch || s.Overload.ExpiredEarly < p.Overload.ExpiredEarly || s.Overload.Stale < p.Overload.Stale
		for o := range s.Settled {
			back = back || s.Settled[o] < p.Settled[o]
		}
		if back {
			w.failf(invLedger, "route %s: a counter went backwards: %+v after %+v", s.Name, s.Settled, p.Settled)
		}
	}
}

// expiredEarlyIsCountedOnceAmongExpired: "ExpiredEarly counts messages
// settled as expired (they are in Settled[OutcomeExpired])", and "Stale
// counts messages settled as expired (they are in Settled[OutcomeExpired],
// not in ExpiredEarly)": a message predicted late or stale is one outcome,
// counted once.
func (w *simWorld) expiredEarlyIsCountedOnceAmongExpired(st []consumer.RouteStats) {
	for _, s := range st {
		// Or, when its expired letter could not be written, DLQFailed or
		// abandoned (a last delivery).
		n := s.Settled[consumer.OutcomeExpired] + s.Settled[consumer.OutcomeDLQFailed] + s.Settled[consumer.OutcomeAbandoned]
		if e := s.Overload.ExpiredEarly + s.Overload.Stale; e > n+uint64(s.Held) {
			w.failf(invOneOutcome, "route %s: ExpiredEarly %d + Stale %d, but %d expired (or their letter failed) and %d held",
				s.Name, s.Overload.ExpiredEarly, s.Overload.Stale, n, s.Held)
		}
	}
}

func itoa(i int) string { return string(rune('0' + i)) }

func (w *simWorld) windowAndBudgetNeverExceededCapacityBackOnce(st []consumer.RouteStats, final bool) {
	for _, s := range st {
		win := &s.Window
		var oversize int64
		for _, d := range w.all {
			if "r"+itoa(d.lg.route) == s.Name && d.lg.spec.Size > s.WindowBytes {
				oversize = max(oversize, d.lg.spec.Size)
			}
		}
		if win.InUse < 0 || win.InUseBytes < 0 || win.Peak > s.WindowMessages || win.InUse > s.WindowMessages {
			w.failf(invWindow, "route %s: in use %d (peak %d) of %d", s.Name, win.InUse, win.Peak, s.WindowMessages)
		}
		if win.PeakBytes > max(s.WindowBytes, oversize) || win.InUseBytes > max(s.WindowBytes, oversize) {
			w.failf(invWindow, "route %s: %d bytes in use (peak %d) of %d", s.Name, win.InUseBytes, win.PeakBytes, s.WindowBytes)
		}
		if final && (win.InUse != 0 || win.InUseBytes != 0) {
			w.failf(invWindow, "route %s: %d messages and %d bytes of capacity not back after Run returned", s.Name, win.InUse, win.InUseBytes)
		}
	}
	if w.budget != nil {
		used, size := w.budget.InUse()
		if used > size || used < 0 {
			w.failf(invWindow, "Budget: %d of %d bytes in use", used, size)
		}
		if final && used != 0 {
			w.failf(invWindow, "Budget: %d bytes not back after Run returned", used)
		}
	}
}

// ---- once Run has returned ----

// checkRun checks how Run returned: err, when (returned is when the run's
// shutdown began; ok is false when it never returned).
func (w *simWorld) checkRun(err error, took time.Duration, ok bool, stuckAtReturn int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.runReturnsWithinShutdownGracePlusSlack(took, ok)
	if ok {
		w.runReturnsTheErrorTheDocNames(err, stuckAtReturn)
	}
}

func (w *simWorld) runReturnsWithinShutdownGracePlusSlack(took time.Duration, ok bool) {
	limit := w.cfg.Grace + consumer.ShutdownSlack
	switch {
	case !ok:
		w.failf(invRunReturns, "Run did not return %v after its ctx ended (grace %v), nor after every fault healed", took, w.cfg.Grace)
	case took > limit:
		w.failf(invRunReturns, "Run returned %v after its ctx ended (grace %v + slack %v)", took, w.cfg.Grace, consumer.ShutdownSlack)
	}
}

func (w *simWorld) runReturnsTheErrorTheDocNames(err error, stuck int) {
	isStuck := errors.Is(err, consumer.ErrStuckHandlers)
	switch {
	case isStuck && stuck == 0:
		w.failf(invRunError, "Run returned %v, but no handler or sink was still running", err)
	case !isStuck && stuck > 0:
		w.failf(invRunError, "Run returned %v with %d handlers or sink writes still running", err, stuck)
	}
	closed := false
	for _, b := range w.routes {
		closed = closed || b.closed && b.closeAt.Before(w.stopAt)
	}
	if errors.Is(err, consumer.ErrClosed) != closed {
		equal := false
		for _, b := range w.routes {
			equal = equal || b.closed && b.closeAt.Equal(w.stopAt)
		}
		if !equal {
			w.failf(invRunError, "Run returned %v; a Source closed: %v", err, closed)
		}
	}
}

var consumerFrame = regexp.MustCompile(`/consumer/[a-z_]+\.go:`)

// noGoroutineOutlivesRun: once Run has returned and every handler and sink
// call the simulation made hang has ended, no goroutine runs consumer code.
func (w *simWorld) noGoroutineOutlivesRun() {
	buf := make([]byte, 1<<16)
	me := string(buf[:runtime.Stack(buf, false)])
	bubble := regexp.MustCompile(`synctest bubble \d+`).FindString(me)
	if bubble == "" {
		return
	}
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	myID := strings.Fields(me)[1]
	for _, g := range strings.Split(string(buf), "\n\n") {
		head, _, _ := strings.Cut(g, "\n")
		if !strings.Contains(head, bubble+"]") || strings.Fields(head)[1] == myID {
			continue
		}
		for _, line := range strings.Split(g, "\n") {
			if consumerFrame.MatchString(line) && !strings.Contains(line, "_test.go") {
				w.mu.Lock()
				w.failf(invNoLeak, "after Run returned: %s", firstLines(g, 12))
				w.mu.Unlock()
				break
			}
		}
	}
}

func firstLines(s string, n int) string {
	ls := strings.Split(s, "\n")
	return strings.Join(ls[:min(n, len(ls))], " | ")
}

// checkDeliveries runs once the run is over and quiet.
func (w *simWorld) checkDeliveries(runErr error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.overtakenOnlyByWhatNeverRuns()
	w.handedBackInOrder()
	w.ridersNotAckedAheadOfTheirKey()
	for _, d := range w.all {
		if w.cfg.Hook {
			w.everyFetchedMessageEndsInExactlyOneOutcome(d)
		}
		w.brokerToldAtMostOneSettlementTheTableNames(d)
		w.lastDeliveryIsNeverNaked(d)
		w.deadLetterWrittenBeforeOriginalSettled(d)
		w.nothingIsLost(d, runErr)
		w.heldMessageIsKeptAlive(d)
	}
}

func (w *simWorld) everyFetchedMessageEndsInExactlyOneOutcome(d *simDelivery) {
	if d.settled == nil {
		w.failf(invOneOutcome, "%s has no outcome", d.id)
		return
	}
	for _, e := range d.events {
		if e.seq > d.settled.seq && e.e.Kind != consumer.EventEnd {
			w.failf(invOneOutcome, "%s: event %v after its outcome %v", d.id, e.e.Kind, d.settled.e.Outcome)
		}
	}
}

func (w *simWorld) brokerToldAtMostOneSettlementTheTableNames(d *simDelivery) {
	if len(d.settles) > 1 {
		w.failf(invOneSettlement, "%s: %d settlements (%v, then %v)", d.id, len(d.settles), d.settles[0].s, d.settles[1].s)
	}
	if !w.cfg.Hook || d.settled == nil {
		return
	}
	r := w.broker(d).r
	o, op := d.settled.e.Outcome, d.settled.e.Settlement
	told := consumer.Settlement{}
	if len(d.settles) > 0 {
		told = d.settles[0].s
	}
	if o == consumer.OutcomeAbandoned && len(d.settles) == 1 && d.settles[0].err == consumer.ErrPending {
		told = consumer.Settlement{} // sent, never confirmed
		op = consumer.Settlement{}
	}
	if told != op {
		w.failf(invOneSettlement, "%s: outcome %v says %+v, the broker was told %+v", d.id, o, op, told)
		return
	}
	var last *simRun
	if len(d.runs) > 0 {
		last = &d.runs[len(d.runs)-1]
	}
	bad := func(why string) { w.failf(invOneSettlement, "%s: %v told %+v: %s", d.id, o, told, why) }
	is := func(ops ...consumer.SettleOp) bool {
		for _, x := range ops {
			if told.Op == x {
				return true
			}
		}
		return false
	}
	switch o {
	case consumer.OutcomeSucceeded:
		if !is(consumer.SettleAck) || last == nil || last.err != nil || last.action == "panic" {
			bad("not an Ack of a handler's success")
		}
	case consumer.OutcomeExpired:
		want := consumer.SettleAck
		if r.OnExpired != consumer.ExpiredAck {
			want = consumer.SettleTerm
		}
		if !is(want) {
			bad("DeadLetter.OnExpired names another")
		}
	case consumer.OutcomeRetried:
		if !is(consumer.SettleNak) || last == nil || last.err == nil && last.action != "panic" ||
			consumer.IsPermanent(last.err) || last.action == "overloaded" {
			bad("not a Nak of a retryable failure")
		}
	case consumer.OutcomeOverloaded:
		if !is(consumer.SettleNak) || last == nil || last.action != "overloaded" {
			bad("not a Nak of an overloaded hand-back")
		}
	case consumer.OutcomeDeadLettered:
		if !is(consumer.SettleTerm) || !r.Sink || d.lettered == 0 {
			bad("not a Term after a dead letter")
		}
		w.deadLetterHasItsReason(d, last)
	case consumer.OutcomeDLQFailed:
		if !is(consumer.SettleNak) || d.letterTries == 0 || d.lettered != 0 {
			bad("not a Nak after a failed dead-letter write")
		}
	case consumer.OutcomeTerminated:
		if !is(consumer.SettleTerm) || r.Sink {
			bad("not a Term on a route without a sink")
		}
	case consumer.OutcomeShed:
		if r.OnShed == consumer.ShedAck && !is(consumer.SettleAck) ||
			r.OnShed == consumer.ShedNak && !(is(consumer.SettleNak) && told.Delay == max(r.ShedDelay, 0)+defaultIf(r.ShedDelay)) {
			bad("Overload.OnShed names another")
		}
	case consumer.OutcomeReturned:
		if !is(consumer.SettleNak) || told.Delay != 0 || w.stopAt.IsZero() || d.settled.at.Before(w.stopAt) {
			bad("not a Nak(0) at shutdown")
		}
	case consumer.OutcomeAbandoned:
		if told.Op != 0 {
			bad("an abandoned message was settled")
		}
	}
}

func defaultIf(d time.Duration) time.Duration {
	if d == 0 {
		return time.Second
	}
	return 0
}

// deadLetterHasItsReason: a dead letter is the table's "Permanent(err), out
// of attempts, oversize by policy, or a shed/overloaded last delivery"; a
// delivery that did not run is written only as such, or as the redelivery
// of a message whose dead-letter write failed (DLQFailed: "the redelivery is
// written again, the handler is not run again").
func (w *simWorld) deadLetterHasItsReason(d *simDelivery, last *simRun) {
	switch d.letterClass {
	case dlq.ClassOversize, consumer.ClassShed, dlq.ClassExpired:
		return
	case consumer.ClassShutdown:
		// "At shutdown a last delivery is not handed back either: ... one
		// that does not run ... is dead-lettered with class ClassShutdown."
		if !d.last || w.stopAt.IsZero() || d.letterStart == 0 {
			w.failf(invOneSettlement, "%s: dead-lettered (shutdown) but not a last delivery at shutdown (last %v)", d.id, d.last)
		}
		return
	}
	if last == nil {
		for _, o := range w.all {
			if o.lg == d.lg && o.fetchSeq < d.fetchSeq && o.letterTries > 0 && o.lettered == 0 &&
				len(o.settles) > 0 && o.settles[0].s.Op == consumer.SettleNak {
				return // the redelivery of a DLQFailed message
			}
		}
		w.failf(invOneSettlement, "%s: dead-lettered (%s) without running, and no earlier delivery of it failed its dead-letter write", d.id, d.letterClass)
		return
	}
	switch d.letterClass {
	case dlq.ClassPermanent:
		if !consumer.IsPermanent(last.err) {
			w.failf(invOneSettlement, "%s: dead-lettered as permanent after a run that returned %v (%s)", d.id, last.err, last.action)
		}
	case consumer.ClassOverloaded:
		if last.action != "overloaded" {
			w.failf(invOneSettlement, "%s: dead-lettered as overloaded after %s", d.id, last.action)
		}
	case dlq.ClassExhausted, dlq.ClassPanic, consumer.ClassRetryBudget:
		if last.err == nil && last.action != "panic" {
			w.failf(invOneSettlement, "%s: dead-lettered (%s) after a run that succeeded", d.id, d.letterClass)
		}
	}
}

func (w *simWorld) lastDeliveryIsNeverNaked(d *simDelivery) {
	for _, s := range d.settles {
		if d.last && s.s.Op == consumer.SettleNak {
			w.failf(invLastNotNaked, "%s (delivery %d of MaxDeliver %d) nak'd", d.id, d.attempt, w.broker(d).r.MaxDeliver)
		}
	}
}

func (w *simWorld) deadLetterWrittenBeforeOriginalSettled(d *simDelivery) {
	if len(d.settles) == 0 || d.letterTries == 0 {
		return
	}
	s := d.settles[0]
	if s.s.Op == consumer.SettleTerm && (d.lettered == 0 || d.lettered > s.seq) {
		w.failf(invLetterFirst, "%s terminated before its dead letter was written", d.id)
	}
	if s.s.Op == consumer.SettleAck && d.lettered != 0 {
		w.failf(invLetterFirst, "%s: dead-lettered, then acked", d.id)
	}
}

// nothingIsLost: every delivery is settled, or abandoned where the doc
// says: at shutdown, a last delivery (still queued, or its letter not
// written), a handler or sink still running past the grace (stuck), or a
// settlement never confirmed.
func (w *simWorld) nothingIsLost(d *simDelivery, runErr error) {
	if d.lg.lost == "nak on the last delivery" {
		w.failf(invNothingLost, "%s: the broker dropped it: %s", d.id, d.lg.lost)
	}
	if len(d.settles) > 0 {
		return
	}
	if w.cfg.Hook && d.settled == nil {
		return // everyFetchedMessageEndsInExactlyOneOutcome
	}
	at := w.returnedAt
	if d.settled != nil {
		at = d.settled.at
	}
	switch {
	case w.stopAt.IsZero() || at.Before(w.stopAt):
		w.failf(invNothingLost, "%s abandoned before shutdown", d.id)
	case d.last:
	case w.broker(d).r.Ordering != consumer.Unordered && d.letterTries > 0 && d.lettered == 0:
		// An ordered route retries a failed dead-letter write in place.
	case errors.Is(runErr, consumer.ErrStuckHandlers):
	default:
		w.failf(invNothingLost, "%s (delivery %d, not the last) abandoned at shutdown, and nothing was stuck", d.id, d.attempt)
	}
}

// heldMessageIsKeptAlive: a route whose Source reports an AckWait sends
// InProgress for what it holds, whatever it waits for, until its
// settlement is sent: no gap longer than the AckWait.
func (w *simWorld) heldMessageIsKeptAlive(d *simDelivery) {
	r := w.broker(d).r
	if r.AckWait <= 0 || r.KeepAlive != 0 {
		return
	}
	end := w.returnedAt
	if len(d.settles) > 0 {
		end = d.settles[0].at
	} else if d.settled != nil && d.settled.at.Before(end) {
		end = d.settled.at
	} else if d.settled == nil && !w.stopAt.IsZero() {
		end = w.stopAt // abandoned at shutdown, or not: without the Hook we cannot tell when
	}
	if !w.stopAt.IsZero() {
		// Keep-alives are settlements: their ctx ends with the others'.
		if cut := w.stopAt.Add(w.cfg.Grace + consumer.ShutdownSlack/2); end.After(cut) {
			end = cut
		}
	}
	prev := d.fetched
	for _, t := range append(append([]time.Time(nil), d.keepAlives...), end) {
		if t.After(end) {
			t = end
		}
		if t.Sub(prev) > r.AckWait {
			w.failf(invKeptAlive, "%s: no InProgress for %v (AckWait %v)", d.id, t.Sub(prev), r.AckWait)
			return
		}
		prev = t
	}
}
