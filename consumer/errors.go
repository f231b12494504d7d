package consumer

import (
	"errors"

	"github.com/sluice-go/sluice/backpressure"
)

// Errors. Each is a sentinel to test with errors.Is; the consumer wraps
// them with the route and the detail.
var (
	// ErrInvalidOption wraps every configuration error from New (and from
	// the adapters' constructors). It is the same value as
	// backpressure.ErrInvalidOption.
	ErrInvalidOption = backpressure.ErrInvalidOption
	// ErrClosed is returned by a Source that will never return messages
	// again. Its route stops (the other routes go on) and Run returns the
	// error when it returns.
	ErrClosed = errors.New("sluice: source closed")
	// ErrExpired is the reason given when a message is settled because its
	// deadline passed (or would pass before it could finish).
	ErrExpired = errors.New("sluice: message deadline passed")
	// ErrOversize is the reason given when a message larger than its
	// route's byte window, or than the Budget can ever give the route, is
	// dead-lettered (or terminated) instead of run.
	ErrOversize = errors.New("sluice: message larger than the route can hold")
	// ErrPanic wraps a recovered handler panic.
	ErrPanic = errors.New("sluice: handler panicked")
	// ErrRunning is returned by a second call to Run.
	ErrRunning = errors.New("sluice: consumer already running")
	// ErrStuckHandlers is returned by Run when handlers ignored cancellation
	// past the shutdown grace period. Their messages were left unsettled
	// (OutcomeAbandoned): the broker redelivers them.
	ErrStuckHandlers = errors.New("sluice: handlers still running after shutdown grace")
	// ErrUnconfirmed is recorded (RouteStats.LastError, the Logger) for a
	// settlement whose confirmation did not arrive before Run returned.
	ErrUnconfirmed = errors.New("sluice: settlement not confirmed before shutdown")
)

type permanentError struct{ err error }

func (e *permanentError) Error() string { return "permanent: " + e.err.Error() }
func (e *permanentError) Unwrap() error { return e.err }

// Permanent marks err as one that retrying cannot fix: the message goes to
// the dead-letter sink at once. Permanent(nil) is nil.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return &permanentError{err}
}

// IsPermanent reports whether err was marked with Permanent.
func IsPermanent(err error) bool {
	var p *permanentError
	return errors.As(err, &p)
}
