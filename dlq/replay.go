package dlq

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/sluice-go/sluice/backpressure"
	"github.com/sluice-go/sluice/expiry"
)

// HeaderReplayCount is set on every replayed message: how many times it has
// been replayed, this time included. It is not an envelope header (it has no
// Sluice-Dlq- prefix), so a consumer that dead-letters the replayed message
// again keeps it among the original headers, and EnvelopeHeaders and Decode
// read it back into Letter.Replays: the loop guard holds across
// die → replay → die cycles without the consumer knowing about replays.
const HeaderReplayCount = "Sluice-Replay-Count"

// Defaults of ReplayOptions.
const (
	DefaultRate          = 100                   // letters per second
	DefaultBatchInterval = 50 * time.Millisecond // batch spacing Burst is sized for
	DefaultConcurrency   = 8
	DefaultMaxReplays    = 3
	DefaultAttempts      = 3
	DefaultBatchUnpaced  = 100 // batch size when Rate is unlimited
)

var (
	// ErrInvalidOption is returned by NewReplayer for an option it cannot
	// use. It is backpressure.ErrInvalidOption, shared by all of sluice.
	ErrInvalidOption = backpressure.ErrInvalidOption
	// ErrDrained is returned by Source.Fetch when it has nothing more to
	// give in this pass: the replay is complete.
	ErrDrained = errors.New("sluice: dead-letter source drained")
	// ErrPublish wraps the error of a republish (or park) the target did not
	// confirm. The letter is still in the dead-letter queue.
	ErrPublish = errors.New("sluice: replay publish failed")
	// ErrRemove wraps the error of removing a letter whose republish was
	// confirmed: a resumed replay will publish it again (a duplicate).
	ErrRemove = errors.New("sluice: dead letter republished but not removed")
	// ErrNoDestination is returned (wrapped in ErrPublish) for a letter
	// with no origin topic when ReplayOptions.Topic is "".
	ErrNoDestination = errors.New("sluice: no destination topic for replay")
)

// Pending is one stored message read from a Source, not yet removed.
type Pending struct {
	// Letter is the decoded dead letter; nil when Err is set.
	Letter *Letter
	// Err says why the stored message is not a readable letter (it wraps
	// ErrMalformed). Such messages are counted and left where they are.
	Err error
	// Pos names where it is stored ("SLUICE_DLQ#42", "orders.dlq/0@17").
	// It is stable, so targets can use it to deduplicate a republish.
	Pos string
	// Remove deletes the message from the source (delete, ack, commit). The
	// Replayer calls it only after the target confirmed the republish.
	Remove func(ctx context.Context) error
	// Leave, if set, is called when a replay (not a dry run) leaves the
	// letter in place: filtered out, held by the loop guard, or malformed.
	// A source that cannot keep one letter while moving past it (Kafka's
	// committed offset) records it as passed; others leave Leave nil.
	Leave func()
}

// Source yields stored dead letters in batches. Fetch blocks until it has
// at least one, and returns at most n; it returns ErrDrained once the pass
// is over (every letter present when the pass began was returned). A letter
// that is returned and never removed stays in the queue for a later pass.
// Fetch is called from one goroutine; Remove from many.
type Source interface {
	Fetch(ctx context.Context, n int) ([]*Pending, error)
}

// SourceFunc adapts a function to Source.
type SourceFunc func(ctx context.Context, n int) ([]*Pending, error)

// Fetch calls f.
func (f SourceFunc) Fetch(ctx context.Context, n int) ([]*Pending, error) { return f(ctx, n) }

// Sizer is implemented by sources that know how many letters are left in
// the pass, for progress and ETA. -1 means unknown.
type Sizer interface {
	Remaining() int
}

