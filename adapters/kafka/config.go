package kafkaadapter

import (
	"cmp"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/consumer"
)

// Defaults of Config.
const (
	DefaultCommitInterval     = time.Second
	DefaultFetchMaxWait       = time.Second
	DefaultPollWait           = time.Second
	DefaultRevokeGrace        = 2 * time.Second
	DefaultLocalRetryMaxDelay = 5 * time.Second
	DefaultSessionTimeout     = 10 * time.Second
	DefaultHeartbeatInterval  = 3 * time.Second
	DefaultRebalanceTimeout   = 10 * time.Second
	maxFetchBytes             = 1 << 20
)

// Config configures a group Source. Cluster, GroupID and Topics are
// required; every other zero value picks the default named. The route's
// window is not stated here: the Source learns it when the route attaches
// it (consumer.New), and sizes its prefetch from it.
type Config struct {
	// Cluster is the Kafka cluster to read (and write retries to). Sources,
	// sinks and replay targets built from one *Cluster share its transport.
	Cluster *Cluster
	GroupID string
	Topics  []string

	// PrefetchMessages and PrefetchBytes bound what the Source holds that
	// the route's window does not: fetched records not handed out yet (and
	// messages waiting for an in-process retry beyond their own allowance,
	// LocalRetryMessages and LocalRetryBytes). 0 means the window's
	// numbers. PrefetchBytes is the memory bound: the bytes held, plus the
	// room reserved for fetches in flight, never exceed it (one record
	// larger than it alone excepted); of a response the Source keeps what
	// fits and fetches the rest again once room frees. PrefetchMessages
	// gates sending a fetch (one is sent while a quarter of the slots are
	// free), and of its response the Source keeps up to PrefetchMessages
	// records, whatever it holds already: a broker returns a partition's
	// whole first record batch, and dropping what exceeds the free slots
	// made every record be fetched and decoded several times. So the
	// records held stay below PrefetchMessages plus one response of at most
	// PrefetchMessages per fetch lane (two lanes when PrefetchMessages is at
	// least 16 per partition and the partitions split evenly, else one):
	// under 3 × PrefetchMessages.
	//
	// On top of that, one fetch response per lane and leader broker is in
	// transit (see Source.Bound): at most FetchMaxBytes, or one record
	// batch larger than that (a broker returns a whole first batch even
	// when it is larger than asked; keep producer batches below
	// FetchMaxBytes and there is no excess).
	PrefetchMessages int
	PrefetchBytes    int64
	// FetchMaxBytes is the MaxBytes of one fetch request. 0 means
	// PrefetchBytes/4, at most 1 MiB.
	FetchMaxBytes int
	// FetchMaxWait is how long the broker holds a fetch when no data is
	// there. 0 means 1 s. It delays nothing (a fetch returns as soon as a
	// record arrives): an idle Source sends one fetch per leader broker per
	// FetchMaxWait, so it sets what idle routes cost.
	FetchMaxWait time.Duration
	// PollWait is the longest one Fetch blocks without a message. 0 means 1 s.
	PollWait time.Duration

	// CommitInterval is how often watermarks are committed. 0 means 1 s;
	// negative is invalid.
	CommitInterval time.Duration
	// CommitEvery also commits once this many messages were settled since
	// the last commit. 0 means interval only.
	CommitEvery int
	// StartOffset is where a partition without a committed offset starts:
	// kafka.FirstOffset (the default, 0 means it) or kafka.LastOffset.
	StartOffset int64

	// Group membership timing; see kafka.ConsumerGroupConfig. 0 means 10 s,
	// 3 s and 10 s. Brokers refuse session timeouts below their
	// group.min.session.timeout.ms (6 s by default, kfake too).
	SessionTimeout    time.Duration
	HeartbeatInterval time.Duration
	RebalanceTimeout  time.Duration
	// RevokeGrace is how long, when a generation ends, the Source waits for
	// messages it handed out from it to be settled before its final commit.
	// Settlements after that are dropped: those messages are redelivered
	// (duplicates). 0 means 2 s; negative means no wait.
	RevokeGrace time.Duration

	// LocalRetryMaxDelay: a Nak with a delay up to this stays in process
	// (the message waits in the Source and is handed out again with Attempt
	// + 1, without blocking its partition). Longer delays go to RetryTopic
	// when set. 0 means 5 s.
	LocalRetryMaxDelay time.Duration
	// LocalRetryMessages and LocalRetryBytes are the allowance of messages
	// waiting in process for a retry (a Nak), outside the prefetch: while
	// they wait they do not take the slots of new records, so poison
	// messages nak'd again and again (their dead letter cannot be written)
	// do not stop good ones. Beyond it a Nak goes to RetryTopic when there
	// is one; else it takes from the prefetch (fetching slows, and stops
	// once they hold it all: a Nak never loses a message). 0 means 16 ×
	// PrefetchMessages and PrefetchBytes; negative is invalid.
	LocalRetryMessages int
	LocalRetryBytes    int64
	// RetryTopic, when set, receives long retries with a not-before header;
	// the Source also consumes it (add it to no other Source). "" keeps all
	// retries in process. A retry partition hands its records out in
	// offset order, each once its not-before has passed (so one long delay
	// holds back shorter ones written after it on that partition); while it
	// waits it holds neither memory nor prefetch budget, and other
	// partitions are not held back. A retry partition without a committed
	// offset starts at its first offset, whatever StartOffset says: it holds
	// only work whose originals are committed.
	RetryTopic string

	// Logger and ErrorLogger receive kafka-go's group logs. nil: none.
	Logger      kafka.Logger
	ErrorLogger kafka.Logger
	// Clock reads time for not-before decisions. nil means the system clock.
	Clock consumer.Clock
	// OnCommit, if set, is called after every accepted commit with the
	// generation and the offsets committed (topic → partition → offset).
	OnCommit func(generation int32, offsets map[string]map[int]int64)
}

