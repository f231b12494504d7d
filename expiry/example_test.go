package expiry_test

import (
	"fmt"
	"time"

	"github.com/sluice-go/sluice/expiry"
)

func ExamplePolicy_Deadline() {
	p := expiry.Policy{MaxAge: 30 * time.Second, Skew: time.Second}
	published := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	header := expiry.FormatDeadline(published.Add(5 * time.Second))

	d, _ := p.Deadline(header, true, published)
	fmt.Println(d.Format(time.TimeOnly))
	fmt.Println(expiry.Expired(d, published.Add(4*time.Second)))
	fmt.Println(expiry.Expired(d, published.Add(7*time.Second)))
	// Output:
	// 10:00:06
	// false
	// true
}
