package sluicetest

import (
	"context"
	"fmt"
	"runtime/debug"

	"github.com/sluice-go/sluice/consumer"
)

// Messages returns one message per value, keyed "m0", "m1", … in order,
// for RunBatch. Each is settled through a no-op Acker.
func Messages(values ...string) []*consumer.Message {
	out := make([]*consumer.Message, len(values))
	for i, v := range values {
		m := consumer.NewMessage(nopAcker{})
		m.Topic, m.Key, m.Value, m.Attempt = "mem", []byte(fmt.Sprint("m", i)), []byte(v), 1
		out[i] = m
	}
	return out
}

type nopAcker struct{}

func (nopAcker) Settle(context.Context, consumer.Settlement) error { return nil }
func (nopAcker) InProgress(context.Context) error                  { return nil }

// BatchResult is what a BatchHandler decided for one batch.
type BatchResult struct {
	// Err is the handler's result (consumer.ErrPanic wrapped around a
	// panic).
	Err error
	// Errs is, per message, the error it settles with: its Batch.Fail
	// mark, else Err. nil means it succeeded.
	Errs []error
}

// Succeeded counts the messages that settle as succeeded.
func (r BatchResult) Succeeded() int {
	n := 0
	for _, e := range r.Errs {
		if e == nil {
			n++
		}
	}
	return n
}

// Permanent returns the indexes of the messages that go to the dead-letter
// sink at once (consumer.IsPermanent).
func (r BatchResult) Permanent() []int {
	var out []int
	for i, e := range r.Errs {
		if e != nil && consumer.IsPermanent(e) {
			out = append(out, i)
		}
	}
	return out
}

// RunBatch runs h once on a batch of msgs, as a route would, and returns
// what each message settles with: a unit test of a BatchHandler's
// per-message outcomes without a route or a broker. A panic is recovered
// as consumer.ErrPanic, as the route does. To test the whole route (its
// window, deadlines and retries), run a Consumer on a Source with a
// BatchHandler and RunUntil.
func RunBatch(ctx context.Context, h consumer.BatchHandler, msgs ...*consumer.Message) BatchResult {
	b := consumer.NewBatch(msgs...)
	err := func() (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("%w: %v\n%s", consumer.ErrPanic, p, debug.Stack())
			}
		}()
		return h(ctx, b)
	}()
	res := BatchResult{Err: err, Errs: make([]error, b.Len())}
	for i := range res.Errs {
		if res.Errs[i] = b.Failed(i); res.Errs[i] == nil {
			res.Errs[i] = err
		}
	}
	return res
}
