package sluicetest

import (
	"context"
	"sync"

	"github.com/sluice-go/sluice/dlq"
)

// Sink is an in-memory dlq.Sink that keeps every letter written to it. Its
// zero value is ready to use.
type Sink struct {
	mu      sync.Mutex
	letters []*dlq.Letter
	fail    func(*dlq.Letter) error
	writes  int
}

// FailWith makes Write call fn for every letter and refuse the letter when
// fn returns an error (a dead-letter store that is down); nil restores
// normal writes.
func (s *Sink) FailWith(fn func(*dlq.Letter) error) {
	s.mu.Lock()
	s.fail = fn
	s.mu.Unlock()
}

// Write implements dlq.Sink.
func (s *Sink) Write(ctx context.Context, l *dlq.Letter) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writes++
	if s.fail != nil {
		if err := s.fail(l); err != nil {
			return err
		}
	}
	s.letters = append(s.letters, l)
	return nil
}

// Letters returns the letters written so far.
func (s *Sink) Letters() []*dlq.Letter {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]*dlq.Letter(nil), s.letters...)
}

// Writes counts Write calls, refused ones included.
func (s *Sink) Writes() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.writes
}