// Outgoing is one message the Replayer republishes.
type Outgoing struct {
	// Topic is the destination: ReplayOptions.Topic, else the letter's
	// origin topic (Kafka) or subject (NATS).
	Topic   string
	Key     []byte
	Value   []byte
	Headers map[string][]string // the original headers, envelope removed, HeaderReplayCount and deadline set
	Letter  *Letter             // the letter it came from; read-only
	Pos     string              // the letter's Pending.Pos
}

// Target republishes messages. Publish returns only after the broker
// confirmed the message; an error means it may not be stored, and the
// letter is kept. It must be safe for concurrent use.
type Target interface {
	Publish(ctx context.Context, m *Outgoing) error
}

// BatchTarget is a Target that publishes a whole batch in one round trip
// (Kafka: one produce request). The Replayer uses PublishBatch when the
// target has it. It returns nil when every message was confirmed, else one
// error per message (nil for those confirmed).
type BatchTarget interface {
	Target
	PublishBatch(ctx context.Context, ms []*Outgoing) []error
}

// TargetFunc adapts a function to Target.
type TargetFunc func(ctx context.Context, m *Outgoing) error

// Publish calls f.
func (f TargetFunc) Publish(ctx context.Context, m *Outgoing) error { return f(ctx, m) }

// Action is what the Replayer did (or, in a dry run, would do) with a letter.
type Action int

const (
	ActionReplay    Action = iota // republished to the target, then removed
	ActionPark                    // over MaxReplays: written to Park, then removed
	ActionHold                    // over MaxReplays with no Park: left in the queue
	ActionSkip                    // not matched by the filter: left in the queue
	ActionMalformed               // not a readable letter: left in the queue
)

var actionNames = [...]string{"replay", "park", "hold", "skip", "malformed"}

func (a Action) String() string {
	if a >= 0 && int(a) < len(actionNames) {
		return actionNames[a]
	}
	return "action(" + strconv.Itoa(int(a)) + ")"
}

// ReplayOptions configure a Replayer. The zero value replays at 100
// letters/s in jittered batches of 5, 8 at a time, parks nothing (letters
// replayed 3 times already are held), and drops the stale deadline header.
type ReplayOptions struct {
	// Rate is the pace in letters moved (replayed or parked) per second.
	// 0 means DefaultRate; math.Inf(1) means unpaced. Negative is invalid.
	Rate float64
	// Burst is the batch size: letters fetched, paced and published
	// together, so one timer serves a batch (a coarse timer still holds the
	// rate). 0 means Rate × DefaultBatchInterval rounded up (at least 1),
	// or DefaultBatchUnpaced when unpaced.
	Burst int
	// Jitter is the largest random delay added before the first batch and
	// to each batch's paced slot ("full jitter": uniform in [0, Jitter)).
	// Slots stay on the rate's grid, so jitter does not lower the rate
	// while it is below one batch interval. 0 means one batch interval
	// (Burst/Rate); negative means none.
	Jitter time.Duration
	// Concurrency bounds publishes in flight within a batch. 0 means
	// DefaultConcurrency.
	Concurrency int
	// Filter selects the letters to move; the others are left in place.
	Filter Filter
	// DryRun decides every letter (OnLetter sees it) but moves, parks and
	// removes nothing, unpaced.
	DryRun bool
	// Max stops after this many letters moved (replayed + parked). 0 means
	// no limit.
	Max int
	// MaxReplays is the loop guard: a letter replayed this many times
	// already (Letter.Replays ≥ MaxReplays) goes to Park instead. 0 means
	// DefaultMaxReplays; negative disables the guard.
	MaxReplays int
	// Park receives letters over MaxReplays; each is removed from the
	// source only after Park.Write returned nil. nil means they are held
	// (left in the queue and counted).
	Park Sink
	// Topic overrides the destination of every republish. "" means each
	// letter's origin topic.
	Topic string
	// Deadline is the fresh deadline policy of republished messages: > 0
	// sets DeadlineHeader to publish time + Deadline; 0 removes the stale
	// header (a consumer's MaxAge then counts from the republish); < 0
	// keeps the original header as it was.
	Deadline time.Duration
	// DeadlineHeader names the deadline header. "" means expiry.DefaultHeader.
	DeadlineHeader string
	// Attempts is how many times a republish is tried (jittered backoff
	// from 100 ms) before the replay stops with ErrPublish. 0 means
	// DefaultAttempts.
	Attempts int
	// Progress, if set, is called after every batch and once at the end,
	// from Run's goroutine.
	Progress func(Progress)
	// OnLetter, if set, is called for every letter decided: after its move
	// is confirmed, or at once for the other actions and in a dry run. It
	// may be called from several goroutines at once.
	OnLetter func(a Action, p *Pending)
}

