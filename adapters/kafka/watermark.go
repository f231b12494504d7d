package kafkaadapter

import "github.com/sluice-go/sluice/internal/kafkacore"

// Watermark tracks one partition's delivered offsets and which of them are
// settled, and yields the offset that is safe to commit: the lowest offset
// delivered but not settled, or one past the last delivered offset when
// everything is settled. It is the Kafka core's (shared by sluice's Kafka
// adapters), documented there method by method.
type Watermark = kafkacore.Watermark

// NewWatermark returns a tracker with nothing delivered.
func NewWatermark() *Watermark { return kafkacore.NewWatermark() }
