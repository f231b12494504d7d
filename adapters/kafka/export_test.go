package kafkaadapter

import (
	"context"
	"net"
)

// SetDial makes c's transport dial with dial (fault injection in tests).
// Call it before the first use of c.
func SetDial(c *Cluster, dial func(ctx context.Context, network, address string) (net.Conn, error)) {
	c.dial = dial
}

// EncodeSettled writes the metadata the Source commits at mark when the
// offsets [lo, hi) of each range (all above mark, in order) are settled.
func EncodeSettled(mark int64, ranges ...[2]int64) string {
	s := make(settledSet, len(ranges))
	for i, r := range ranges {
		s[i] = offRange{r[0], r[1]}
	}
	return encodeSettled(mark, s)
}

// PlainCommits makes s commit plain watermarks, without the settled map
// (the baseline the map is measured against). Call it before s is used.
func PlainCommits(s *Source) { s.plainCommits = true }
