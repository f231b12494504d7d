package backpressure

import (
	"fmt"
	"strings"
)

// Criticality is how much a route's work matters when there is not enough
// capacity for all of it, after Google SRE's "Handling Overload". Lower
// classes are shed first. The zero value is Sheddable, so a route that says
// nothing is never accidentally protected.
type Criticality int8

const (
	// Sheddable work may be dropped or delayed whenever capacity is short.
	Sheddable Criticality = iota
	// SheddablePlus work is expected to fail partially under load and be retried.
	SheddablePlus
	// Critical is the default class for user-visible work.
	Critical
	// CriticalPlus is the most important work; shed only when Critical is gone.
	CriticalPlus
)

var criticalityNames = [...]string{"SHEDDABLE", "SHEDDABLE_PLUS", "CRITICAL", "CRITICAL_PLUS"}

// String returns the SRE name, for example "CRITICAL_PLUS".
func (c Criticality) String() string {
	if c < Sheddable || c > CriticalPlus {
		return fmt.Sprintf("Criticality(%d)", int8(c))
	}
	return criticalityNames[c]
}

// Valid reports whether c is one of the four classes.
func (c Criticality) Valid() bool { return c >= Sheddable && c <= CriticalPlus }

// ParseCriticality parses the names String returns (case-insensitive, "-"
// accepted for "_").
func ParseCriticality(s string) (Criticality, error) {
	norm := strings.ToUpper(strings.ReplaceAll(strings.TrimSpace(s), "-", "_"))
	for i, n := range criticalityNames {
		if n == norm {
			return Criticality(i), nil
		}
	}
	return Sheddable, fmt.Errorf("%w: unknown criticality %q", ErrInvalidOption, s)
}

// Cap returns the lower of c and ceiling: a producer's header may lower a
// message's class but never raise it above what the route allows.
func (c Criticality) Cap(ceiling Criticality) Criticality {
	if c > ceiling {
		return ceiling
	}
	return c
}
