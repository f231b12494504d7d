package sluicetest_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/sluice-go/sluice/consumer"
	"github.com/sluice-go/sluice/sluicetest"
)

func TestRunBatch(t *testing.T) {
	h := func(ctx context.Context, b *consumer.Batch) error {
		for i, m := range b.Messages {
			if string(m.Value) == "bad" {
				b.Fail(i, consumer.Permanent(errors.New("bad row")))
			}
		}
		return nil
	}
	res := sluicetest.RunBatch(context.Background(), h, sluicetest.Messages("a", "bad", "c")...)
	if res.Err != nil || res.Succeeded() != 2 || !slices.Equal(res.Permanent(), []int{1}) {
		t.Fatalf("%+v", res)
	}
	down := errors.New("down")
	res = sluicetest.RunBatch(context.Background(), func(context.Context, *consumer.Batch) error { return down }, sluicetest.Messages("a", "b")...)
	if res.Succeeded() != 0 || !errors.Is(res.Errs[0], down) || !errors.Is(res.Errs[1], down) {
		t.Fatalf("%+v", res)
	}
	res = sluicetest.RunBatch(context.Background(), func(context.Context, *consumer.Batch) error { panic("boom") }, sluicetest.Messages("a")...)
	if !errors.Is(res.Errs[0], consumer.ErrPanic) {
		t.Fatalf("%+v", res)
	}
}
