package consumer

import (
	"container/list"
	"hash/maphash"
	"sync"
	"time"

	"github.com/sluice-go/sluice/dlq"
)

// Failure memory. A route remembers what it needs of a message it handed
// back to the broker after a failure: when it first failed (for its dead
// letter), and, when it is out of attempts and its dead-letter write failed,
// the letter's class and cause, so its redelivery is written again without
// running the handler (OutcomeDLQFailed).
//
// A redelivery is a new Message: the memory finds it again by failKey, the
// message's Origin (a stream sequence, a partition offset) together with
// its topic, key and a hash of its value, so a Source that leaves Origin
// empty or partial (sluicetest.Source.Publish, a custom Source) still tells
// its messages apart. Two messages alike in all of these are one message to
// the memory.
//
// The memory is bounded in two parts. First failures: at most 4 × the
// window + 1,024, the least recently failed forgotten first (a redelivery
// then reports its later failure time as its first). Letters awaited: at
// most 64 × the window + 16,384; they are forgotten only beyond that, oldest
// first, and such a redelivery runs its handler again. A letter awaited
// moves from the first part to the second, so first failures never push one
// out.

// failure is what a route remembers of one message.
type failure struct {
	first time.Time
	class string // non-empty: its letter awaits a write
	cause string
}

type failKey struct {
	origin     dlq.Origin
	topic, key string
	sum        uint64
}

type failEntry struct {
	key failKey
	failure
	el *list.Element // in failures.retrying or failures.awaiting
}

type failures struct {
	mu       sync.Mutex
	seed     maphash.Seed
	entries  map[failKey]*failEntry
	retrying list.List // first failures only, least recent first
	awaiting list.List // letters awaited, oldest first
	maxRetrying,
	maxAwaiting int
}

func (f *failures) init(window int) {
	f.seed = maphash.MakeSeed()
	f.entries = map[failKey]*failEntry{}
	f.maxRetrying = 4*window + 1024
	f.maxAwaiting = 64*window + 16384
}

func (f *failures) keyOf(m *Message) failKey {
	return failKey{origin: m.Origin, topic: m.Topic, key: string(m.Key), sum: maphash.Bytes(f.seed, m.Value)}
}

// get returns what is remembered of m.
func (f *failures) get(m *Message) (failure, bool) {
	k := f.keyOf(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.entries[k]
	if !ok {
		return failure{}, false
	}
	return e.failure, true
}

// update changes what is remembered of m (a new entry when there is none)
// and keeps the memory within its bounds.
func (f *failures) update(m *Message, fn func(*failure)) {
	k := f.keyOf(m)
	f.mu.Lock()
	defer f.mu.Unlock()
	e, ok := f.entries[k]
	if !ok {
		e = &failEntry{key: k}
		f.entries[k] = e
	} else {
		f.unlink(e)
	}
	fn(&e.failure)
	if e.class != "" {
		e.el = f.awaiting.PushBack(e)
	} else {
		e.el = f.retrying.PushBack(e)
	}
	for f.retrying.Len() > f.maxRetrying {
		f.drop(f.retrying.Front().Value.(*failEntry))
	}
	for f.awaiting.Len() > f.maxAwaiting {
		f.drop(f.awaiting.Front().Value.(*failEntry))
	}
}

// forget drops what is remembered of m.
func (f *failures) forget(m *Message) {
	k := f.keyOf(m)
	f.mu.Lock()
	if e, ok := f.entries[k]; ok {
		f.drop(e)
	}
	f.mu.Unlock()
}

func (f *failures) unlink(e *failEntry) {
	if e.class != "" {
		f.awaiting.Remove(e.el)
	} else {
		f.retrying.Remove(e.el)
	}
}

func (f *failures) drop(e *failEntry) {
	f.unlink(e)
	delete(f.entries, e.key)
}

// rememberFailure notes m's first failure, unless its adapter knows it.
func (r *route) rememberFailure(m *Message, now time.Time) {
	if !m.FirstFailure.IsZero() {
		return
	}
	r.failures.update(m, func(f *failure) {
		if f.first.IsZero() {
			f.first = now
		}
	})
}

// awaitLetter remembers that m's next delivery is to be dead-lettered as
// class without running the handler.
func (r *route) awaitLetter(m *Message, class string, cause error, now time.Time) {
	r.failures.update(m, func(f *failure) {
		if f.first.IsZero() {
			f.first = now
		}
		f.class, f.cause = class, cause.Error()
	})
}

// awaitingLetter reports whether m is a redelivery awaiting its dead
// letter (see awaitLetter).
func (r *route) awaitingLetter(m *Message) (failure, bool) {
	if m.Attempt <= 1 {
		return failure{}, false
	}
	f, ok := r.failures.get(m)
	return f, ok && f.class != ""
}

// forget drops what the route remembers of m, once m is settled for good.
func (r *route) forget(m *Message) {
	if m.Attempt <= 1 && m.FirstFailure.IsZero() {
		return // never failed before: nothing remembered
	}
	r.failures.forget(m)
}
