package dlq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"

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
	DefaultRate = 100 // letters per second
	// DefaultBatchInterval is the spacing batches are sized for: a batch
	// holds Rate × 5 ms letters (at least 1), so the pace is even at the
	// scale anyone measures it (a 100 ms bucket sees 20 batches).
	DefaultBatchInterval = 5 * time.Millisecond
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
	// ErrNoDestination is wrapped by the NoDestinationError Run returns
	// when ReplayOptions names no destination policy.
	ErrNoDestination = errors.New("sluice: no replay destination allowed")
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
	// letter in place: filtered out, held by the loop guard, refused
	// without a Park sink, or malformed.
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
	// Topic is the destination the replay policy chose (ReplayOptions
	// Destination, Topic, or the letter's origin once Allow admits it).
	Topic   string
	Key     []byte
	Value   []byte
	Headers map[string][]string // the original headers, envelope removed, HeaderReplayCount and deadline set
	Letter  *Letter             // the letter it came from; read-only
	Pos     string              // the letter's Pending.Pos
}

// Target republishes messages. Publish returns only after the broker
// confirmed the message; an error means it may not be stored, and the
// letter is kept. An error wrapping ErrUndeliverable says the destination
// can never take this message (the letter is parked and the run goes on);
// any other error stops the run. It must be safe for concurrent use.
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
	// ActionRefuse: not republished because of its destination (not
	// allowed, always refused, none, or the target cannot take it) or
	// because it was truncated; written to Park with the reason and
	// removed, or left in the queue when there is no Park.
	ActionRefuse
)

var actionNames = [...]string{"replay", "park", "hold", "skip", "malformed", "refuse"}

func (a Action) String() string {
	if a >= 0 && int(a) < len(actionNames) {
		return actionNames[a]
	}
	return "action(" + strconv.Itoa(int(a)) + ")"
}

// Decision is one letter decided, as OnLetter sees it.
type Decision struct {
	Action  Action
	Pending *Pending
	// Destination is where the letter was (or would be) republished, or
	// for ActionRefuse the destination that was refused ("" if none).
	Destination string
	// Reason says why a letter was parked, held or refused.
	Reason string
	// Parked reports that the letter was (or would be) written to Park.
	Parked bool
}

// ReplayOptions configure a Replayer. The zero value replays at 100
// letters/s in jittered batches of 1, 8 at a time, parks nothing (letters
// replayed 3 times already are held), drops the stale deadline header,
// and publishes nowhere: a replay needs a destination policy (Allow,
// Destination or Topic), because a letter's origin is only a request.
type ReplayOptions struct {
	// Rate is the pace in letters moved (replayed or parked) per second.
	// 0 means DefaultRate; math.Inf(1) means unpaced. Negative is invalid.
	Rate float64
	// Burst is the batch size: letters paced and published together (one
	// timer, and one produce request on a BatchTarget). 0 means Rate ×
	// DefaultBatchInterval rounded up (at least 1), or DefaultBatchUnpaced
	// when unpaced. Larger batches save timer wake-ups and round trips but
	// make the pace lumpier at the scale of a batch interval.
	Burst int
	// Jitter is the largest random delay added before the first batch and
	// to each batch's paced slot ("full jitter": uniform in [0, Jitter)).
	// Slots stay on the rate's grid, so jitter does not lower the rate
	// while it is below one batch interval. 0 means one batch interval
	// (Burst/Rate); negative means none.
	Jitter time.Duration
	// Concurrency bounds publishes in flight (batches on a BatchTarget):
	// batches are started on their paced slots without waiting for the
	// previous one, so a target's latency costs rate only once
	// Concurrency publishes are waiting. 0 means DefaultConcurrency.
	Concurrency int
	// Filter selects the letters to move; the others are left in place.
	Filter Filter
	// DryRun decides every letter (OnLetter sees it) but moves, parks and
	// removes nothing, unpaced. Progress.Destinations lists where it would
	// publish. It predicts the real run: without a destination policy
	// (Allow, Destination, Topic) it returns the same NoDestinationError.
	DryRun bool
	// Max stops after this many letters moved (replayed + parked). 0 means
	// no limit.
	Max int
	// MaxReplays is the loop guard: a letter replayed this many times
	// already (Letter.Replays ≥ MaxReplays) goes to Park instead. 0 means
	// DefaultMaxReplays; negative disables the guard.
	MaxReplays int
	// Park receives letters over MaxReplays and refused letters, with
	// Letter.ParkReason set; each is removed from the source only after
	// Park.Write returned nil. nil means they are held (left in the queue
	// and counted).
	Park Sink

	// Allow lists the destinations the replay may publish to, as patterns
	// (MatchDestination: "orders.*", "orders.>", "orders-*"). A letter
	// whose destination matches none is refused. With Destination or
	// Topic set, their result must match too.
	Allow []string
	// Deny lists destinations refused even when allowed (the CLI adds the
	// connection's JetStream API and inbox prefixes). CheckDestination's
	// rules ($, _INBOX, __...) always apply.
	Deny []string
	// Destination, if set, chooses each letter's destination (the letter
	// is read-only). An error refuses the letter with that reason.
	Destination func(*Letter) (string, error)
	// Topic, if set, is the destination of every letter (the CLI's --to).
	// Without Destination and Topic a letter asks for its origin topic
	// (Kafka) or subject (NATS), which Allow must admit.
	//
	// With none of Allow, Destination and Topic, Run publishes nothing: it
	// reads the pass and returns a NoDestinationError naming the
	// destinations the letters ask for.
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
	OnLetter func(Decision)
}

