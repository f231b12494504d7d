package main

import (
	"encoding/json"
	"io"
	"regexp"
	"slices"
	"strings"
	"sync"
)

// redactor knows the secrets of a run (passwords, tokens, seeds from
// flags, the environment, contexts and property files) and removes them
// from everything the CLI prints, along with the password of any URL.
type redactor struct {
	mu      sync.Mutex
	secrets []string
}

const redacted = "[REDACTED]"

// add registers secrets; empty and very short strings are ignored (they
// would redact ordinary text).
func (r *redactor) add(secrets ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range secrets {
		if len(s) < 3 {
			continue
		}
		// As printed, and as JSON output escapes it.
		forms := []string{s}
		if j, err := json.Marshal(s); err == nil {
			forms = append(forms, string(j[1:len(j)-1]))
		}
		for _, f := range forms {
			if !slices.Contains(r.secrets, f) {
				r.secrets = append(r.secrets, f)
			}
		}
	}
	// Longest first, so a secret containing another is removed whole.
	slices.SortFunc(r.secrets, func(a, b string) int { return len(b) - len(a) })
}

// urlUserinfo matches the credentials of a URL: scheme://user:pass@ or
// scheme://token@.
var urlUserinfo = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://)[^/@\s]+@`)

// redact returns s without secrets.
func (r *redactor) redact(s string) string {
	s = urlUserinfo.ReplaceAllString(s, "${1}"+redacted+"@")
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, sec := range r.secrets {
		s = strings.ReplaceAll(s, sec, redacted)
	}
	return s
}

// writer returns w redacting every write (one write is one line or more:
// fmt's calls write whole).
func (r *redactor) writer(w io.Writer) io.Writer { return &redactWriter{r: r, w: w} }

type redactWriter struct {
	r *redactor
	w io.Writer
}

func (rw *redactWriter) Write(p []byte) (int, error) {
	clean := rw.r.redact(string(p))
	if _, err := io.WriteString(rw.w, clean); err != nil {
		return 0, err
	}
	return len(p), nil
}
