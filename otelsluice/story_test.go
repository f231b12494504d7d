package otelsluice_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-go/sluice/dlq"
	"github.com/sluice-go/sluice/otelsluice/internal/storytest"
	"github.com/sluice-go/sluice/sluicetest"
)

// The story's harness (storytest) is shared with the runs on the embedded
// brokers, which live in the test-only module otelsluice/brokerstory.
type tracing = storytest.Tracing

var (
	newTracing = storytest.NewTracing
	attr       = storytest.Attr
	eventAttr  = storytest.EventAttr
	wantAttrs  = storytest.WantAttrs
	wantEvents = storytest.WantEvents
	wantLinks  = storytest.WantLinks
	names      = storytest.Names
)

// The story on the in-memory Source: the core and this package alone.
func TestStoryInMemory(t *testing.T) {
	tr := storytest.NewTracing(t)
	src := sluicetest.NewSource()
	src.HonorDelay = true
	sink := &sluicetest.Sink{}
	storytest.Run(t, tr, storytest.Broker{
		Topic:  "mem", // sluicetest's topic
		Source: src,
		Sink:   sink,
		Publish: func(_ context.Context, h map[string][]string, v []byte) error {
			src.Publish("order-1", v, h, time.Now())
			return nil
		},
		Letters: func(context.Context) (dlq.Source, func()) {
			given := false
			return dlq.SourceFunc(func(context.Context, int) ([]*dlq.Pending, error) {
				if given {
					return nil, dlq.ErrDrained
				}
				given = true
				var out []*dlq.Pending
				for i, l := range sink.Letters() {
					// As a broker stores and reads it back.
					k, v, h := l.Encode(dlq.Limits{})
					back, err := dlq.Decode(k, v, h)
					out = append(out, &dlq.Pending{Letter: back, Err: err, Pos: fmt.Sprint("mem#", i)})
				}
				return out, nil
			}), func() {}
		},
		Target: dlq.TargetFunc(func(_ context.Context, m *dlq.Outgoing) error {
			src.Publish("order-1-replayed", m.Value, m.Headers, time.Now())
			return nil
		}),
	})
}
