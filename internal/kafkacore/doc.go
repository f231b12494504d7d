// Package kafkacore is what sluice's Kafka adapters share, whatever client
// they run on (kafka-go in adapters/kafka, franz-go in adapters/franz,
// sarama in adapters/sarama): it imports no Kafka client.
//
//   - Watermark: one partition's commit point under out-of-order
//     completion (the lowest offset delivered and not settled), with the
//     map of offsets settled above it that travels in the commit's
//     metadata (CommitMetadata, Restore, Skip) so that the next owner does
//     not redo them.
//   - EncodeSettled and DecodeSettled: that map's wire format (Settled,
//     Range), within Kafka's default offset.metadata.max.bytes.
//   - HeaderMap and WireHeaders: wire headers (any client type shaped
//     struct{Key string; Value []byte}) to sluice's map-shaped headers and
//     back, keeping wire order and duplicates through HeaderOrder.
//   - Retry, ParseRetry and RetryHeaders: the retry topic's headers, with
//     the clamp of an untrusted not-before and the refusal of a foreign
//     origin topic.
//   - Buffer: the prefetch bound by count and bytes (Reserve before a
//     fetch, Admit what fits round robin across partitions, Force what a
//     client cannot put back), fetch lanes that reserve in turn with a
//     claim for a record too large for one grant, in-process retries with
//     their own allowance (PushDelayed), the round-robin hand-out (Take)
//     and the drop of an ended generation's records (Gen, Purge). Records
//     are the adapter's own type (Item), partitions embed Part.
//   - Murmur2 and KeyPartition: the Java client's default partitioner, for
//     everything sluice writes (dead letters, retry copies, replays).
//
// It is internal: users depend on an adapter, never on this package, so it
// may change with the adapters.
package kafkacore
