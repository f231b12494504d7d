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
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := execute(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// Exit codes.
const (
	exitOK    = 0
	exitError = 1 // the command failed
	exitUsage = 2 // bad flags or arguments
)

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
	if err == nil {
		return exitOK
	}
	fmt.Fprintln(errOut, "sluice: "+oneErrorLine(err))
	var ue usageError
	if errors.As(err, &ue) {
		fmt.Fprintf(errOut, "Run '%s --help' for usage.\n", cmd.CommandPath())
		return exitUsage
	}
	return exitError
}

// oneErrorLine is err's text without the "sluice: " the library's errors
// start with (execute adds one), on one line.
func oneErrorLine(err error) string {
	s := strings.ReplaceAll(err.Error(), "sluice: ", "")
	return strings.Join(strings.Fields(strings.ReplaceAll(s, "\n", " ")), " ")
}
