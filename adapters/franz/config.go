package franzadapter

import (
	"cmp"
	"fmt"
	"log/slog"
	"time"

	"github.com/sluice-go/sluice/consumer"
)

// Defaults of Config.
const (
	DefaultCommitInterval     = time.Second
	DefaultPollWait           = time.Second
	DefaultRevokeGrace        = 2 * time.Second
	DefaultLocalRetryMaxDelay = 5 * time.Second
)

// Config configures a Source: what sluice adds to the kgo client built from
// your options (brokers, TLS, SASL, kgo.ConsumerGroup, kgo.ConsumeTopics
// and anything else you set stay yours). Every zero value picks the
// default named. The route's window is not stated here: the Source learns
// it when the route attaches it (consumer.New) and sizes its prefetch
// from it.
type Config struct {
	// PrefetchMessages and PrefetchBytes bound what the Source holds that
	// the route's window does not: records polled from the client and not
	// handed out yet (and messages waiting for an in-process retry beyond
	// their own allowance). 0 means the window's numbers. The Source polls
	// (kgo's PollRecords) only while the prefetch has room, at most its free
	// message slots at a time; what kgo itself buffers (one fetch response
	// per broker, at most kgo.FetchMaxBytes) comes on top: see Source.Bound.
	PrefetchMessages int
	PrefetchBytes    int64
	// PollWait is the longest one Fetch blocks without a message. 0 means 1 s.
	PollWait time.Duration
	// CommitInterval is how often watermarks are committed. 0 means 1 s;
	// negative is invalid.
	CommitInterval time.Duration
	// CommitEvery also commits once this many messages were settled since
	// the last commit. 0 means interval only.
	CommitEvery int
	// RevokeGrace is how long, when partitions are revoked (kgo's
	// OnPartitionsRevoked), the Source waits for the messages it handed out
	// from them to be settled before their final commit. Settlements after
	// that are dropped: those messages are redelivered (duplicates). 0
	// means 2 s; negative means no wait. Keep it below the group's
	// rebalance timeout (kgo.RebalanceTimeout, 60 s by default).
	RevokeGrace time.Duration
	// LocalRetryMaxDelay: a Nak with a delay up to this stays in process
	// (the message waits in the Source and is handed out again with Attempt
	// + 1, without blocking its partition). Longer delays go to RetryTopic
	// when set. 0 means 5 s.
	LocalRetryMaxDelay time.Duration
	// LocalRetryMessages and LocalRetryBytes are the allowance of messages
	// waiting in process for a retry, outside the prefetch (retry-topic
	// records waiting for their not-before count too). 0 means 16 ×
	// PrefetchMessages and 1 × PrefetchBytes (as the kafka-go adapter);
	// negative is invalid.
	LocalRetryMessages int
	LocalRetryBytes    int64
	// RetryTopic, when set, receives long retries with a not-before header
	// (the same headers as the kafka-go adapter's, so either reads the
	// other's), written through the Source's own client; the Source adds it
	// to the topics it consumes. A retry record is handed out once its
	// not-before has passed; while it waits, its partition is paused
	// (kgo's PauseFetchPartitions), so it holds at most what one poll
	// brought. "" keeps all retries in process.
	RetryTopic string
	// Logger receives errors the Source cannot return (a failed commit, a
	// fetch error). nil: none.
	Logger *slog.Logger
	// Clock reads time for not-before decisions. nil means the system clock.
	Clock consumer.Clock
	// OnCommit, if set, is called after every accepted commit with the
	// offsets committed (topic → partition → offset).
	OnCommit func(offsets map[string]map[int32]int64)
}

func (c *Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: franz source: "+format, append([]any{consumer.ErrInvalidOption}, args...)...)
	}
	switch {
	case c.PrefetchMessages < 0 || c.PrefetchBytes < 0 || c.LocalRetryMessages < 0 || c.LocalRetryBytes < 0:
		return bad("prefetch sizes must not be negative")
	case c.PollWait < 0 || c.CommitInterval < 0 || c.LocalRetryMaxDelay < 0:
		return bad("durations must not be negative")
	case c.CommitEvery < 0:
		return bad("CommitEvery must be >= 0, got %d", c.CommitEvery)
	}
	c.PollWait = cmp.Or(c.PollWait, DefaultPollWait)
	c.CommitInterval = cmp.Or(c.CommitInterval, DefaultCommitInterval)
	c.RevokeGrace = cmp.Or(c.RevokeGrace, DefaultRevokeGrace)
	c.LocalRetryMaxDelay = cmp.Or(c.LocalRetryMaxDelay, DefaultLocalRetryMaxDelay)
	return nil
}

// sizeFrom fills the prefetch sizes the route's window implies.
func (c *Config) sizeFrom(l consumer.RouteLimits) {
	c.PrefetchMessages = cmp.Or(c.PrefetchMessages, l.Messages)
	c.PrefetchBytes = cmp.Or(c.PrefetchBytes, l.Bytes)
	c.LocalRetryMessages = cmp.Or(c.LocalRetryMessages, 16*c.PrefetchMessages)
	c.LocalRetryBytes = cmp.Or(c.LocalRetryBytes, c.PrefetchBytes)
}
