package kafkacore_test

import (
	"fmt"

	"github.com/sluice-go/sluice/internal/kafkacore"
)

// A partition's messages settle out of order: the commit point is the
// first one not settled, and the map in the commit's metadata lets the
// next owner skip what was settled above it.
func ExampleWatermark() {
	w := kafkacore.NewWatermark()
	for o := int64(10); o < 15; o++ {
		w.Deliver(o)
	}
	w.Settle(10)
	w.Settle(12)
	w.Settle(13)
	point, meta, _ := w.CommitMetadata()
	w.CommittedMetadata(point, meta)
	fmt.Println("commit at", point)

	next := kafkacore.NewWatermark() // the partition's next owner
	next.Restore(point, meta)
	for o := int64(11); o < 15; o++ {
		fmt.Println(o, "skip:", next.Skip(o))
	}
	// Output:
	// commit at 11
	// 11 skip: false
	// 12 skip: true
	// 13 skip: true
	// 14 skip: false
}

// Everything sluice writes is partitioned like a Java producer would.
func ExampleKeyPartition() {
	fmt.Println(kafkacore.KeyPartition([]byte("order-42"), 12) == int(kafkacore.Murmur2([]byte("order-42"))&0x7fffffff)%12)
	// Output: true
}
