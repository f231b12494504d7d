// Package kafkaadapter connects sluice to Kafka through
// github.com/segmentio/kafka-go: a consumer-group Source with per-partition
// commit watermarks, a dead-letter Sink writing to a topic, and an optional
// retry topic for long retries.
//
// The directory is named kafka, but the package is kafkaadapter so it does
// not collide with github.com/segmentio/kafka-go. Import it as
//
//	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
//
// # Connections
//
// A Cluster says how to reach one cluster: brokers, TLS, SASL (kafka-go's
// sasl/plain or sasl/scram), client id, dial timeout. Everything built from
// the same *Cluster (Sources, the retry writer, DeadLetterSink,
// LetterSource, ReplayTarget, GetLetter) shares one kafka.Transport whose
// metadata requests name only the topics they use, and the consumer
// groups' coordinator connections use the same TLS and SASL. A Source
// joins its group when its route attaches it (consumer.New); Source.Ready
// then returns once the group has formed (before that, ErrNotAttached).
//
// # Memory and fairness
//
// Two goroutines per generation fetch the assigned partitions, half each
// (one fetches them all when their number is odd), with one multi-partition Fetch per
// leader broker, into one buffer bounded by
// Config.PrefetchMessages and PrefetchBytes (default: the route window).
// A fetch is sent only when there is room; of each response the Source
// keeps only what fits (count and bytes) and drops the rest, fetching it
// again from its first offset once room frees, so the records it holds
// never exceed the prefetch, whatever batch sizes the producers use. A
// record larger than the fetch that brought it, dropped because it did
// not fit, is fetched again by the same fetcher once there is room for it
// (the whole prefetch for a record larger than that, which is then held
// alone), and the other fetcher does not reserve room until then: every
// record is admitted, after a bounded number of fetches. What
// is in transit is one response per fetcher and leader broker, at most
// FetchMaxBytes or one record batch larger than that (Source.Bound). When the route's
// window is full the buffer stays full and no fetch is sent: slowness
// becomes consumer lag at the broker, not memory in the process.
//
// Partitions are served round robin: each request lists the partitions in
// a rotating order with an equal share of the bytes, a response's records
// are kept a record per partition in turn, and Fetch hands out one record
// per partition in turn. A partition's backlog cannot starve the others,
// and their deadlines run down evenly.
//
// # Commits
//
// Messages of one partition complete out of order. Each partition has a
// Watermark; the Source commits only the lowest offset not yet settled
// (acked, dead-lettered, expired, or written to the retry topic), batched
// every CommitInterval and optionally every CommitEvery settlements, never
// backwards. This avoids the kafka-go Reader behaviour of committing past
// unfinished work when handlers complete out of order (kafka-go #202, #764).
//
// Completed work is not redone: each commit's metadata carries a map of the
// offsets settled above the commit point (run-length ranges, DEFLATE when
// that is shorter, base64; within Kafka's default offset.metadata.max.bytes
// of 4 KiB, keeping as many ranges as fit). The Source that is assigned the
// partition next (after a restart or a rebalance) reads the map with the
// committed offset and passes over the records it lists
// (Stats.SkippedSettled). So one message retried for a while holds the
// commit point back without making everything after it run again: a
// graceful stop or a rebalance re-runs no settled message when the map
// fits, and a crash (SIGKILL) re-runs at most what was settled since the
// last commit (about one CommitInterval). Metadata another client or an
// older sluice wrote, or a map for another offset, reads as a plain
// commit point. A broker that refuses the metadata as too large gets the
// plain commit points. The replay LetterSource keeps its map the same way.
//
// # Rebalances
//
// The Source runs on kafka-go's ConsumerGroup and Generation API. When a
// generation ends it stops handing out that generation's buffered messages,
// waits up to RevokeGrace for the messages already handed out, commits the
// watermarks once more inside the old generation, and then drops any later
// settlement: nothing is committed for a partition it no longer owns or
// with a stale generation (kafka-go #1308, #1398). The route starts none of
// the ended generation's messages meanwhile (they are consumer.Revocable):
// it hands them back, and the next owner delivers them again from that
// final commit. The price is duplicates of messages still running when
// RevokeGrace ends (their settlement is dropped), since the group protocol
// (eager rebalancing) revokes every partition on each rebalance; settled
// messages above an unsettled one are in the commit's map and not redone.
//
// # Ordered routes
//
// A route with consumer.ByKey or consumer.ByPartition keeps a key's (a
// partition's) messages in offset order in process, retrying in place.
// Across a rebalance, Kafka's assignment gives a partition, and so each key
// (Kafka's partitioner puts a key in one partition), to one member at a
// time; the old owner starts nothing of the ended generation and commits
// before the new owner starts, so the new owner continues each key where
// the old one stopped, in order. A handler still running when RevokeGrace
// ends may overlap the new owner's run of the same key: keep RevokeGrace
// above the longest handler run of an ordered route. The Source never
// sends an ordered route's messages to the retry topic.
//
// # Retries
//
// Nak(delay) keeps the message in the Source when delay is at most
// LocalRetryMaxDelay: it is handed out again after the delay with Attempt+1
// and does not block its partition (the partition's commit waits for it).
// Longer delays go to Config.RetryTopic, when set, with the original key,
// value and headers plus Sluice-Retry-Not-Before, -Attempt, -First-Failure,
// and the origin topic, partition, offset and publish time; the original is
// settled only after all replicas stored the copy. If that write fails the
// message stays in process. Messages waiting in process for a retry have
// an allowance of their own (Config.LocalRetryMessages, LocalRetryBytes),
// outside the prefetch: poison messages nak'd again and again while their
// dead letter cannot be written do not take the slots of new records.
// Beyond the allowance a Nak goes to the retry topic, or (without one)
// takes from the prefetch. The Source consumes the retry topic too and
// holds each retry until its not-before.
//
// A retry record's headers are untrusted: a not-before further out than
// the longest delay the route asks for after the record was written (its
// timestamp, or when the Source first read it if that is earlier) is
// clamped to that (Stats.RetryClamped), and an origin topic that is not one of the
// Source's topics is ignored (RetryOriginRefused), so a forged or skewed
// record can neither hold its partition back nor steer where its dead
// letter or replay goes. Retry copies are only ever written to RetryTopic.
//
// # Partitions and headers of what sluice writes
//
// Dead letters, retry copies and replays are partitioned by key with
// murmur2, the Java client's default (librdkafka's murmur2_random), so a
// key lands where a Java producer would put it. A replay goes back to the
// original partition when the origin topic still has the partition count
// recorded in the letter (HeaderOriginPartitions; ReplayTargetOptions.Rehash
// re-hashes instead). Headers keep their wire order and duplicates through
// sluice's map-shaped headers (HeaderOrder).
//
// # Embedding
//
// ConfigFromReader turns an existing kafka.ReaderConfig into a Config for
// NewSource. NewReaderSource wraps a live group *kafka.Reader instead,
// committing watermarks through CommitMessages; the plain Reader hides
// rebalances, so that Source cannot fence commits by generation (see its
// doc for what that means).
//
// # The Kafka core
//
// What makes this Source correct does not depend on kafka-go: the
// watermarks and the settled map, the prefetch buffer and its fairness,
// the retry headers and their clamp, header order and murmur2 live in the
// core module (internal/kafkacore), shared with sluice's other Kafka
// client adapters; this package is the kafka-go layer over it.
//
// # Deadlines
//
// Message.PublishedAt is the record timestamp (the original's for retries),
// so consumer.Route.Expiry's MaxAge and deadline header apply as for any
// broker.
package kafkaadapter
