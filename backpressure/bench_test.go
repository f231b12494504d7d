package backpressure

import "testing"

func BenchmarkWindowAcquireRelease(b *testing.B) {
	w, _ := NewWindow(1024, 1<<30)
	b.ReportAllocs()
	for b.Loop() {
		if !w.TryAcquire(1, 128) {
			b.Fatal("refused")
		}
		w.Release(1, 128)
	}
}
