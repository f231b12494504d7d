package main

import (
	"fmt"
	"time"
)

// The lab's tables are pipe-separated and aligned, so they paste into
// Markdown as they are.
func Example_table() {
	fmt.Print(table([]string{"policy", "goodput", "p99"}, [][]string{
		{"unbounded FIFO", rate(0), ms(0)},
		{"sluice", rate(187.4), ms(421 * time.Millisecond)},
	}))
	// Output:
	// | policy         | goodput | p99    |
	// | -------------- | ------- | ------ |
	// | unbounded FIFO | 0/s     | -      |
	// | sluice         | 187/s   | 421 ms |
}
