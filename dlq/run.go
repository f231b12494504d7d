package dlq

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"sync"
	"time"
)

// Run replays letters from src to dst until src is drained, Max letters
// moved, ctx is done, or a publish fails. It returns what it did; the error
// is nil when src was drained or Max reached, ctx.Err() when cancelled,
// a *NoDestinationError when ReplayOptions names no destination policy,
// else wraps ErrPublish, ErrRemove or the source's error. Letters not moved
// are left in the source.
//
// Batches start on their paced slots while earlier ones may still be in
// flight (up to Concurrency). When one fails, no new move starts, and the
// moves already started finish: every republish the target confirmed is
// removed and counted, so a resumed replay does not repeat it.
func (r *Replayer) Run(ctx context.Context, src Source, dst Target) (Progress, error) {
	rn := &run{r: r, src: src, dst: dst, start: time.Now(), sem: make(chan struct{}, r.opts.Concurrency),
		scan: !r.policy} // a dry run too: it predicts the real run
	rn.st.Remaining = -1
	p, err := rn.loop(ctx)
	if rn.scan && err == nil {
		return p, &NoDestinationError{Asked: p.Destinations}
	}
	return p, err
}

// run is the state of one Run.
type run struct {
	r     *Replayer
	src   Source
	dst   Target
	start time.Time
	scan  bool // no policy: read the pass, move nothing, name what is asked
	sem   chan struct{}
	wg    sync.WaitGroup

	mu      sync.Mutex // guards st, dests, failErr, inHand
	st      Progress
	inHand  int // fetched, not decided yet (counted in Remaining)
	dests   destTally
	failErr error
}

// move is one letter the run moves: a replay to dest, or a park with reason.
type move struct {
	a      Action
	p      *Pending
	dest   string
	reason string
}

func (rn *run) loop(ctx context.Context) (Progress, error) {
	r := rn.r
	paced := !r.opts.DryRun && !rn.scan
	rnd := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	if paced && r.jit > 0 {
		// Full jitter on start: the rate's grid is anchored after it, so
		// replayers started together also tick on different phases.
		if err := sleepUntil(ctx, rn.start.Add(time.Duration(rnd.Int64N(int64(r.jit))))); err != nil {
			return rn.report(true), err
		}
	}
	pc := newPacer(r.every, r.batch, r.jit, rnd, time.Now())
	moved := 0
	for !rn.failed() {
		n := r.fetch
		if !paced {
			n = max(r.batch, 256)
		}
		if r.opts.Max > 0 {
			if moved >= r.opts.Max {
				break
			}
			n = min(n, r.opts.Max-moved)
		}
		items, err := rn.src.Fetch(ctx, n)
		if errors.Is(err, ErrDrained) {
			break
		}
		if err != nil {
			rn.wg.Wait()
			if ctx.Err() != nil {
				return rn.report(true), ctx.Err()
			}
			return rn.report(true), fmt.Errorf("sluice: replay: fetch: %w", err)
		}
		rn.mu.Lock()
		rn.inHand += len(items)
		rn.mu.Unlock()
		var moves []move
		for _, p := range items {
			mv, now := rn.plan(p)
			switch {
			case !now && paced:
				moves = append(moves, mv)
			case !now: // dry run or scan: decided, not done
				rn.decide(mv.a, mv.p, mv.dest, mv.reason, !rn.scan && (mv.a == ActionPark || (mv.a == ActionRefuse && r.opts.Park != nil)))
				moved++
			default:
				rn.decide(mv.a, mv.p, mv.dest, mv.reason, false)
			}
		}
		for len(moves) > 0 && !rn.failed() {
			unit := moves[:min(r.batch, len(moves))]
			moves = moves[len(unit):]
			if err := sleepUntil(ctx, pc.next(time.Now(), len(unit))); err != nil {
				rn.wg.Wait()
				return rn.report(true), err
			}
			if err := rn.dispatch(ctx, unit); err != nil {
				rn.wg.Wait()
				return rn.report(true), err
			}
			moved += len(unit)
			rn.report(false)
		}
	}
	rn.wg.Wait()
	rn.mu.Lock()
	err := rn.failErr
	rn.mu.Unlock()
	return rn.report(true), err
}

