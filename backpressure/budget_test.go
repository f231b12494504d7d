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
