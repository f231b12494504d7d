package kafkaadapter

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"

	"github.com/sluice-go/sluice/consumer"
)

// DefaultClientID is the client id sluice sends when Cluster.ClientID is "".
const DefaultClientID = "sluice"

// Cluster is how to reach one Kafka cluster. Every Source, DeadLetterSink,
// retry writer, LetterSource, ReplayTarget and GetLetter built from the same
// *Cluster share one kafka.Transport (connections, metadata cache), and its
// consumer groups dial the coordinator with the same TLS and SASL settings.
//
// Fill the exported fields, then use it by pointer only; do not copy or
// change it after the first use. It needs no Close: the shared connections
// are closed when the last Source, sink, target or letter source built from
// it is closed, and opened again by the next one.
//
// The transport asks the brokers only for the metadata of the topics its
// users read and write (kafka.Transport.MetadataTopics), not of every topic
// in the cluster. When a new user needs a topic it does not know yet, the
// Cluster starts a new transport for the larger set and retires the old
// one once its requests have finished.
type Cluster struct {
	// Brokers are the bootstrap addresses, host:port (required).
	Brokers []string
	// TLS, when set, makes every connection TLS. nil means plaintext.
	TLS *tls.Config
	// SASL, when set, authenticates every connection (kafka-go's
	// sasl/plain or sasl/scram). nil means none.
	SASL sasl.Mechanism
	// ClientID is sent with every request. "" means DefaultClientID.
	ClientID string
	// DialTimeout bounds establishing one connection, TLS and SASL
	// included. 0 means 10 s.
	DialTimeout time.Duration

	// dial replaces how transport connections are made (tests inject
	// faults with it; see export_test.go).
	dial func(ctx context.Context, network, address string) (net.Conn, error)

	mu     sync.Mutex
	refs   int
	topics []string // sorted: the current transport's MetadataTopics
	cur    atomic.Pointer[sharedTransport]
	rt     clusterRoundTripper
}

// DefaultDialTimeout is Cluster.DialTimeout's default.
const DefaultDialTimeout = 10 * time.Second

func (c *Cluster) validate(what string) error {
	if c == nil {
		return fmt.Errorf("%w: kafka %s: nil Cluster", consumer.ErrInvalidOption, what)
	}
	if len(c.Brokers) == 0 {
		return fmt.Errorf("%w: kafka %s: Cluster has no Brokers", consumer.ErrInvalidOption, what)
	}
	for _, b := range c.Brokers {
		if _, _, err := net.SplitHostPort(b); err != nil {
			return fmt.Errorf("%w: kafka %s: broker %q: %v", consumer.ErrInvalidOption, what, b, err)
		}
	}
	if c.DialTimeout < 0 {
		return fmt.Errorf("%w: kafka %s: negative DialTimeout", consumer.ErrInvalidOption, what)
	}
	return nil
}

func (c *Cluster) clientID() string { return cmp.Or(c.ClientID, DefaultClientID) }

func (c *Cluster) dialTimeout() time.Duration { return cmp.Or(c.DialTimeout, DefaultDialTimeout) }

// dialer returns a kafka.Dialer with the cluster's settings, for the
// consumer group's coordinator connection (kafka-go's ConsumerGroup dials
// its own).
func (c *Cluster) dialer() *kafka.Dialer {
	return &kafka.Dialer{
		ClientID: c.clientID(), Timeout: c.dialTimeout(), DualStack: true,
		TLS: c.TLS, SASLMechanism: c.SASL,
	}
}

// addr is the bootstrap address for kafka-go clients.
func (c *Cluster) addr() net.Addr { return kafka.TCP(c.Brokers...) }

// acquire registers one user of the shared transport that reads or writes
// topics, and returns the RoundTripper to use. Call release when done.
func (c *Cluster) acquire(topics ...string) kafka.RoundTripper {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refs++
	if c.rt.c == nil {
		// Once: later Sources share rt while earlier ones' requests read
		// rt.c without the lock.
		c.rt.c = c
	}
	c.useLocked(topics)
	return &c.rt
}

// use makes sure the shared transport knows the metadata of topics (a
// replay destination learned late, say).
func (c *Cluster) use(topics ...string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.useLocked(topics)
}

func (c *Cluster) useLocked(topics []string) {
	grew := false
	for _, t := range topics {
		if t == "" {
			continue
		}
		if i, found := slices.BinarySearch(c.topics, t); !found {
			c.topics = slices.Insert(c.topics, i, t)
			grew = true
		}
	}
	if !grew && c.cur.Load() != nil {
		return
	}
	next := &sharedTransport{t: &kafka.Transport{
		Dial: c.dial, DialTimeout: c.dialTimeout(), ClientID: c.clientID(), TLS: c.TLS, SASL: c.SASL,
		MetadataTopics: slices.Clone(c.topics),
	}}
	if old := c.cur.Swap(next); old != nil {
		old.retire()
	}
}

// release ends one user's claim; the last one closes the connections.
func (c *Cluster) release() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refs--
	if c.refs == 0 {
		if st := c.cur.Load(); st != nil {
			st.t.CloseIdleConnections()
		}
	}
}

// client returns a kafka-go Client on the shared transport.
func (c *Cluster) client(rt kafka.RoundTripper) *kafka.Client {
	return &kafka.Client{Addr: c.addr(), Transport: rt, Timeout: 10 * time.Second}
}

// sharedTransport is one generation of the cluster's transport. A retired
// one takes no new requests and closes its connections once the requests
// it carries have finished.
type sharedTransport struct {
	t        *kafka.Transport
	inflight atomic.Int64
	retired  atomic.Bool
}

func (s *sharedTransport) retire() {
	s.retired.Store(true)
	if s.inflight.Load() == 0 {
		s.t.CloseIdleConnections()
	}
}

// enter claims s for one request; false when s is retired.
func (s *sharedTransport) enter() bool {
	s.inflight.Add(1)
	if s.retired.Load() {
		s.leave()
		return false
	}
	return true
}

func (s *sharedTransport) leave() {
	if s.inflight.Add(-1) == 0 && s.retired.Load() {
		s.t.CloseIdleConnections()
	}
}

// clusterRoundTripper sends each request on the cluster's current
// transport.
type clusterRoundTripper struct{ c *Cluster }

func (r *clusterRoundTripper) RoundTrip(ctx context.Context, addr net.Addr, req kafka.Request) (kafka.Response, error) {
	for {
		st := r.c.cur.Load()
		if !st.enter() {
			continue // swapped meanwhile: the next Load sees the new one
		}
		res, err := st.t.RoundTrip(ctx, addr, req)
		st.leave()
		return res, err
	}
}
