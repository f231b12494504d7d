package backpressure

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

func mustWindow(t testing.TB, n int, b int64) *Window {
	t.Helper()
	w, err := NewWindow(n, b)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestNewWindowRejectsNonPositive(t *testing.T) {
	for _, c := range []struct {
		n int
		b int64
	}{{0, 1}, {1, 0}, {-1, 1}, {1, -5}} {
		if _, err := NewWindow(c.n, c.b); !errors.Is(err, ErrInvalidOption) {
			t.Errorf("NewWindow(%d,%d) = %v, want ErrInvalidOption", c.n, c.b, err)
		}
	}
}

// The admission scenario of the load-shedding seed: 2 workers, a window of
// 3 covering queued + running, a burst of 12. Two run, one queues, nine are
// refused before any work is created.
func TestAdmissionBurst(t *testing.T) {
	w := mustWindow(t, 3, 1<<20)
	release := make(chan struct{})
	var started atomic.Int32
	jobs := make(chan int, 3)
	var wg sync.WaitGroup
	for range 2 { // the worker pool
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				started.Add(1)
				<-release
				w.Release(1, 10)
			}
		}()
	}
	admitted, refused := 0, 0
	for range 12 {
		if w.TryAcquire(1, 10) {
			admitted++
			jobs <- 1
		} else {
			refused++
		}
	}
	if admitted != 3 || refused != 9 {
		t.Fatalf("admitted %d refused %d, want 3 and 9", admitted, refused)
	}
	waitFor(t, func() bool { return started.Load() == 2 })
	if n, _ := w.InUse(); n != 3 {
		t.Fatalf("in use %d, want 3 (2 running + 1 queued)", n)
	}
	close(release)
	close(jobs)
	wg.Wait()
	if n, b := w.InUse(); n != 0 || b != 0 {
		t.Fatalf("in use after drain %d/%d", n, b)
	}
	// Every slot is reusable at the end.
	for range 3 {
		if !w.TryAcquire(1, 10) {
			t.Fatal("slot not reusable")
		}
	}
}

// A caller that stops waiting does not free the slot: only settlement does.
func TestCallerTimeoutDoesNotFreeSlot(t *testing.T) {
	w := mustWindow(t, 1, 100)
	if !w.TryAcquire(1, 1) {
		t.Fatal("first acquire")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if err := w.Acquire(ctx, 1, 1); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Acquire = %v, want deadline exceeded", err)
	}
	if n, _ := w.InUse(); n != 1 {
		t.Fatalf("failed Acquire changed the window: in use %d", n)
	}
	if w.Blocked() <= 0 {
		t.Fatal("blocked time not recorded")
	}
	done := make(chan error, 1)
	go func() { done <- w.Acquire(context.Background(), 1, 1) }()
	select {
	case err := <-done:
		t.Fatalf("acquired while held: %v", err)
	case <-time.After(20 * time.Millisecond):
	}
	w.Release(1, 1)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

func TestAcquireImpossibleRefusesAtOnce(t *testing.T) {
	w := mustWindow(t, 2, 100)
	if err := w.Acquire(context.Background(), 3, 1); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("got %v, want ErrTooLarge", err)
	}
}

func TestOversizeAdmittedAloneNoDeadlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		w := mustWindow(t, 10, 100)
		if !w.TryAcquire(1, 10) {
			t.Fatal("small")
		}
		if w.TryAcquire(1, 500) {
			t.Fatal("oversize admitted while window not empty")
		}
		done := make(chan error, 1)
		go func() { done <- w.Acquire(context.Background(), 1, 500) }()
		synctest.Wait() // the Acquire is waiting
		select {
		case <-done:
			t.Fatal("oversize admitted while the window was not empty")
		default:
		}
		w.Release(1, 10)
		select {
		case err := <-done:
			if err != nil {
				t.Fatal(err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("oversized message deadlocked")
		}
		if w.TryAcquire(1, 1) {
			t.Fatal("admitted alongside the oversized message")
		}
		w.Release(1, 500)
		if n, b := w.InUse(); n != 0 || b != 0 {
			t.Fatalf("in use %d/%d", n, b)
		}
	})
}

func TestReleaseMoreThanHeldPanics(t *testing.T) {
	w := mustWindow(t, 2, 100)
	defer func() {
		if recover() == nil {
			t.Fatal("no panic on over-release")
		}
	}()
	w.Release(1, 1)
}

// A 1 MiB window never holds more than 1 MiB under concurrent producers.
func TestBytesBoundUnderConcurrency(t *testing.T) {
	const limit = 1 << 20
	w := mustWindow(t, 1000, limit)
	var held, peak atomic.Int64
	var wg sync.WaitGroup
	for p := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 300 {
				size := int64(1024 * (1 + (p*31+i*7)%200))
				if err := w.Acquire(context.Background(), 1, size); err != nil {
					t.Error(err)
					return
				}
				h := held.Add(size)
				for {
					pk := peak.Load()
					if h <= pk || peak.CompareAndSwap(pk, h) {
						break
					}
				}
				time.Sleep(time.Duration(i%3) * 50 * time.Microsecond)
				held.Add(-size)
				w.Release(1, size)
			}
		}()
	}
	wg.Wait()
	if peak.Load() > limit {
		t.Fatalf("peak %d bytes over the %d limit", peak.Load(), limit)
	}
	if _, pb := w.Peak(); pb > limit {
		t.Fatalf("window peak %d over limit", pb)
	}
}

func TestWaitFreeReportsFreeWithoutTaking(t *testing.T) {
	w := mustWindow(t, 4, 100)
	w.TryAcquire(3, 60)
	n, b, err := w.WaitFree(context.Background())
	if err != nil || n != 1 || b != 40 {
		t.Fatalf("WaitFree = %d,%d,%v; want 1,40", n, b, err)
	}
	w.TryAcquire(1, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, _, err := w.WaitFree(ctx); err == nil {
		t.Fatal("WaitFree on a full window returned")
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached")
		}
		time.Sleep(time.Millisecond)
	}
}

// Cancelling the queued job (settling it before it ran) frees exactly one
// slot: one replacement is admitted and the next is refused.
func TestCancelledQueuedFreesOneSlot(t *testing.T) {
	w := mustWindow(t, 3, 1<<20)
	for range 3 { // 2 running + 1 queued
		if !w.TryAcquire(1, 10) {
			t.Fatal("setup")
		}
	}
	w.Release(1, 10) // the queued one is cancelled before it ran
	if !w.TryAcquire(1, 10) {
		t.Fatal("replacement refused")
	}
	if w.TryAcquire(1, 10) {
		t.Fatal("next admitted beyond the window")
	}
}

func TestWaitFreeAtLeastWaitsForLowWater(t *testing.T) {
	w := mustWindow(t, 8, 1000)
	w.TryAcquire(8, 80)
	got := make(chan int, 1)
	go func() {
		n, _, _ := w.WaitFreeAtLeast(context.Background(), 3)
		got <- n
	}()
	w.Release(2, 20)
	select {
	case n := <-got:
		t.Fatalf("returned with %d free, below the low-water mark 3", n)
	case <-time.After(20 * time.Millisecond):
	}
	w.Release(1, 10)
	if n := <-got; n != 3 {
		t.Fatalf("free %d, want 3", n)
	}
}