// Progress counts what a replay did so far.
type Progress struct {
	Replayed  int // republished and removed
	Parked    int // written to Park and removed
	Held      int // over MaxReplays, no Park: left in place
	Skipped   int // filtered out: left in place
	Malformed int // unreadable: left in place
	Unremoved int // republished, but the removal failed: a resumed replay duplicates them
	Elapsed   time.Duration
	// Rate is the observed pace in letters moved per second.
	Rate float64
	// Remaining is the letters left in the pass, -1 if unknown.
	Remaining int
	// ETA is Remaining at the configured rate (or the observed one if
	// slower); 0 if unknown.
	ETA  time.Duration
	Done bool // the final report
}

// Moved is Replayed + Parked.
func (p Progress) Moved() int { return p.Replayed + p.Parked }

// String formats p as one progress line.
func (p Progress) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "replayed %d, parked %d", p.Replayed, p.Parked)
	if p.Held+p.Skipped+p.Malformed > 0 {
		fmt.Fprintf(&b, ", left %d (held %d, skipped %d, malformed %d)", p.Held+p.Skipped+p.Malformed, p.Held, p.Skipped, p.Malformed)
	}
	if p.Unremoved > 0 {
		fmt.Fprintf(&b, ", NOT removed %d", p.Unremoved)
	}
	fmt.Fprintf(&b, " in %v (%.1f/s)", p.Elapsed.Round(100*time.Millisecond), p.Rate)
	if !p.Done && p.Remaining >= 0 {
		fmt.Fprintf(&b, ", %d to go, ETA %v", p.Remaining, p.ETA.Round(time.Second))
	}
	return b.String()
}

// Replayer moves dead letters from a Source to a Target at a paced,
// jittered rate. A Replayer holds no state between runs and is safe to
// reuse, but one Run at a time.
//
// Each letter is removed from the source only after the target confirmed
// its republish (or Park confirmed the park), so a replay stopped at any
// point — cancelled, crashed, target down — loses nothing: run it again and
// it resumes with what is left. What it can do is duplicate: a letter
// republished but not removed (crash in between) is republished by the next
// run unless the target deduplicates (the NATS target does, within the
// stream's duplicate window).
type Replayer struct {
	opts  ReplayOptions
	batch int
	every float64 // rate
	jit   time.Duration
}

