package backpressure

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// ErrInvalidOption is wrapped by every constructor error caused by a bad
// argument, so callers can test for it with errors.Is.
var ErrInvalidOption = errors.New("sluice: invalid option")

// ErrTooLarge is returned by Acquire when a request asks for more messages
// than the whole window can ever hold. Such a request would wait forever, so
// it is refused at once and the window is left unchanged.
var ErrTooLarge = errors.New("sluice: request larger than the window")

// Window bounds the work one route holds: at most MaxMessages messages and at
// most MaxBytes bytes, counting queued and running messages alike.
//
// Acquire blocks until the request fits; TryAcquire never blocks; Release
// returns capacity and panics if more is released than is held, because a
// double release silently widens the bound. Most callers want Acquire before
// a fetch and Release when the message is settled.
//
// The byte bound has one exception, so an oversized message can never
// deadlock: a request for more bytes than MaxBytes is admitted when the window
// is completely empty, and while it is held nothing else is admitted.
//
// A Window is safe for concurrent use. The zero value is not usable; call
// NewWindow.
type Window struct {
	maxMsgs  int
	maxBytes int64

	// limit is the message limit in force, 1..maxMsgs; SetLimit moves it
	// (adaptive concurrency, recovery ramps). It starts at maxMsgs.
	limit int

	mu        sync.Mutex
	msgs      int
	bytes     int64
	changed   chan struct{} // closed and replaced whenever capacity is released
	budget    *Budget
	share     *share
	peakMsgs  int
	peakBytes int64
	blocked   time.Duration
	// budgetBlocked is the part of blocked spent while the window itself
	// had room and only the Budget refused.
	budgetBlocked time.Duration
}

// NewWindow returns a window of maxMessages messages and maxBytes bytes. Both
// must be positive; otherwise the error wraps ErrInvalidOption.
func NewWindow(maxMessages int, maxBytes int64) (*Window, error) {
	if maxMessages <= 0 {
		return nil, fmt.Errorf("%w: window messages must be > 0, got %d", ErrInvalidOption, maxMessages)
	}
	if maxBytes <= 0 {
		return nil, fmt.Errorf("%w: window bytes must be > 0, got %d", ErrInvalidOption, maxBytes)
	}
	return &Window{maxMsgs: maxMessages, maxBytes: maxBytes, limit: maxMessages, changed: make(chan struct{})}, nil
}

// Limits reports the window's size.
func (w *Window) Limits() (messages int, bytes int64) { return w.maxMsgs, w.maxBytes }

// SetLimit changes the message limit in force to n, clamped to 1..the
// window's size, and returns the limit now in force. Lowering it never
// takes back what is held: admission stops until enough is settled.
// Raising it wakes waiters. Adaptive concurrency (AdaptiveLimit) drives it.
func (w *Window) SetLimit(n int) int {
	n = max(1, min(n, w.maxMsgs))
	w.mu.Lock()
	raised := n > w.limit
	w.limit = n
	var ch chan struct{}
	if raised {
		ch, w.changed = w.changed, nil
	}
	w.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	return n
}

// Limit reports the message limit in force: the window's size unless
// SetLimit lowered it.
func (w *Window) Limit() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.limit
}

// InUse reports the capacity currently held.
func (w *Window) InUse() (messages int, bytes int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.msgs, w.bytes
}

// Peak reports the most capacity ever held at once.
func (w *Window) Peak() (messages int, bytes int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.peakMsgs, w.peakBytes
}

// Blocked reports the total time callers of Acquire and WaitFree spent
// waiting for capacity: the backpressure signal.
func (w *Window) Blocked() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.blocked
}

// BudgetBlocked reports the part of Blocked spent while the window itself
// had room and the process-wide Budget refused: memory pressure from other
// routes, not this route's own backlog.
func (w *Window) BudgetBlocked() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.budgetBlocked
}

// Admissible reports whether a request of one message and b bytes can ever
// be admitted: always without a Budget (a message larger than the window
// passes alone, once the window is empty), and with one only when b fits
// what the Budget can ever give this window (its reserve plus the part of
// the shared pool its class may use), whatever the window's size. A request
// that is not admissible would wait forever, or take the Budget past its
// size; callers refuse it instead.
func (w *Window) Admissible(b int64) bool {
	if w.budget == nil {
		return true
	}
	return w.budget.ceiling(w.share) >= b
}

// Free reports how much could be acquired right now without waiting,
// including what the process-wide budget allows. An empty window always
// reports at least its own byte limit so an oversized message can pass.
func (w *Window) Free() (messages int, bytes int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.freeLocked()
}

func (w *Window) freeLocked() (int, int64) {
	m := w.limit - w.msgs
	b := w.maxBytes - w.bytes
	if m <= 0 || b <= 0 {
		return 0, 0
	}
	if w.budget != nil {
		bb := w.budget.available(w.share, w.bytes)
		if bb < b {
			b = bb
		}
		if b <= 0 {
			return 0, 0
		}
	}
	return m, b
}

// TryAcquire takes n messages and b bytes if they fit now and reports whether
// it did. It never blocks.
func (w *Window) TryAcquire(n int, b int64) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.tryLocked(n, b)
}

