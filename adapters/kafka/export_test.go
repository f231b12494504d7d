package kafkaadapter

import (
	"context"
	"net"

	"github.com/sluice-go/sluice/internal/kafkacore"
)

// SetDial makes c's transport dial with dial (fault injection in tests).
// Call it before the first use of c.
func SetDial(c *Cluster, dial func(ctx context.Context, network, address string) (net.Conn, error)) {
	c.dial = dial
}

// EncodeSettled writes the metadata the Source commits at mark when the
// offsets [lo, hi) of each range (all above mark, in order) are settled.
func EncodeSettled(mark int64, ranges ...[2]int64) string {
	s := make(kafkacore.Settled, len(ranges))
	for i, r := range ranges {
		s[i] = kafkacore.Range{Lo: r[0], Hi: r[1]}
	}
	return kafkacore.EncodeSettled(mark, s)
}

// PlainCommits makes s commit plain watermarks, without the settled map
// (the baseline the map is measured against). Call it before s is used.
func PlainCommits(s *Source) { s.plainCommits = true }

// HeldBound returns what the Source may hold outside the route window by
// the documented bound (Config.PrefetchMessages) when its generations run
// lanes fetch lanes (at most 2; one when PrefetchMessages is below 16 per
// partition): fetched records, at most PrefetchMessages plus one response
// of at most PrefetchMessages per lane; bytes, PrefetchBytes
// (reservations for fetches in flight included). Call it once a route
// attached s.
func HeldBound(s *Source, lanes int) (msgs int, bytes int64) {
	return s.cfg.PrefetchMessages * (1 + min(lanes, fetchLanes)), s.cfg.PrefetchBytes
}