// NewReplayer validates opts and returns a Replayer.
func NewReplayer(opts ReplayOptions) (*Replayer, error) {
	switch {
	case opts.Rate < 0 || math.IsNaN(opts.Rate):
		return nil, fmt.Errorf("%w: Rate %v letters/s", ErrInvalidOption, opts.Rate)
	case opts.Burst < 0:
		return nil, fmt.Errorf("%w: Burst %d", ErrInvalidOption, opts.Burst)
	case opts.Concurrency < 0:
		return nil, fmt.Errorf("%w: Concurrency %d", ErrInvalidOption, opts.Concurrency)
	case opts.Max < 0:
		return nil, fmt.Errorf("%w: Max %d", ErrInvalidOption, opts.Max)
	case opts.Attempts < 0:
		return nil, fmt.Errorf("%w: Attempts %d", ErrInvalidOption, opts.Attempts)
	}
	if opts.Rate == 0 {
		opts.Rate = DefaultRate
	}
	if opts.Concurrency == 0 {
		opts.Concurrency = DefaultConcurrency
	}
	if opts.MaxReplays == 0 {
		opts.MaxReplays = DefaultMaxReplays
	}
	if opts.Attempts == 0 {
		opts.Attempts = DefaultAttempts
	}
	if opts.DeadlineHeader == "" {
		opts.DeadlineHeader = expiry.DefaultHeader
	}
	r := &Replayer{opts: opts, every: opts.Rate, batch: opts.Burst}
	if r.batch == 0 {
		if math.IsInf(opts.Rate, 1) {
			r.batch = DefaultBatchUnpaced
		} else {
			r.batch = max(1, int(math.Ceil(opts.Rate*DefaultBatchInterval.Seconds())))
		}
	}
	r.jit = opts.Jitter
	if r.jit == 0 && !math.IsInf(opts.Rate, 1) {
		r.jit = time.Duration(float64(r.batch) / opts.Rate * float64(time.Second))
	}
	r.jit = max(r.jit, 0)
	return r, nil
}

// Batch returns the batch size in use (ReplayOptions.Burst or its default).
func (r *Replayer) Batch() int { return r.batch }

// Jitter returns the jitter in use (ReplayOptions.Jitter or its default).
func (r *Replayer) Jitter() time.Duration { return r.jit }

