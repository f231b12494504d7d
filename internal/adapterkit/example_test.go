package adapterkit_test

import (
	"context"
	"fmt"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/adapterkit"
)

type acker struct{ id string }

func (a *acker) Settle(context.Context, consumer.Settlement) error { return nil }
func (a *acker) InProgress(context.Context) error                  { return nil }

// An adapter builds its messages with consumer.NewMessage and gets its own
// Acker back from a message the core hands it (a letter's metadata, a
// settlement), without handlers being able to reach it.
func Example() {
	m := consumer.NewMessage(&acker{id: "delivery-7"})
	a := adapterkit.AckerOf(m).(*acker)
	fmt.Println(a.id)
	fmt.Println(adapterkit.AckerOf(&consumer.Message{}) == nil)
	// Output:
	// delivery-7
	// true
}
