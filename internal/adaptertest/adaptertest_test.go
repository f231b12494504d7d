package adaptertest_test

import (
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/internal/adaptertest"
	"github.com/sluice-go/sluice/sluicetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The suite checks itself on the in-memory source: a core fixture, not an
// adapter claim (the adapters run it on their real brokers).
func TestSuiteOnMemsource(t *testing.T) {
	adaptertest.Run(t, memBroker{}, adaptertest.Features{Short: true})
}

type memBroker struct{}

func (memBroker) NewTopic(t *testing.T, name string) adaptertest.Topic {
	return &memTopic{groups: map[string]*sluicetest.Source{}}
}

// memTopic is one queue; a group is the queue itself, so a second Source of
// the same group sees only what the first did not settle.
type memTopic struct {
	mu      sync.Mutex
	pending []adaptertest.Msg
	groups  map[string]*sluicetest.Source
}

func (tp *memTopic) Publish(t *testing.T, msgs []adaptertest.Msg) {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	if len(tp.groups) == 0 {
		tp.pending = append(tp.pending, msgs...)
		return
	}
	for _, s := range tp.groups {
		publish(s, msgs)
	}
}

func publish(s *sluicetest.Source, msgs []adaptertest.Msg) {
	for _, m := range msgs {
		h := consumer.Headers{"Id": {m.ID}}
		for k, v := range m.Headers {
			h.Set(k, v)
		}
		s.Publish(m.ID, m.Value, h, time.Now())
	}
}

func (tp *memTopic) Source(t *testing.T, group string) consumer.Source {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	s, ok := tp.groups[group]
	if !ok {
		s = sluicetest.NewSource()
		publish(s, tp.pending)
		tp.groups[group] = s
	}
	return groupMember{s}
}

// groupMember is one consumer of a shared in-memory group: consumers run
// one after another (a restart), so each attaches its own member while the
// queue and ledger are the group's.
type groupMember struct{ *sluicetest.Source }

func (g groupMember) Attach(consumer.RouteLimits) (consumer.SourceInfo, error) {
	return consumer.SourceInfo{AckWait: g.AckWait, MaxDeliver: g.MaxDeliver}, nil
}