// Run replays letters from src to dst until src is drained, Max letters
// moved, ctx is done, or a publish fails. It returns what it did; the error
// is nil when src was drained or Max reached, ctx.Err() when cancelled,
// else wraps ErrPublish, ErrRemove or the source's error. Letters not moved
// are left in the source.
func (r *Replayer) Run(ctx context.Context, src Source, dst Target) (Progress, error) {
	start := time.Now()
	var mu sync.Mutex // guards st (OnLetter/publish goroutines update it)
	st := Progress{Remaining: -1}
	report := func(done bool) Progress {
		mu.Lock()
		p := st
		mu.Unlock()
		p.Elapsed = time.Since(start)
		if s := p.Elapsed.Seconds(); s > 0 {
			p.Rate = float64(p.Moved()) / s
		}
		p.Remaining = -1
		if sz, ok := src.(Sizer); ok {
			p.Remaining = sz.Remaining()
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
		if r.opts.Progress != nil {
			r.opts.Progress(p)
		}
		return p
	}
	decide := func(a Action, p *Pending) {
		mu.Lock()
		switch a {
		case ActionReplay:
			st.Replayed++
		case ActionPark:
			st.Parked++
		case ActionHold:
			st.Held++
		case ActionSkip:
			st.Skipped++
		case ActionMalformed:
			st.Malformed++
		}
		mu.Unlock()
		if p.Leave != nil && !r.opts.DryRun && a != ActionReplay && a != ActionPark {
			p.Leave()
		}
		if r.opts.OnLetter != nil {
			r.opts.OnLetter(a, p)
		}
	}

	rnd := rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	if !r.opts.DryRun && r.jit > 0 {
		// Full jitter on start: the rate's grid is anchored after it, so
		// replayers started together also tick on different phases.
		if err := sleepUntil(ctx, start.Add(time.Duration(rnd.Int64N(int64(r.jit))))); err != nil {
			return report(true), err
		}
	}
	pc := newPacer(r.every, r.batch, r.jit, rnd, time.Now())
	moved := 0
	for {
		n := r.batch
		if r.opts.Max > 0 {
			if moved >= r.opts.Max {
				return report(true), nil
			}
			n = min(n, r.opts.Max-moved)
		}
		items, err := src.Fetch(ctx, n)
		if errors.Is(err, ErrDrained) {
			return report(true), nil
		}
		if err != nil {
			if ctx.Err() != nil {
				return report(true), ctx.Err()
			}
			return report(true), fmt.Errorf("sluice: replay: fetch: %w", err)
		}
		var moves []move
		for _, p := range items {
			switch a := r.classify(p); a {
			case ActionReplay, ActionPark:
				if r.opts.DryRun {
					decide(a, p)
					moved++
				} else {
					moves = append(moves, move{a, p})
				}
			default:
				decide(a, p)
			}
		}
		if len(moves) == 0 {
			continue
		}
		if err := sleepUntil(ctx, pc.next(time.Now(), len(moves))); err != nil {
			return report(true), err
		}
		err = r.publish(ctx, dst, moves, decide, func() {
			mu.Lock()
			st.Unremoved++
			mu.Unlock()
		})
		moved += len(moves)
		if err != nil {
			return report(true), err
		}
		report(false)
	}
}

type move struct {
	a Action
	p *Pending
}

func (r *Replayer) classify(p *Pending) Action {
	l := p.Letter
	switch {
	case l == nil || p.Err != nil:
		return ActionMalformed
	case !r.opts.Filter.Match(l):
		return ActionSkip
	case r.opts.MaxReplays > 0 && l.Replays >= r.opts.MaxReplays:
		if r.opts.Park == nil {
			return ActionHold
		}
		return ActionPark
	}
	return ActionReplay
}

// publish moves one batch with at most Concurrency in flight, and returns
// the first error once every started move is finished.
func (r *Replayer) publish(ctx context.Context, dst Target, moves []move, decide func(Action, *Pending), unremoved func()) error {
	var (
		wg       sync.WaitGroup
		errMu    sync.Mutex
		firstErr error
	)
	fail := func(err error) {
		errMu.Lock()
		if firstErr == nil {
			firstErr = err
		}
		errMu.Unlock()
	}
	failed := func() bool {
		errMu.Lock()
		defer errMu.Unlock()
		return firstErr != nil
	}
	sem := make(chan struct{}, r.opts.Concurrency)
	now := time.Now()
	// A BatchTarget publishes every replay of the batch in one call first;
	// the pool below then only removes (or parks).
	var pre map[int]error
	if bt, ok := dst.(BatchTarget); ok {
		pre = r.publishBatch(ctx, bt, moves, now)
	}
	for i, mv := range moves {
		sem <- struct{}{}
		perr, published := pre[i]
		if !published && (failed() || ctx.Err() != nil) {
			<-sem
			break // stop starting moves; the rest stay in the queue
		}
		wg.Go(func() {
			defer func() { <-sem }()
			var err error
			switch {
			case published:
				err = perr
			case mv.a == ActionPark:
				err = r.retry(ctx, func() error { return r.opts.Park.Write(ctx, mv.p.Letter) })
			default:
				out := r.Outgoing(mv.p, now)
				if out.Topic == "" {
					err = ErrNoDestination
				} else {
					err = r.retry(ctx, func() error { return dst.Publish(ctx, out) })
				}
			}
			if err != nil {
				if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
					fail(ctx.Err())
				} else {
					fail(fmt.Errorf("%w: %s: %w", ErrPublish, mv.p.Pos, err))
				}
				return
			}
			// Confirmed: the letter must go even if ctx was cancelled just now.
			rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if mv.p.Remove != nil {
				if err := mv.p.Remove(rctx); err != nil {
					unremoved()
					fail(fmt.Errorf("%w: %s: %w", ErrRemove, mv.p.Pos, err))
					return
				}
			}
			decide(mv.a, mv.p)
		})
	}
	wg.Wait()
	if firstErr == nil && ctx.Err() != nil {
		return ctx.Err()
	}
	return firstErr
}

