// Package expiry decides when a message stops being worth processing.
//
// A deadline comes from one of two places, checked in this order:
//
//  1. an absolute deadline set by the producer in a header (by default
//     "Sluice-Deadline"), in one of the formats ParseDeadline accepts:
//     RFC 3339 with optional fractional seconds ("2026-12-02T10:00:00.5Z"),
//     or integer Unix milliseconds ("1796205600500");
//  2. the broker's publish time plus the route's MaxAge.
//
// When both are present the earlier wins: a producer can shorten a message's
// life, never extend it past the route's MaxAge. A Skew allowance is added to
// every deadline before comparing with the local clock, so a producer whose
// clock runs slightly ahead does not get its messages discarded.
//
// Every decision takes the current time as a parameter (Policy.Expired(d,
// now)), so it is tested without sleeping. A malformed header is never a
// panic: Deadline reports ErrMalformed and the policy's OnMalformed says
// whether the message is then treated as having no header deadline or as
// already expired.
package expiry
