package dlq

import (
	"cmp"
	"slices"
	"time"
)

// Tally counts dead letters by origin and error class, for listings. The
// zero value is ready to use; it is not safe for concurrent use.
type Tally struct {
	Total     int
	Malformed int
	rows      map[tallyKey]*TallyRow
}

type tallyKey struct{ origin, class string }

// TallyRow is one origin × class group of a Tally.
type TallyRow struct {
	Origin string // origin stream/subject (NATS) or topic (Kafka)
	Class  string
	Count  int
	// Oldest and Newest bound the group's LastFailure times.
	Oldest, Newest time.Time
	// MaxReplays is the highest Replays in the group.
	MaxReplays int
}

// OriginName names where l came from: "STREAM/subject" on NATS, the topic
// on Kafka.
func OriginName(l *Letter) string {
	if l.Origin.Stream != "" {
		return l.Origin.Stream + "/" + l.Origin.Topic
	}
	return l.Origin.Topic
}

// Add counts l; a nil l counts as malformed.
func (t *Tally) Add(l *Letter) {
	t.Total++
	if l == nil {
		t.Malformed++
		return
	}
	if t.rows == nil {
		t.rows = map[tallyKey]*TallyRow{}
	}
	k := tallyKey{OriginName(l), l.Class}
	r := t.rows[k]
	if r == nil {
		r = &TallyRow{Origin: k.origin, Class: k.class, Oldest: l.LastFailure, Newest: l.LastFailure}
		t.rows[k] = r
	}
	r.Count++
	if l.LastFailure.Before(r.Oldest) {
		r.Oldest = l.LastFailure
	}
	if l.LastFailure.After(r.Newest) {
		r.Newest = l.LastFailure
	}
	r.MaxReplays = max(r.MaxReplays, l.Replays)
}

// Rows returns the groups, by origin then class.
func (t *Tally) Rows() []TallyRow {
	out := make([]TallyRow, 0, len(t.rows))
	for _, r := range t.rows {
		out = append(out, *r)
	}
	slices.SortFunc(out, func(a, b TallyRow) int {
		return cmp.Or(cmp.Compare(a.Origin, b.Origin), cmp.Compare(a.Class, b.Class))
	})
	return out
}