func (c *Config) validate() error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: kafka source: "+format, append([]any{consumer.ErrInvalidOption}, args...)...)
	}
	if err := c.Cluster.validate("source"); err != nil {
		return err
	}
	switch {
	case c.GroupID == "":
		return bad("no GroupID")
	case len(c.Topics) == 0:
		return bad("no Topics")
	case c.PrefetchMessages < 0 || c.PrefetchBytes < 0 || c.FetchMaxBytes < 0 || c.LocalRetryMessages < 0 || c.LocalRetryBytes < 0:
		return bad("prefetch sizes must not be negative")
	case c.FetchMaxWait < 0 || c.PollWait < 0 || c.CommitInterval < 0 || c.LocalRetryMaxDelay < 0:
		return bad("durations must not be negative")
	case c.SessionTimeout < 0 || c.HeartbeatInterval < 0 || c.RebalanceTimeout < 0:
		return bad("group timing must not be negative")
	case c.HeartbeatInterval >= cmp.Or(c.SessionTimeout, DefaultSessionTimeout):
		return bad("HeartbeatInterval %v must be below SessionTimeout %v", c.HeartbeatInterval, cmp.Or(c.SessionTimeout, DefaultSessionTimeout))
	case c.RevokeGrace >= cmp.Or(c.RebalanceTimeout, DefaultRebalanceTimeout):
		// The member would rejoin after the broker gave up on it: the final
		// commit is refused and every settled message is delivered again.
		return bad("RevokeGrace %v must be below RebalanceTimeout %v", c.RevokeGrace, cmp.Or(c.RebalanceTimeout, DefaultRebalanceTimeout))
	case c.CommitEvery < 0:
		return bad("CommitEvery must be >= 0, got %d", c.CommitEvery)
	case c.StartOffset != 0 && c.StartOffset != kafka.FirstOffset && c.StartOffset != kafka.LastOffset:
		return bad("StartOffset must be kafka.FirstOffset or kafka.LastOffset")
	}
	for _, t := range c.Topics {
		if t == "" || t == c.RetryTopic {
			return bad("topic %q is empty or the RetryTopic", t)
		}
	}
	c.FetchMaxWait = cmp.Or(c.FetchMaxWait, DefaultFetchMaxWait)
	c.PollWait = cmp.Or(c.PollWait, DefaultPollWait)
	c.CommitInterval = cmp.Or(c.CommitInterval, DefaultCommitInterval)
	c.StartOffset = cmp.Or(c.StartOffset, kafka.FirstOffset)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, DefaultSessionTimeout)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval)
	c.RebalanceTimeout = cmp.Or(c.RebalanceTimeout, DefaultRebalanceTimeout)
	c.RevokeGrace = cmp.Or(c.RevokeGrace, DefaultRevokeGrace)
	c.LocalRetryMaxDelay = cmp.Or(c.LocalRetryMaxDelay, DefaultLocalRetryMaxDelay)
	return nil
}

// sizeFrom fills the prefetch numbers left at zero from the route's window.
func (c *Config) sizeFrom(l consumer.RouteLimits) {
	c.PrefetchMessages = cmp.Or(c.PrefetchMessages, l.Messages)
	c.PrefetchBytes = cmp.Or(c.PrefetchBytes, l.Bytes)
	if c.FetchMaxBytes == 0 {
		c.FetchMaxBytes = int(min(c.PrefetchBytes/4, maxFetchBytes))
	}
	c.FetchMaxBytes = int(max(1, min(int64(c.FetchMaxBytes), c.PrefetchBytes)))
	c.LocalRetryMessages = cmp.Or(c.LocalRetryMessages, 16*c.PrefetchMessages)
	c.LocalRetryBytes = cmp.Or(c.LocalRetryBytes, c.PrefetchBytes)
}

// ConfigFromReader builds a Config from a kafka-go group ReaderConfig
// (GroupID, Brokers, GroupTopics or Topic, the Dialer's TLS, SASL, client
// id and timeout as a new Cluster, StartOffset, session,
// heartbeat and rebalance timing, CommitInterval, MaxBytes, MaxWait,
// loggers), so an application that configured a kafka.Reader can move to a
// Source without restating it. QueueCapacity is replaced by the route's
// window.
func ConfigFromReader(rc kafka.ReaderConfig) Config {
	topics := rc.GroupTopics
	if len(topics) == 0 && rc.Topic != "" {
		topics = []string{rc.Topic}
	}
	cl := &Cluster{Brokers: rc.Brokers}
	if d := rc.Dialer; d != nil {
		cl.TLS, cl.SASL, cl.ClientID, cl.DialTimeout = d.TLS, d.SASLMechanism, d.ClientID, d.Timeout
	}
	c := Config{
		Cluster: cl, GroupID: rc.GroupID, Topics: topics,
		StartOffset:    rc.StartOffset,
		SessionTimeout: rc.SessionTimeout, HeartbeatInterval: rc.HeartbeatInterval,
		RebalanceTimeout: rc.RebalanceTimeout, CommitInterval: rc.CommitInterval,
		FetchMaxBytes: rc.MaxBytes, FetchMaxWait: rc.MaxWait,
		Logger: rc.Logger, ErrorLogger: rc.ErrorLogger,
	}
	if c.CommitInterval < 0 {
		c.CommitInterval = 0
	}
	return c
}
