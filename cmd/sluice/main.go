package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

func main() {
	ctx, cancel := context.WithCancelCause(context.Background())
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	go func() {
		sig := <-sigs
		signal.Stop(sigs) // a second Ctrl-C ends the process at once
		cancel(signalError{sig})
	}()
	code := execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	os.Exit(code)
}

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command failed
	exitUsage = 2 // bad flags or arguments
	// exitPartial: a replay replayed some letters and left or parked
	// others (refused, over --max-replays, malformed).
	exitPartial = 3
	// exitNothingReplayed: a replay replayed none of the letters it
	// selected: every one was parked or left in place.
	exitNothingReplayed = 4
	// A signal ends the command with 128 + its number: 130 for SIGINT
	// (Ctrl-C), 143 for SIGTERM.
	exitSignal = 128
)

// signalError is the cause of the command's ctx when a signal stopped it.
type signalError struct{ sig os.Signal }

func (e signalError) Error() string { return "interrupted by " + e.sig.String() }

// code is 128 + the signal's number.
func (e signalError) code() int {
	if s, ok := e.sig.(syscall.Signal); ok {
		return exitSignal + int(s)
	}
	return exitSignal + int(syscall.SIGINT)
}

// codedError carries an exit code other than exitError, and lines printed
// after the error's own (each on its own line, for example a command to
// run).
type codedError struct {
	err   error
	code  int
	notes []string
}

func (e *codedError) Error() string { return e.err.Error() }
func (e *codedError) Unwrap() error { return e.err }

// usageError marks errors in the command line itself.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// execute runs the CLI with args and returns the exit code. Errors go to
// errOut as one "sluice: ..." line (plus a usage hint for bad flags).
func execute(ctx context.Context, args []string, out, errOut io.Writer) int {
	secrets := &redactor{}
	out, errOut = secrets.writer(out), secrets.writer(errOut)
	root := newRootCmd(out, errOut, secrets)
	root.SetArgs(args)
	cmd, err := root.ExecuteContextC(ctx)
	var sig signalError
	interrupted := errors.As(context.Cause(ctx), &sig)
	if err == nil {
		if interrupted {
			return sig.code()
		}
		return exitOK
	}
	fmt.Fprintln(errOut, "sluice: "+oneErrorLine(err))
	var ce *codedError
	if errors.As(err, &ce) {
		for _, n := range ce.notes {
			fmt.Fprintln(errOut, n)
		}
	}
	var ue usageError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(errOut, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return exitUsage
	case interrupted:
		return sig.code()
	case ce != nil && ce.code != 0:
		return ce.code
	}
	return exitError
}

// oneErrorLine is err's text without the "sluice: " the library's errors
// start with (execute adds one), on one line.
func oneErrorLine(err error) string {
	s := strings.ReplaceAll(err.Error(), "sluice: ", "")
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}