// Progress counts what a replay did so far.
type Progress struct {
	Replayed int // republished and removed
	// Parked counts letters written to Park and removed: over MaxReplays,
	// or refused (those are counted in Refused too).
	Parked int
	// Refused counts letters not republished because of their destination
	// or because they were truncated: parked when there is a Park (and
	// counted in Parked), else left in place (and counted in Held).
	Refused   int
	Held      int // over MaxReplays or refused, with no Park: left in place
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
	// Destinations lists the destinations used or refused, most letters
	// first (at most 1000, then one "(other destinations)" row). Only the
	// final report (Done) has it.
	Destinations []DestinationCount
}

// Moved is Replayed + Parked.
func (p Progress) Moved() int { return p.Replayed + p.Parked }

// String formats p as one progress line.
func (p Progress) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "replayed %d, parked %d", p.Replayed, p.Parked)
	if p.Refused > 0 {
		fmt.Fprintf(&b, " (refused %d)", p.Refused)
	}
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
//
// Destinations: letters are untrusted, so a letter's origin is only a
// request. The Replayer publishes only where ReplayOptions allows, never
// where CheckDestination refuses; a refused letter is parked with its
// reason (or left in place) and the run goes on.
type Replayer struct {
	opts   ReplayOptions
	batch  int
	fetch  int
	every  float64 // rate
	jit    time.Duration
	policy bool // Allow, Destination or Topic set
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
	for _, p := range append(slices.Clip(opts.Allow), opts.Deny...) {
		if err := CheckPattern(p); err != nil {
			return nil, err
		}
	}
	if opts.Topic != "" {
		if err := CheckDestination(opts.Topic); err != nil {
			return nil, fmt.Errorf("%w: Topic: %w", ErrInvalidOption, err)
		}
	}
	opts.Rate = cmp.Or(opts.Rate, DefaultRate)
	opts.Concurrency = cmp.Or(opts.Concurrency, DefaultConcurrency)
	opts.MaxReplays = cmp.Or(opts.MaxReplays, DefaultMaxReplays)
	opts.Attempts = cmp.Or(opts.Attempts, DefaultAttempts)
	opts.DeadlineHeader = cmp.Or(opts.DeadlineHeader, expiry.DefaultHeader)
	r := &Replayer{opts: opts, every: opts.Rate, batch: opts.Burst,
		policy: len(opts.Allow) > 0 || opts.Destination != nil || opts.Topic != ""}
	unpaced := math.IsInf(opts.Rate, 1)
	if r.batch == 0 {
		if unpaced {
			r.batch = DefaultBatchUnpaced
		} else {
			r.batch = max(1, int(math.Ceil(opts.Rate*DefaultBatchInterval.Seconds())))
		}
	}
	// Fetch ahead a quarter second of letters (at least a batch, at most
	// 256 unless the batch is larger): a fetch is a round trip, a batch
	// only a timer.
	r.fetch = max(r.batch, 256)
	if !unpaced {
		r.fetch = min(max(r.batch, int(math.Ceil(opts.Rate/4))), max(r.batch, 256))
	}
	r.jit = opts.Jitter
	if r.jit == 0 && !unpaced {
		r.jit = time.Duration(float64(r.batch) / opts.Rate * float64(time.Second))
	}
	r.jit = max(r.jit, 0)
	return r, nil
}

