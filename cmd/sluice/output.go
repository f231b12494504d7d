package main

import (
	"encoding/json"
	"io"
	"time"
)

// writeJSON prints v as indented JSON (encoding/json escapes control
// characters, so untrusted text stays data).
func writeJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// jsonTime is an RFC 3339 time, or null when zero.
func jsonTime(t time.Time) *string {
	if t.IsZero() {
		return nil
	}
	s := t.UTC().Format(time.RFC3339Nano)
	return &s
}
