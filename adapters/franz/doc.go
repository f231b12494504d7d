// Package franzadapter connects sluice to Kafka through franz-go
// (github.com/twmb/franz-go/pkg/kgo): a consumer-group Source built from
// the kgo options a service already uses, and a dead-letter Sink on any
// kgo client. It is a thin layer over the Kafka core the kafka-go adapter
// (adapters/kafka) runs on: the same watermarks and settled-offset map in
// commit metadata, the same prefetch buffer and round-robin hand-out, the
// same retry-topic and dead-letter formats, so either adapter reads what
// the other wrote.
//
// The directory is named franz; import it as
//
//	franzadapter "github.com/sluice-go/sluice/adapters/franz"
//
// # Embedding an existing kgo consumer
//
// Keep the options you build your client with (kgo.SeedBrokers,
// kgo.DialTLSConfig, kgo.SASL, kgo.ConsumerGroup, kgo.ConsumeTopics, the
// balancers, timeouts, fetch sizes) and pass them to NewSource instead of
// kgo.NewClient; the PollFetches loop becomes a consumer.Route. The Source
// builds the client when the route attaches it (consumer.New) and adds
// only kgo.DisableAutoCommit and its callbacks (OnPartitionsAssigned,
// OnPartitionsRevoked, OnPartitionsLost, OnOffsetsFetched), which take the
// place of any you set. Source.Client returns the client once attached.
//
// # Memory
//
// kgo keeps one fetch response per broker buffered and sends the next
// fetch only once that one is polled. The Source polls (PollRecords) only
// while its prefetch (Config.PrefetchMessages and PrefetchBytes, default
// the route window) has room, at most its free message slots at a time.
// When the route's window is full, nothing is polled, kgo's buffered fetch
// stays where it is and no further fetch is sent: slowness becomes
// consumer lag at the broker. Unless you set kgo.FetchMaxBytes yourself,
// the Source sizes kgo's fetches from the prefetch (a quarter of
// PrefetchBytes, at most 1 MiB). Source.Bound states the whole bound.
// Buffered records are handed out one partition at a time in turn, so a
// partition's backlog does not starve the others.
//
// # Commits
//
// Messages of one partition complete out of order. Each assigned
// partition has a watermark; the Source commits only the lowest offset not
// yet settled, every Config.CommitInterval (and optionally every
// CommitEvery settlements), through kgo's CommitOffsetsSync, with the map
// of the offsets settled above it in the commit's metadata (the kafka-go
// adapter's format). The next owner of the partition reads the map
// (kgo.OnOffsetsFetched) and passes over what it lists
// (Stats.SkippedSettled), so a rebalance or a restart redoes no settled
// message when the map fits, and a crash redoes at most what was settled
// since the last commit.
//
// # Rebalances
//
// When kgo revokes partitions (OnPartitionsRevoked: eager or
// cooperative-sticky rebalancing, or Close leaving the group), the Source
// stops handing out their buffered records, waits up to RevokeGrace for the
// ones already handed out, commits once more within the generation and
// drops any later settlement (those messages are redelivered to the new
// owner). The route starts none of a revoked partition's messages
// meanwhile (they are consumer.Revocable). With cooperative-sticky
// balancing only the partitions that move are revoked; the others keep
// flowing. Lost partitions (OnPartitionsLost: the member was fenced) are
// dropped without a commit.
//
// # Retries
//
// Nak(delay) keeps the message in the Source when delay is at most
// LocalRetryMaxDelay, within its own allowance, and it does not block its
// partition. Longer delays go to Config.RetryTopic, written through the
// Source's client with the kafka-go adapter's Sluice-Retry-* headers; the
// original is settled only once the copy is acknowledged. The Source
// consumes the retry topic too, holds each retry until its not-before
// (pausing that partition meanwhile with kgo's PauseFetchPartitions), and
// treats its headers as untrusted: a not-before beyond the route's longest
// delay is clamped (Stats.RetryClamped), a foreign origin topic ignored.
// Ordered routes (consumer.ByKey, ByPartition) never use the retry topic.
//
// # Partitions and headers
//
// Everything the Source and the Sink write goes through a kgo client's
// partitioner: kgo's default hashes keys with murmur2 like the Java client
// (the Kafka core's KeyPartition), so a key lands where a Java producer
// would put it. Headers keep their wire order and duplicates through
// sluice's map-shaped headers (HeaderOrder).
package franzadapter
