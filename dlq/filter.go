package dlq

import (
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"
)

// ErrInvalidFilter is returned by ParseFilter for a filter expression it
// cannot read. It wraps ErrInvalidOption.
var ErrInvalidFilter = fmt.Errorf("%w: bad filter", ErrInvalidOption)

// Filter selects dead letters. The zero Filter matches every letter; each
// set field narrows it, and a letter must match all of them.
type Filter struct {
	// Since and Until bound LastFailure to [Since, Until). Zero is open.
	Since, Until time.Time
	// Classes: the letter's Class is one of them. Empty means any class.
	Classes []string
	// Origins: the letter's origin topic (or subject) or stream matches one
	// of these path.Match patterns ("orders.*", "ORDERS"). Empty means any.
	Origins []string
	// Routes: the letter's Route is one of them. Empty means any route.
	Routes []string
}

// Match reports whether l passes f.
func (f Filter) Match(l *Letter) bool {
	if !f.Since.IsZero() && l.LastFailure.Before(f.Since) {
		return false
	}
	if !f.Until.IsZero() && !l.LastFailure.Before(f.Until) {
		return false
	}
	if len(f.Classes) > 0 && !slices.Contains(f.Classes, l.Class) {
		return false
	}
	if len(f.Routes) > 0 && !slices.Contains(f.Routes, l.Route) {
		return false
	}
	if len(f.Origins) > 0 {
		ok := false
		for _, p := range f.Origins {
			if globMatch(p, l.Origin.Topic) || (l.Origin.Stream != "" && globMatch(p, l.Origin.Stream)) {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	return true
}

// IsZero reports whether f matches every letter.
func (f Filter) IsZero() bool {
	return f.Since.IsZero() && f.Until.IsZero() && len(f.Classes) == 0 && len(f.Origins) == 0 && len(f.Routes) == 0
}

func globMatch(pattern, s string) bool {
	ok, err := path.Match(pattern, s)
	return err == nil && ok
}

// ParseFilter reads a filter expression: space-separated terms
// key=value[,value...], keys class, origin, route, since and until. since
// and until take an RFC 3339 time or a duration before now ("2h" means
// now-2h). Repeating a key adds values (class, origin, route) or replaces
// the bound (since, until).
//
//	class=permanent,exhausted origin=orders.* since=2h
//
// An empty expression is the zero Filter. Errors wrap ErrInvalidFilter.
func ParseFilter(expr string, now time.Time) (Filter, error) {
	var f Filter
	for _, term := range strings.Fields(expr) {
		key, val, ok := strings.Cut(term, "=")
		if !ok || val == "" {
			return Filter{}, fmt.Errorf("%w: %q: want key=value (keys: class, origin, route, since, until)", ErrInvalidFilter, term)
		}
		switch strings.ToLower(key) {
		case "class":
			f.Classes = append(f.Classes, strings.Split(val, ",")...)
		case "route":
			f.Routes = append(f.Routes, strings.Split(val, ",")...)
		case "origin":
			for _, p := range strings.Split(val, ",") {
				if _, err := path.Match(p, ""); err != nil {
					return Filter{}, fmt.Errorf("%w: origin pattern %q: %w", ErrInvalidFilter, p, err)
				}
				f.Origins = append(f.Origins, p)
			}
		case "since", "until":
			t, err := parseWhen(val, now)
			if err != nil {
				return Filter{}, fmt.Errorf("%w: %s=%q: want an RFC 3339 time or a duration such as 2h", ErrInvalidFilter, key, val)
			}
			if key == "since" {
				f.Since = t
			} else {
				f.Until = t
			}
		default:
			return Filter{}, fmt.Errorf("%w: unknown key %q (keys: class, origin, route, since, until)", ErrInvalidFilter, key)
		}
	}
	if !f.Since.IsZero() && !f.Until.IsZero() && !f.Since.Before(f.Until) {
		return Filter{}, fmt.Errorf("%w: since %s is not before until %s", ErrInvalidFilter,
			f.Since.Format(time.RFC3339), f.Until.Format(time.RFC3339))
	}
	return f, nil
}

func parseWhen(s string, now time.Time) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return time.Time{}, err
	}
	if d < 0 {
		return time.Time{}, errors.New("negative duration")
	}
	return now.Add(-d), nil
}