// publishBatch publishes the replays among moves through bt, retrying the
// failed ones, and returns each one's final error by index in moves.
func (r *Replayer) publishBatch(ctx context.Context, bt BatchTarget, moves []move, now time.Time) map[int]error {
	res := map[int]error{}
	var idx []int
	var outs []*Outgoing
	for i, mv := range moves {
		if mv.a != ActionReplay {
			continue
		}
		out := r.Outgoing(mv.p, now)
		if out.Topic == "" {
			res[i] = ErrNoDestination
			continue
		}
		idx, outs = append(idx, i), append(outs, out)
	}
	backoff := 100 * time.Millisecond
	for attempt := 0; len(outs) > 0; attempt++ {
		errs := bt.PublishBatch(ctx, outs)
		var retryIdx []int
		var retryOuts []*Outgoing
		for j, out := range outs {
			var err error
			if errs != nil {
				err = errs[j]
			}
			res[idx[j]] = err
			if err != nil {
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

func (r *Replayer) retry(ctx context.Context, f func() error) error {
	var err error
	backoff := 100 * time.Millisecond
	for i := range r.opts.Attempts {
		if err = f(); err == nil || ctx.Err() != nil {
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

// Outgoing builds the message a letter is republished as at time now: the
// original key, value and headers without the envelope, HeaderReplayCount
// set to Replays+1, and the deadline policy applied.
func (r *Replayer) Outgoing(p *Pending, now time.Time) *Outgoing {
	l := p.Letter
	h := make(map[string][]string, len(l.Headers)+2)
	for k, v := range l.Headers {
		if !strings.HasPrefix(k, HeaderPrefix) {
			h[k] = append([]string(nil), v...)
		}
	}
	h[HeaderReplayCount] = []string{strconv.Itoa(l.Replays + 1)}
	switch {
	case r.opts.Deadline > 0:
		h[r.opts.DeadlineHeader] = []string{expiry.FormatDeadline(now.Add(r.opts.Deadline))}
	case r.opts.Deadline == 0:
		delete(h, r.opts.DeadlineHeader)
	}
	topic := r.opts.Topic
	if topic == "" {
		topic = l.Origin.Topic
	}
	return &Outgoing{Topic: topic, Key: l.Key, Value: l.Value, Headers: h, Letter: l, Pos: p.Pos}
}

// pacer spaces batches: a token bucket (x/time/rate) sets each batch's slot
// on the rate's grid, and a uniform random delay in [0, jitter) is added to
// a slot still ahead. The bucket holds two batches, so a batch delayed by
// jitter (or a slow publish) up to one interval does not push later slots
// back, and a batch already due goes at once: the rate holds as long as a
// batch takes less than its interval on average. Not safe for concurrent
// use.
type pacer struct {
	lim    *rate.Limiter
	jit    time.Duration
	rnd    *rand.Rand
	paced  bool
	lastAt time.Time
}

func newPacer(perSecond float64, batch int, jitter time.Duration, rnd *rand.Rand, now time.Time) *pacer {
	p := &pacer{jit: jitter, rnd: rnd, paced: !math.IsInf(perSecond, 1)}
	if p.paced {
		p.lim = rate.NewLimiter(rate.Limit(perSecond), 2*batch)
		p.lim.ReserveN(now, batch) // start with one batch ready, not two
	}
	return p
}

func (p *pacer) jitter() time.Duration {
	if p.jit <= 0 {
		return 0
	}
	return time.Duration(p.rnd.Int64N(int64(p.jit)))
}

// next reserves n letters at now and returns when their batch may go.
// Batches never go out of order.
func (p *pacer) next(now time.Time, n int) time.Time {
	at := now
	if p.paced {
		res := p.lim.ReserveN(now, n)
		if d := res.DelayFrom(now); res.OK() && d > 0 {
			// On the grid: the slot is ahead, jitter it. A batch that is
			// due already (the run is behind) goes at once: jitter there
			// would only add to the lag.
			at = now.Add(d).Add(p.jitter())
		}
	} else {
		at = at.Add(p.jitter())
	}
	if at.Before(p.lastAt) {
		at = p.lastAt
	}
	p.lastAt = at
	return at
}

func sleepUntil(ctx context.Context, t time.Time) error {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err()
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-tm.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
