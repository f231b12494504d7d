package backpressure

import (
	"context"
	"errors"
	"fmt"
)

// ErrOverloaded marks an error as "overloaded, do not retry": the layer that
// sees it must not retry, and should pass it up so the layer above does not
// retry either. backpressure.ErrOverloaded is the same value.
var ErrOverloaded = errors.New("sluice: overloaded, do not retry")

// ErrThrottled is returned by Throttle.Do when the request was rejected
// locally, without reaching the downstream. It is marked overloaded.
var ErrThrottled = fmt.Errorf("%w: throttled locally", ErrOverloaded)

// Overloaded marks err "overloaded, do not retry". Overloaded(nil) is
// ErrOverloaded; an error already marked is returned unchanged.
func Overloaded(err error) error {
	if err == nil {
		return ErrOverloaded
	}
	if errors.Is(err, ErrOverloaded) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrOverloaded, err)
}

// IsOverloaded reports whether err is marked "overloaded, do not retry".
func IsOverloaded(err error) bool { return errors.Is(err, ErrOverloaded) }

// CriticalityHeader is the message header that carries a criticality class
// between services. The consumer reads it (lowering, never raising, the
// route's class) and HeaderValue writes it for outgoing messages.
const CriticalityHeader = "Sluice-Criticality"

type critKey struct{}

// critCtx is a context carrying a criticality. The consumer builds one per
// class per route once, so handing the class to a handler costs nothing per
// message.
type critCtx struct {
	context.Context
	c Criticality
}

func (c *critCtx) Value(key any) any {
	if _, ok := key.(critKey); ok {
		return c.c
	}
	return c.Context.Value(key)
}

// WithCriticality returns a copy of ctx carrying class c, so the calls and
// messages a handler makes inherit the class of the work that caused them.
// An invalid c is stored as Sheddable.
func WithCriticality(ctx context.Context, c Criticality) context.Context {
	if !c.Valid() {
		c = Sheddable
	}
	return &critCtx{Context: ctx, c: c}
}

// CriticalityFrom returns the class ctx carries and whether it carries one.
// Without one, callers should treat the work as Critical (the SRE default
// for user-visible work) or their own route's class.
func CriticalityFrom(ctx context.Context) (Criticality, bool) {
	c, ok := ctx.Value(critKey{}).(Criticality)
	return c, ok
}

// HeaderValue returns the value to put in CriticalityHeader on a message
// sent on behalf of ctx, and false when ctx carries no class. A receiving
// sluice consumer caps it at its own route's class.
func HeaderValue(ctx context.Context) (string, bool) {
	c, ok := CriticalityFrom(ctx)
	if !ok {
		return "", false
	}
	return c.String(), true
}
