package backpressure

import (
	"fmt"
	"sync"
)

// Budget is a process-wide byte budget shared by several route windows. Each
// attached window gets a reserved share that only it may use; the rest is a
// shared pool. A window draws on the pool only while the pool keeps enough
// headroom for the classes above it: by default Sheddable routes stop taking
// from the pool when less than 25% of it is free, SheddablePlus at 10%, and
// Critical routes may use all of it. So under memory pressure the sheddable
// routes stop pulling first and a critical route never loses its reserve.
//
// A Budget is safe for concurrent use. Windows are attached once, before use.
type Budget struct {
	total int64

	mu         sync.Mutex
	reserved   int64
	sharedUsed int64
	headroom   [4]float64 // fraction of the pool to keep free, per class
	windows    []*Window
}

type share struct {
	reserved int64
	class    Criticality
}

// NewBudget returns a budget of totalBytes, which must be positive.
func NewBudget(totalBytes int64) (*Budget, error) {
	if totalBytes <= 0 {
		return nil, fmt.Errorf("%w: budget bytes must be > 0, got %d", ErrInvalidOption, totalBytes)
	}
	return &Budget{total: totalBytes, headroom: [4]float64{0.25, 0.10, 0, 0}}, nil
}

// SetHeadroom sets the fraction (0 to <1) of the shared pool that class c
// must leave free before it may take more from the pool.
func (bg *Budget) SetHeadroom(c Criticality, fraction float64) error {
	if !c.Valid() || fraction < 0 || fraction >= 1 {
		return fmt.Errorf("%w: headroom %v for %v", ErrInvalidOption, fraction, c)
	}
	bg.mu.Lock()
	bg.headroom[c] = fraction
	bg.mu.Unlock()
	return nil
}

// Attach puts w under the budget with reservedBytes kept for it alone, at
// class c. The sum of reserves must not exceed the budget, and w may be
// attached only once, before it is used.
func (bg *Budget) Attach(w *Window, reservedBytes int64, c Criticality) error {
	if reservedBytes < 0 || !c.Valid() {
		return fmt.Errorf("%w: reserve %d, class %v", ErrInvalidOption, reservedBytes, c)
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.budget != nil || w.msgs != 0 {
		return fmt.Errorf("%w: window already attached or in use", ErrInvalidOption)
	}
	bg.mu.Lock()
	defer bg.mu.Unlock()
	if bg.reserved+reservedBytes > bg.total {
		return fmt.Errorf("%w: reserves %d exceed budget %d", ErrInvalidOption, bg.reserved+reservedBytes, bg.total)
	}
	bg.reserved += reservedBytes
	w.budget = bg
	w.share = &share{reserved: reservedBytes, class: c}
	bg.windows = append(bg.windows, w)
	return nil
}

// InUse reports the bytes taken from the shared pool and the pool's size.
func (bg *Budget) InUse() (sharedUsed, sharedSize int64) {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	return bg.sharedUsed, bg.total - bg.reserved
}

func (bg *Budget) poolLimit(c Criticality) int64 {
	pool := bg.total - bg.reserved
	return pool - int64(float64(pool)*bg.headroom[c])
}

// ceiling is the most bytes a window with share s can ever hold at once:
// its reserve plus what its class may take of an otherwise idle pool.
func (bg *Budget) ceiling(s *share) int64 {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	return s.reserved + bg.poolLimit(s.class)
}

func sharedPart(held, reserved int64) int64 {
	if held > reserved {
		return held - reserved
	}
	return 0
}

// available is how many more bytes a window holding held bytes may take.
func (bg *Budget) available(s *share, held int64) int64 {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	own := s.reserved - held
	if own < 0 {
		own = 0
	}
	pool := bg.poolLimit(s.class) - bg.sharedUsed
	if pool < 0 {
		pool = 0
	}
	return own + pool
}

func (bg *Budget) take(s *share, held, b int64, oversize bool) bool {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	need := sharedPart(held+b, s.reserved) - sharedPart(held, s.reserved)
	if need == 0 {
		return true
	}
	if bg.sharedUsed+need > bg.poolLimit(s.class) {
		// An oversized message still passes alone once the pool is idle,
		// so it can never deadlock; but never past the pool's size.
		if !(oversize && bg.sharedUsed == 0 && need <= bg.total-bg.reserved) {
			return false
		}
	}
	bg.sharedUsed += need
	return true
}

// give returns b bytes of a window that held heldBefore, reporting whether
// any shared-pool bytes came free (other windows may then proceed).
func (bg *Budget) give(s *share, heldBefore, b int64) bool {
	freed := sharedPart(heldBefore, s.reserved) - sharedPart(heldBefore-b, s.reserved)
	if freed == 0 {
		return false
	}
	bg.mu.Lock()
	bg.sharedUsed -= freed
	bg.mu.Unlock()
	return true
}

func (bg *Budget) wake(except *Window) {
	bg.mu.Lock()
	ws := bg.windows
	bg.mu.Unlock()
	for _, w := range ws {
		if w != except {
			w.notify()
		}
	}
}