func (w *Window) tryLocked(n int, b int64) bool {
	if n < 0 || b < 0 {
		panic("backpressure: negative acquire")
	}
	if w.msgs+n > w.limit {
		return false
	}
	oversize := b > w.maxBytes
	if oversize {
		if w.msgs != 0 || w.bytes != 0 {
			return false
		}
	} else if w.bytes+b > w.maxBytes {
		return false
	}
	if w.budget != nil && !w.budget.take(w.share, w.bytes, b, oversize) {
		return false
	}
	w.msgs += n
	w.bytes += b
	if w.msgs > w.peakMsgs {
		w.peakMsgs = w.msgs
	}
	if w.bytes > w.peakBytes {
		w.peakBytes = w.bytes
	}
	return true
}

// Acquire blocks until n messages and b bytes fit, then takes them. On
// failure it returns ctx.Err() (or ErrTooLarge at once when n exceeds the
// whole window) and leaves the window unchanged.
func (w *Window) Acquire(ctx context.Context, n int, b int64) error {
	if n > w.maxMsgs {
		return fmt.Errorf("%w: %d messages, window holds %d", ErrTooLarge, n, w.maxMsgs)
	}
	var start time.Time
	for {
		w.mu.Lock()
		if w.tryLocked(n, b) {
			if !start.IsZero() {
				w.blocked += time.Since(start)
			}
			w.mu.Unlock()
			return nil
		}
		if err := w.waitLocked(ctx, w.budgetRefusesLocked(n, b), &start); err != nil {
			return err
		}
	}
}

// waitLocked releases w.mu and waits until the window changes or ctx ends,
// adding the time to BudgetBlocked when only the Budget kept the caller out,
// and to Blocked (since *start, the first wait) when ctx ends.
func (w *Window) waitLocked(ctx context.Context, budget bool, start *time.Time) error {
	ch := w.waitChanLocked()
	w.mu.Unlock()
	t := time.Now()
	if start.IsZero() {
		*start = t
	}
	select {
	case <-ch:
	case <-ctx.Done():
	}
	if budget {
		w.addBudgetBlocked(time.Since(t))
	}
	if ctx.Err() != nil {
		w.addBlocked(time.Since(*start))
		return ctx.Err()
	}
	return nil
}

// budgetRefusesLocked reports whether n messages and b bytes would fit the
// window's own limits and only the Budget keeps them out.
func (w *Window) budgetRefusesLocked(n int, b int64) bool {
	if w.budget == nil || w.msgs+n > w.limit {
		return false
	}
	if b > w.maxBytes {
		return w.msgs == 0 && w.bytes == 0
	}
	return w.bytes+b <= w.maxBytes
}

func (w *Window) addBudgetBlocked(d time.Duration) {
	w.mu.Lock()
	w.budgetBlocked += d
	w.mu.Unlock()
}

// WaitFree blocks until at least one message slot and one byte are free and
// returns how much is free at that moment, without taking it. It is the
// blocking half of a pull: wait, then fetch at most what is free, then
// Acquire what the fetch returned.
func (w *Window) WaitFree(ctx context.Context) (messages int, bytes int64, err error) {
	return w.WaitFreeAtLeast(ctx, 1)
}

// WaitFreeAtLeast is WaitFree that waits until at least minMessages message
// slots are free (capped at the window size), so a puller can fetch in
// batches instead of one round trip per freed slot.
func (w *Window) WaitFreeAtLeast(ctx context.Context, minMessages int) (messages int, bytes int64, err error) {
	minMessages = max(1, min(minMessages, w.maxMsgs))
	var start time.Time
	for {
		w.mu.Lock()
		m, b := w.freeLocked()
		if m >= min(minMessages, w.limit) && b > 0 {
			if !start.IsZero() {
				w.blocked += time.Since(start)
			}
			w.mu.Unlock()
			return m, b, nil
		}
		if err := w.waitLocked(ctx, w.budgetRefusesLocked(min(minMessages, w.limit), 1), &start); err != nil {
			return 0, 0, err
		}
	}
}

// WaitEmpty blocks until the window holds nothing.
func (w *Window) WaitEmpty(ctx context.Context) error {
	for {
		w.mu.Lock()
		if w.msgs == 0 && w.bytes == 0 {
			w.mu.Unlock()
			return nil
		}
		ch := w.waitChanLocked()
		w.mu.Unlock()
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (w *Window) addBlocked(d time.Duration) {
	w.mu.Lock()
	w.blocked += d
	w.mu.Unlock()
}

func (w *Window) waitChanLocked() chan struct{} {
	if w.changed == nil {
		w.changed = make(chan struct{})
	}
	return w.changed
}

// Release returns n messages and b bytes. It panics if more is released than
// is held.
func (w *Window) Release(n int, b int64) {
	w.mu.Lock()
	if n < 0 || b < 0 || n > w.msgs || b > w.bytes {
		held, heldB := w.msgs, w.bytes
		w.mu.Unlock()
		panic(fmt.Sprintf("backpressure: released %d msgs/%d bytes, held %d/%d", n, b, held, heldB))
	}
	w.msgs -= n
	w.bytes -= b
	sharedFreed := false
	if w.budget != nil {
		sharedFreed = w.budget.give(w.share, w.bytes+b, b)
	}
	ch := w.changed
	w.changed = nil
	w.mu.Unlock()
	if ch != nil {
		close(ch)
	}
	if sharedFreed {
		w.budget.wake(w)
	}
}

// notify wakes waiters after capacity elsewhere (the budget) was released.
func (w *Window) notify() {
	w.mu.Lock()
	ch := w.changed
	w.changed = nil
	w.mu.Unlock()
	if ch != nil {
		close(ch)
	}
}
