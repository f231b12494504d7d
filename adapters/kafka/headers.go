package kafkaadapter

import (
	"github.com/segmentio/kafka-go"

	"github.com/sluice-go/sluice/internal/kafkacore"
)

// HeaderOrder carries the wire order of a record's headers through sluice's
// map-shaped headers (consumer.Headers, dlq.Letter.Headers): one value per
// header on the wire, naming its key, in order. The Source adds it only
// when the order is not already sorted by key, and everything this package
// writes (dead letters, retry copies, replays) puts the headers back in
// that order and drops HeaderOrder, so a record keeps its header order and
// duplicates end to end. Handlers may see it; they can ignore it.
const HeaderOrder = kafkacore.HeaderOrder

// HeaderOriginPartitions is this package's addition to a dead letter's
// envelope: how many partitions the origin topic had when the letter was
// written. A ReplayTarget sends a replayed message back to its original
// partition only while the topic still has that many.
const HeaderOriginPartitions = kafkacore.HeaderOriginPartitions

// kafkaMetaPrefix starts the names of what this package carries in header
// maps for itself (HeaderOrder, the origin's partition count on a letter
// read back); nothing it writes to a broker keeps them.
const kafkaMetaPrefix = kafkacore.MetaPrefix

// metaOriginPartitions holds HeaderOriginPartitions in a letter's headers
// once dlq.Decode has removed the envelope.
const metaOriginPartitions = kafkacore.MetaOriginPartitions

// headerMap is kafkacore.HeaderMap for kafka-go's headers.
func headerMap(hs []kafka.Header, drop, unordered func(string) bool) (map[string][]string, int64) {
	return kafkacore.HeaderMap(hs, drop, unordered)
}

// wireHeaders is kafkacore.WireHeaders for kafka-go's headers.
func wireHeaders(h map[string][]string, skipPrefix string, out []kafka.Header) []kafka.Header {
	return kafkacore.WireHeaders(h, skipPrefix, out)
}
