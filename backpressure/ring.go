package backpressure

import "time"

// ring is a sliding window of time buckets holding two counters each. It
// is not safe for concurrent use; owners lock around it. A bucket whose
// epoch is stale is reset when it is next touched, so an idle window decays
// to zero without a background goroutine.
type ring struct {
	width   int64 // bucket width in nanoseconds
	buckets []bucket
}

type bucket struct {
	epoch int64 // unix nanos / width
	a, b  float64
}

func newRing(window time.Duration, n int) ring {
	w := int64(window) / int64(n)
	if w <= 0 {
		w = 1
	}
	return ring{width: w, buckets: make([]bucket, n)}
}

func (r *ring) at(now time.Time) *bucket {
	e := now.UnixNano() / r.width
	bk := &r.buckets[int(uint64(e)%uint64(len(r.buckets)))]
	if bk.epoch != e {
		*bk = bucket{epoch: e}
	}
	return bk
}

// sums adds up the buckets that are inside the window ending at now.
func (r *ring) sums(now time.Time) (a, b float64) {
	e := now.UnixNano() / r.width
	oldest := e - int64(len(r.buckets)) + 1
	for i := range r.buckets {
		bk := &r.buckets[i]
		if bk.epoch >= oldest && bk.epoch <= e {
			a += bk.a
			b += bk.b
		}
	}
	return a, b
}