// Batch returns the batch size in use (ReplayOptions.Burst or its default).
func (r *Replayer) Batch() int { return r.batch }

// Jitter returns the jitter in use (ReplayOptions.Jitter or its default).
func (r *Replayer) Jitter() time.Duration { return r.jit }

// Outgoing builds the message a letter is republished as at time now: the
// destination the policy allows (Topic "" when it refuses the letter), the
// original key, value and headers without the envelope, HeaderReplayCount
// set to Replays+1, and the deadline policy applied.
func (r *Replayer) Outgoing(p *Pending, now time.Time) *Outgoing {
	dest, _, err := r.destination(p.Letter)
	if err != nil {
		dest = ""
	}
	return r.outgoing(p, dest, now)
}

func (r *Replayer) outgoing(p *Pending, dest string, now time.Time) *Outgoing {
	l := p.Letter
	h := make(map[string][]string, len(l.Headers)+2)
	for k, v := range l.Headers {
		if !strings.HasPrefix(k, HeaderPrefix) {
			h[k] = append([]string(nil), v...)
		}
	}
	h[HeaderReplayCount] = []string{strconv.Itoa(min(l.Replays, MaxReplayCount) + 1)}
	switch {
	case r.opts.Deadline > 0:
		h[r.opts.DeadlineHeader] = []string{expiry.FormatDeadline(now.Add(r.opts.Deadline))}
	case r.opts.Deadline == 0:
		delete(h, r.opts.DeadlineHeader)
	}
	return &Outgoing{Topic: dest, Key: l.Key, Value: l.Value, Headers: h, Letter: l, Pos: p.Pos}
}

// errNoPolicy refuses every letter when ReplayOptions names no policy.
var errNoPolicy = fmt.Errorf("%w: no destination is allowed (set an allow-list or one destination)", ErrRefused)

// destination applies the policy to l: it returns the destination l asks
// for or is given (requested, for reporting) and, when allowed, the same
// as dest; err (wrapping ErrRefused) when refused.
func (r *Replayer) destination(l *Letter) (dest, requested string, err error) {
	switch {
	case r.opts.Destination != nil:
		requested, err = r.opts.Destination(l)
		if err != nil {
			return "", requested, fmt.Errorf("%w: %w", ErrRefused, err)
		}
	case r.opts.Topic != "":
		requested = r.opts.Topic
	default:
		requested = l.Origin.Topic
	}
	if err := CheckDestination(requested); err != nil {
		return "", requested, err
	}
	if !r.policy {
		return "", requested, errNoPolicy
	}
	for _, p := range r.opts.Deny {
		if MatchDestination(p, requested) {
			return "", requested, fmt.Errorf("%w: %q matches the deny pattern %q", ErrRefused, requested, p)
		}
	}
	if len(r.opts.Allow) > 0 && !slices.ContainsFunc(r.opts.Allow, func(p string) bool { return MatchDestination(p, requested) }) {
		return "", requested, fmt.Errorf("%w: %q is not in the allow-list", ErrRefused, Printable(requested, 80))
	}
	return requested, requested, nil
}
