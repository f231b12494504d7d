package backpressure_test

import (
	"context"
	"fmt"

	"github.com/sluice-go/sluice/backpressure"
)

// A window of 3 messages covers queued and running work: the fourth is
// refused at once, before any work exists for it, and capacity comes back
// only when a message is settled.
func ExampleWindow() {
	w, _ := backpressure.NewWindow(3, 1<<20)
	for i := 1; i <= 4; i++ {
		fmt.Println(i, w.TryAcquire(1, 512))
	}
	w.Release(1, 512) // one message settled
	_ = w.Acquire(context.Background(), 1, 512)
	n, b := w.InUse()
	fmt.Println("in use:", n, b)
	// Output:
	// 1 true
	// 2 true
	// 3 true
	// 4 false
	// in use: 3 1536
}
