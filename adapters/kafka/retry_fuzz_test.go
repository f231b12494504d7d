package kafkaadapter

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/sluice-go/sluice/consumer"
)

// FuzzParseRetry: the retry headers of a retry-topic record come from
// whoever can write that topic. parseRetry never panics, leaves no
// Sluice-Retry- header for the handler and never yields a negative
// attempt. The input is NUL-separated name, value pairs.
func FuzzParseRetry(f *testing.F) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	f.Add([]byte(HeaderNotBefore + "\x002026-12-02T12:00:01Z\x00" + HeaderAttempt + "\x003\x00" + HeaderOriginTopic + "\x00orders\x00" +
		HeaderOriginPartition + "\x002\x00" + HeaderOriginOffset + "\x0040\x00App\x00a"))
	f.Add([]byte(HeaderAttempt + "\x00-5\x00" + HeaderNotBefore + "\x009999-12-31T23:59:59Z"))
	f.Add([]byte(HeaderOriginPartition + "\x0099999999999\x00" + HeaderOriginTopic + "\x00x"))
	f.Fuzz(func(t *testing.T, raw []byte) {
		h := consumer.Headers{}
		parts := bytes.Split(raw, []byte{0})
		for i := 0; i+1 < len(parts); i += 2 {
			h[string(parts[i])] = append(h[string(parts[i])], string(parts[i+1]))
		}
		r := &record{headers: h}
		const maxDelay = time.Minute
		parseRetry(r, now, time.Time{}, maxDelay, []string{"orders"})
		if r.attempt < 0 {
			t.Fatalf("attempt %d", r.attempt)
		}
		if r.due.After(now.Add(maxDelay)) {
			t.Fatalf("due %v, after now + the longest delay", r.due)
		}
		if r.origin.Topic != "" && r.origin.Topic != "orders" {
			t.Fatalf("origin topic %q taken from the headers", r.origin.Topic)
		}
		for k := range r.headers {
			if strings.HasPrefix(k, RetryHeaderPrefix) {
				t.Fatalf("retry header %q left for the handler", k)
			}
		}
	})
}
