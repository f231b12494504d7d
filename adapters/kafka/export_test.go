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
