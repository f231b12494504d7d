package main

import (
	"bytes"
	"encoding/json"
	"testing"
)

func TestRedactorForms(t *testing.T) {
	var r redactor
	r.add(`pa"ss<w>rd`, "ab", "tok123")
	var buf bytes.Buffer
	w := r.writer(&buf)
	j, _ := json.Marshal(map[string]string{"e": `connect with pa"ss<w>rd failed`})
	_, _ = w.Write(j)
	_, _ = w.Write([]byte(" nats://alice:tok123@host:4222 https://x:y@h ab tok123\n"))
	got := buf.String()
	want := `{"e":"connect with [REDACTED] failed"} nats://[REDACTED]@host:4222 https://[REDACTED]@h ab [REDACTED]` + "\n"
	if got != want {
		t.Fatalf("got  %q\nwant %q", got, want)
	}
}
