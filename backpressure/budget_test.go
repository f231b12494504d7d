package backpressure

import (
	"errors"
	"testing"
)

func TestBudgetShedsSheddableFirst(t *testing.T) {
	bg, err := NewBudget(1000)
	if err != nil {
		t.Fatal(err)
	}
	crit := mustWindow(t, 100, 1000)
	shed := mustWindow(t, 100, 1000)
	if err := bg.Attach(crit, 200, Critical); err != nil {
		t.Fatal(err)
	}
	if err := bg.Attach(shed, 0, Sheddable); err != nil {
		t.Fatal(err)
	}
	// Pool is 800. Sheddable keeps 25% headroom: it may take 600 at most.
	for shed.TryAcquire(1, 100) {
	}
	if _, b := shed.InUse(); b != 600 {
		t.Fatalf("sheddable took %d, want 600", b)
	}
	// Critical still has its 200 reserve plus the remaining 200 of the pool.
	for i := range 4 {
		if !crit.TryAcquire(1, 100) {
			t.Fatalf("critical refused at %d", i)
		}
	}
	if crit.TryAcquire(1, 100) {
		t.Fatal("budget exceeded")
	}
	shed.Release(1, 100)
	if !crit.TryAcquire(1, 100) {
		t.Fatal("critical could not use freed pool bytes")
	}
	if used, size := bg.InUse(); used > size {
		t.Fatalf("pool used %d > %d", used, size)
	}
}

func TestBudgetAttachValidation(t *testing.T) {
	bg, _ := NewBudget(100)
	w := mustWindow(t, 1, 10)
	if err := bg.Attach(w, 200, Critical); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("over-reserve: %v", err)
	}
	if err := bg.Attach(w, 10, Critical); err != nil {
		t.Fatal(err)
	}
	if err := bg.Attach(w, 10, Critical); !errors.Is(err, ErrInvalidOption) {
		t.Fatalf("double attach: %v", err)
	}
	if _, err := NewBudget(0); !errors.Is(err, ErrInvalidOption) {
		t.Fatal("zero budget accepted")
	}
}

func TestCriticalityParseAndCap(t *testing.T) {
	c, err := ParseCriticality("critical-plus")
	if err != nil || c != CriticalPlus {
		t.Fatalf("%v %v", c, err)
	}
	if _, err := ParseCriticality("urgent"); !errors.Is(err, ErrInvalidOption) {
		t.Fatal("bad name accepted")
	}
	if CriticalPlus.Cap(Critical) != Critical || Sheddable.Cap(Critical) != Sheddable {
		t.Fatal("Cap")
	}
}

// A message larger than its window passes alone, but never through more
// than the Budget can ever give the window: Admissible refuses it (the
// consumer dead-letters it as oversize) instead of letting it take the pool
// past its size. Found by the consumer's simulation (TestSimulation: "the
// window and the Budget are never exceeded").
func TestBudgetNeverAdmitsMoreThanItCanGive(t *testing.T) {
	bg, err := NewBudget(300)
	if err != nil {
		t.Fatal(err)
	}
	w := mustWindow(t, 10, 100)
	if err := bg.Attach(w, 0, Critical); err != nil {
		t.Fatal(err)
	}
	if !w.Admissible(250) || !w.TryAcquire(1, 250) {
		t.Fatal("a message larger than the window but within the Budget was refused")
	}
	if used, size := bg.InUse(); used != 250 || size != 300 {
		t.Fatalf("pool %d of %d", used, size)
	}
	w.Release(1, 250)
	if w.Admissible(731) {
		t.Fatal("a message larger than the whole Budget is admissible")
	}
	if w.TryAcquire(1, 731) {
		used, size := bg.InUse()
		t.Fatalf("a message larger than the whole Budget was admitted: pool %d of %d", used, size)
	}
}