// plan classifies p. It returns the move and whether it is decided at once
// (left in place: skipped, malformed, held, refused without a Park).
func (rn *run) plan(p *Pending) (move, bool) {
	r := rn.r
	l := p.Letter
	switch {
	case l == nil || p.Err != nil:
		return move{a: ActionMalformed, p: p, reason: errText(p.Err)}, true
	case !r.opts.Filter.Match(l):
		return move{a: ActionSkip, p: p}, true
	case r.opts.MaxReplays > 0 && l.Replays >= r.opts.MaxReplays:
		reason := fmt.Sprintf("replayed %d times already (loop guard: at most %d)", l.Replays, r.opts.MaxReplays)
		if r.opts.Park == nil {
			return move{a: ActionHold, p: p, reason: reason}, true
		}
		return move{a: ActionPark, p: p, reason: reason}, false
	case l.Truncated != "":
		return rn.refuse(p, l.Origin.Topic, "truncated when dead-lettered, so not the original message: "+l.Truncated)
	}
	dest, requested, err := r.destination(l)
	if err != nil {
		return rn.refuse(p, requested, strings.TrimPrefix(err.Error(), ErrRefused.Error()+": "))
	}
	return move{a: ActionReplay, p: p, dest: dest}, false
}

func (rn *run) refuse(p *Pending, dest, reason string) (move, bool) {
	return move{a: ActionRefuse, p: p, dest: dest, reason: reason}, rn.r.opts.Park == nil
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// decide records a decided letter: counts, destinations, Leave, OnLetter.
func (rn *run) decide(a Action, p *Pending, dest, reason string, parked bool) {
	live := !rn.r.opts.DryRun && !rn.scan
	if rn.scan && a == ActionPark {
		a = ActionHold // a scan parks nothing
	}
	rn.mu.Lock()
	rn.inHand--
	switch a {
	case ActionReplay:
		rn.st.Replayed++
		rn.dests.add(dest, "")
	case ActionPark:
		rn.st.Parked++
	case ActionHold:
		rn.st.Held++
	case ActionSkip:
		rn.st.Skipped++
	case ActionMalformed:
		rn.st.Malformed++
	case ActionRefuse:
		rn.st.Refused++
		if parked {
			rn.st.Parked++
		} else {
			rn.st.Held++
		}
		if reason == "" {
			reason = "refused"
		}
		rn.dests.add(dest, reason)
	}
	rn.mu.Unlock()
	if rn.scan {
		return
	}
	if p.Leave != nil && live && a != ActionReplay && a != ActionPark && !(a == ActionRefuse && parked) {
		p.Leave()
	}
	if rn.r.opts.OnLetter != nil {
		rn.r.opts.OnLetter(Decision{Action: a, Pending: p, Destination: dest, Reason: reason, Parked: parked})
	}
}

func (rn *run) fail(err error) {
	rn.mu.Lock()
	if rn.failErr == nil {
		rn.failErr = err
	}
	rn.mu.Unlock()
}

func (rn *run) failed() bool {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	return rn.failErr != nil
}

// report builds a Progress and passes it to ReplayOptions.Progress.
func (rn *run) report(done bool) Progress {
	r := rn.r
	rn.mu.Lock()
	p := rn.st
	if done {
		p.Destinations = rn.dests.list()
	}
	inHand := max(rn.inHand, 0)
	rn.mu.Unlock()
	p.Elapsed = time.Since(rn.start)
	if s := p.Elapsed.Seconds(); s > 0 {
		p.Rate = float64(p.Moved()) / s
	}
	p.Remaining = -1
	if sz, ok := rn.src.(Sizer); ok {
		p.Remaining = sz.Remaining() + inHand
		if r.opts.Max > 0 {
			p.Remaining = min(p.Remaining, max(r.opts.Max-p.Moved(), 0))
		}
	}
	if p.Remaining >= 0 && !r.opts.DryRun {
		pace := r.every
		if p.Elapsed > time.Second && p.Rate < pace {
			pace = p.Rate
		}
		if pace > 0 && !math.IsInf(pace, 1) {
			p.ETA = time.Duration(float64(p.Remaining) / pace * float64(time.Second))
		}
	}
	p.Done = done
	if r.opts.Progress != nil && !rn.scan {
		r.opts.Progress(p)
	}
	return p
}

// dispatch starts the moves of one paced unit, waiting for a free
// Concurrency slot for each (one for the whole unit on a BatchTarget). It
// returns ctx's error if ctx ended while waiting; moves not started stay
// in the source.
func (rn *run) dispatch(ctx context.Context, unit []move) error {
	now := time.Now()
	acquire := func() error {
		select {
		case rn.sem <- struct{}{}:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	if bt, ok := rn.dst.(BatchTarget); ok {
		if err := acquire(); err != nil {
			return err
		}
		rn.wg.Go(func() {
			defer func() { <-rn.sem }()
			rn.execBatch(ctx, bt, unit, now)
		})
		return nil
	}
	for _, mv := range unit {
		if rn.failed() {
			return nil
		}
		if err := acquire(); err != nil {
			return err
		}
		rn.wg.Go(func() {
			defer func() { <-rn.sem }()
			rn.exec(ctx, mv, now, nil, false)
		})
	}
	return nil
}

// execBatch publishes the unit's replays in one PublishBatch (retrying the
// failed ones), then settles every move: a confirmed republish is removed
// and counted whatever happened to the others.
func (rn *run) execBatch(ctx context.Context, bt BatchTarget, unit []move, now time.Time) {
	res := rn.publishBatch(ctx, bt, unit, now)
	for i, mv := range unit {
		perr, published := res[i]
		rn.exec(ctx, mv, now, perr, published)
	}
}

// exec performs one move. With published set, the republish was already
// tried (perr is its result).
func (rn *run) exec(ctx context.Context, mv move, now time.Time, perr error, published bool) {
	r := rn.r
	if mv.a == ActionReplay {
		if !published {
			if rn.failed() || ctx.Err() != nil {
				return // not started: the letter stays
			}
			out := r.outgoing(mv.p, mv.dest, now)
			perr = r.retry(ctx, func() error { return rn.dst.Publish(ctx, out) })
		}
		switch {
		case perr == nil:
			rn.remove(ctx, mv, false)
			return
		case errors.Is(perr, ErrUndeliverable) && ctx.Err() == nil:
			// The destination cannot take it: park it with the reason, go on.
			mv = move{a: ActionRefuse, p: mv.p, dest: mv.dest, reason: perr.Error()}
			if r.opts.Park == nil {
				rn.decide(mv.a, mv.p, mv.dest, mv.reason, false)
				return
			}
		default:
			rn.failMove(ctx, mv, perr)
			return
		}
	}
	// A park (loop guard or refused).
	if rn.failed() || ctx.Err() != nil {
		return // the run is stopping: the letter stays
	}
	pl := *mv.p.Letter
	pl.ParkReason = mv.reason
	if err := r.retry(ctx, func() error { return r.opts.Park.Write(ctx, &pl) }); err != nil {
		rn.failMove(ctx, mv, err)
		return
	}
	rn.remove(ctx, mv, true)
}

func (rn *run) failMove(ctx context.Context, mv move, err error) {
	if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
		rn.fail(ctx.Err())
		return
	}
	rn.fail(fmt.Errorf("%w: %s: %w", ErrPublish, mv.p.Pos, err))
}

// remove deletes a letter whose move was confirmed, then counts it. It
// runs even if ctx was cancelled just now: the letter must go.
func (rn *run) remove(ctx context.Context, mv move, parked bool) {
	if mv.p.Remove != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		err := mv.p.Remove(rctx)
		cancel()
		if err != nil {
			rn.mu.Lock()
			rn.st.Unremoved++
			rn.mu.Unlock()
			rn.fail(fmt.Errorf("%w: %s: %w", ErrRemove, mv.p.Pos, err))
			return
		}
	}
	rn.decide(mv.a, mv.p, mv.dest, mv.reason, parked)
}

// publishBatch publishes the replays of unit through bt, retrying the
// failed ones (not the undeliverable), and returns each one's final error
// by index in unit.
func (rn *run) publishBatch(ctx context.Context, bt BatchTarget, unit []move, now time.Time) map[int]error {
	r := rn.r
	res := map[int]error{}
	var idx []int
	var outs []*Outgoing
	for i, mv := range unit {
		if mv.a == ActionReplay {
			idx, outs = append(idx, i), append(outs, r.outgoing(mv.p, mv.dest, now))
		}
	}
	backoff := 100 * time.Millisecond
	for attempt := 0; len(outs) > 0; attempt++ {
		if rn.failed() || ctx.Err() != nil {
			for _, i := range idx {
				delete(res, i) // not (re)tried: the letters stay
			}
			break
		}
		errs := bt.PublishBatch(ctx, outs)
		var retryIdx []int
		var retryOuts []*Outgoing
		for j, out := range outs {
			var err error
			if errs != nil {
				err = errs[j]
			}
			res[idx[j]] = err
			if err != nil && !errors.Is(err, ErrUndeliverable) {
				retryIdx, retryOuts = append(retryIdx, idx[j]), append(retryOuts, out)
			}
		}
		if len(retryOuts) == 0 || attempt == r.opts.Attempts-1 || ctx.Err() != nil {
			break
		}
		if sleepUntil(ctx, time.Now().Add(backoff/2+rand.N(backoff/2+1))) != nil {
			break
		}
		backoff *= 2
		idx, outs = retryIdx, retryOuts
	}
	return res
}

// retry calls f up to Attempts times with jittered exponential backoff. An
// undeliverable error is final at once.
func (r *Replayer) retry(ctx context.Context, f func() error) error {
	var err error
	backoff := 100 * time.Millisecond
	for i := range r.opts.Attempts {
		if err = f(); err == nil || ctx.Err() != nil || errors.Is(err, ErrUndeliverable) {
			return err
		}
		if i == r.opts.Attempts-1 {
			break
		}
		d := backoff/2 + rand.N(backoff/2+1)
		if serr := sleepUntil(ctx, time.Now().Add(d)); serr != nil {
			return err
		}
		backoff *= 2
	}
	return err
}
