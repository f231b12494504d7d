package consumer

import (
	"fmt"
	"testing"
	"time"
)

// The failure memory forgets the least recently failed first failures
// beyond its bound, and never a letter awaited for that (issue 24 item 6);
// awaited letters have their own, larger bound, oldest forgotten first.
func TestFailureMemoryBounds(t *testing.T) {
	var f failures
	f.init(1) // 1,028 first failures, 16,448 awaited letters
	msg := func(i int) *Message {
		return &Message{Topic: "t", Key: []byte(fmt.Sprint(i)), Value: []byte("same value")}
	}
	now := time.Now()
	awaited := msg(-1)
	f.update(awaited, func(x *failure) { x.first, x.class, x.cause = now, "exhausted", "boom" })
	for i := range f.maxRetrying {
		f.update(msg(i), func(x *failure) { x.first = now })
	}
	f.update(msg(0), func(x *failure) {}) // failed again: now the most recent
	for i := f.maxRetrying; i < f.maxRetrying+10; i++ {
		f.update(msg(i), func(x *failure) { x.first = now })
	}
	for i := range f.maxRetrying + 10 {
		_, ok := f.get(msg(i))
		if want := i == 0 || i > 10; ok != want {
			t.Errorf("message %d remembered %v, want %v", i, ok, want)
		}
	}
	if x, ok := f.get(awaited); !ok || x.class != "exhausted" {
		t.Fatalf("awaited letter forgotten: %+v %v", x, ok)
	}
	for i := range f.maxAwaiting {
		f.update(msg(1_000_000+i), func(x *failure) { x.class = "exhausted" })
	}
	if _, ok := f.get(awaited); ok {
		t.Error("the oldest awaited letter beyond the bound is still remembered")
	}
	if _, ok := f.get(msg(1_000_000)); !ok {
		t.Error("a newer awaited letter was forgotten")
	}
	if f.retrying.Len()+f.awaiting.Len() != len(f.entries) {
		t.Fatalf("lists %d + %d, map %d", f.retrying.Len(), f.awaiting.Len(), len(f.entries))
	}
}
