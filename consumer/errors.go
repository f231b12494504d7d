package consumer

import (
	"errors"
	"fmt"

	"github.com/sluice-go/sluice/backpressure"
)

var (
	// ErrInvalidOption wraps every configuration error from New. It is the
	// same value as backpressure.ErrInvalidOption.
	ErrInvalidOption = backpressure.ErrInvalidOption
	// ErrClosed is returned by a Source that will never return messages
	// again. The consumer stops that route and Run returns the error.
	ErrClosed = errors.New("sluice: source closed")
	// ErrExpired is the reason given when a message is settled because its
	// deadline passed.
	ErrExpired = errors.New("sluice: message deadline passed")
	// ErrOversize is the reason given when a message larger than its route's
	// byte window is dead-lettered by policy.
	ErrOversize = errors.New("sluice: message larger than the route's byte window")
	// ErrPanic wraps a recovered handler panic.
	ErrPanic = errors.New("sluice: handler panicked")
	// ErrOverloaded marks an error as "overloaded, do not retry". It is the
	// same value as backpressure.ErrOverloaded, so backpressure.Retrier and
	// backpressure.Throttle errors are recognised by the consumer.
	ErrOverloaded = backpressure.ErrOverloaded
	// ErrRunning is returned by a second call to Run.
	ErrRunning = errors.New("sluice: consumer already running")
	// ErrStuckHandlers is returned by Run when handlers ignored cancellation
	// past the shutdown grace period. Their messages were returned (nak'd).
	ErrStuckHandlers = errors.New("sluice: handlers still running after shutdown grace")
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

// Overloaded marks err as "overloaded, do not retry": the consumer does not
// retry it in process but hands the message back to the broker with a delay,
// and a caller one layer up should not retry either. Overloaded(nil) is
// ErrOverloaded.
func Overloaded(err error) error {
	if err == nil {
		return ErrOverloaded
	}
	return fmt.Errorf("%w: %w", ErrOverloaded, err)
}

// IsOverloaded reports whether err is marked "overloaded, do not retry".
func IsOverloaded(err error) bool { return errors.Is(err, ErrOverloaded) }
