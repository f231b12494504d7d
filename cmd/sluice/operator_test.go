package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/dlq"
)

// The tests in this file are where operators tripped (issue 29, part 4),
// each against a real server.

// sluiceOnPath puts a `sluice` on PATH that runs this test binary as the
// CLI, so a printed command line runs as an operator would run it.
func sluiceOnPath(t *testing.T) {
	t.Helper()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	script := "#!/bin/sh\n" + childEnv + "=1 exec '" + self + "' \"$@\"\n"
	if err := os.WriteFile(filepath.Join(dir, "sluice"), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
}

// Ctrl-C (SIGINT) during a replay with a password on the command line:
// the process exits 130; the resume command is on its own line, holds no
// [REDACTED] placeholder, and the next line names the variable that gives
// the password back. Run by a shell exactly as printed, with that variable
// exported, it finishes the replay.
func TestInterruptPrintsAResumeCommandThatRuns(t *testing.T) {
	s := userPasswordNATS(t)
	s.seed(t)
	sluiceOnPath(t)
	cmd := exec.Command("sluice", append([]string{"dlq", "replay", "--allow", "orders.>", "--filter", "route=orders",
		"--rate", "2/s", "--progress", "1ms"}, s.args...)...)
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var errText strings.Builder
	moved := make(chan struct{})
	scanned := make(chan struct{})
	go func() {
		defer close(scanned)
		sc := bufio.NewScanner(stderr)
		once := sync.Once{}
		for sc.Scan() {
			mu.Lock()
			errText.WriteString(sc.Text() + "\n")
			mu.Unlock()
			if strings.HasPrefix(sc.Text(), "1 moved") {
				once.Do(func() { close(moved) })
			}
		}
	}()
	select {
	case <-moved:
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatal("no letter moved in 30 s")
	}
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	<-scanned
	err = cmd.Wait()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 130 {
		t.Fatalf("exit %v, want 130 (SIGINT); stderr:\n%s", err, errText.String())
	}
	text := errText.String()
	i := strings.Index(text, "\nresume with:\n  ")
	if i < 0 || !strings.Contains(text, "sluice: interrupted after moving") {
		t.Fatalf("stderr:\n%s", text)
	}
	lines := strings.Split(text[i+1:], "\n")
	resume := strings.TrimPrefix(lines[1], "  ")
	if strings.Contains(text, redacted) || strings.Contains(text, s.secret) || strings.Contains(resume, "--password") {
		t.Fatalf("the resume command holds the secret or a placeholder:\n%s", text)
	}
	if !strings.Contains(lines[2], "export NATS_PASSWORD=") {
		t.Fatalf("no line says how to give the password back:\n%s", text)
	}
	t.Logf("printed:\n%s", strings.Join(lines[:3], "\n"))

	sh := exec.Command("sh", "-c", resume)
	sh.Env = append(os.Environ(), "NATS_PASSWORD="+s.secret)
	out, err := sh.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "replayed ") {
		t.Fatalf("the printed command, run as printed: %v\n%s", err, out)
	}
	ls, errOut, code := run(t, append([]string{"dlq", "ls"}, s.args...)...)
	if code != 0 || !strings.HasPrefix(ls, "stream SLUICE_DLQ: 1 letters") { // the billing letter stays
		t.Fatalf("after the resumed run: %d %q %q", code, ls, errOut)
	}
}

// A Kafka SASL password given with -X is left out of the resume command,
// and a line says which flag to add back; with it added, the command runs.
func TestResumeCommandNamesTheKafkaPasswordFlag(t *testing.T) {
	s := startSecureKafka(t, "PLAIN")
	k := s.seed(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errOut := &signalWriter{fn: cancel}
	var out bytes.Buffer
	args := []string{"dlq", "replay", "-b", strings.Join(s.cluster.Brokers, ","), "--topic", k.dlq, "--allow", k.orders,
		"--rate", "2/s", "--progress", "1ms"}
	for _, p := range s.props {
		args = append(args, "-X", p)
	}
	code := execute(ctx, args, &out, errOut)
	text := errOut.buf.String()
	i := strings.Index(text, "\nresume with:\n  ")
	if code != exitError || i < 0 {
		t.Fatalf("exit %d, stderr %q", code, text)
	}
	lines := strings.Split(text[i+1:], "\n")
	resume := strings.TrimPrefix(lines[1], "  ")
	if strings.Contains(text, redacted) || strings.Contains(text, s.secret) || strings.Contains(resume, "sasl.password") {
		t.Fatalf("stderr holds the secret or a placeholder:\n%s", text)
	}
	if !strings.Contains(lines[2], "-X sasl.password=... is not printed: add it back") {
		t.Fatalf("no line names the flag to add back:\n%s", text)
	}
	fields := strings.Fields(strings.ReplaceAll(resume, "'", ""))[1:]
	fields = append(fields, "-X", "sasl.password="+s.secret, "--rate", "inf")
	o2, e2, code := run(t, fields...)
	if code != 0 || !strings.HasPrefix(o2, "replayed ") {
		t.Fatalf("resumed: %d %q %q", code, o2, e2)
	}
}

// A replay that replays nothing exits 4, one that replays part 3, and
// says so in one line; with an empty --park the refused letters stay and the
// exit is 4 too. A full replay exits 0.
func TestReplayExitCodesSayWhatMoved(t *testing.T) {
	f := newFixture(t)
	out, errOut, code := run(t, "dlq", "replay", "--nats", f.url, "--to", "nowhere.captured", "--rate", "inf", "--park", "", "--filter", "route=orders")
	if code != exitNothingReplayed || !strings.Contains(errOut, "sluice: replayed none of 4 letters: 4 left in place (held 4, malformed 0) (refused 4) (exit 4)") {
		t.Fatalf("--park '': exit %d %q %q", code, out, errOut)
	}
	out, errOut, code = run(t, "dlq", "replay", "--nats", f.url, "--to", "nowhere.captured", "--rate", "inf", "--filter", "route=orders")
	if code != exitNothingReplayed || !strings.Contains(errOut, "sluice: replayed none of 4 letters: 4 parked in "+natsadapter.DefaultParkStream+" (refused 4) (exit 4)") {
		t.Fatalf("default --park: exit %d %q %q", code, out, errOut)
	}
	// The billing letter is left: replayed in full, exit 0.
	out, errOut, code = run(t, "dlq", "replay", "--nats", f.url, "--allow", "billing.>", "--rate", "inf")
	if code != exitOK || !strings.HasPrefix(out, "replayed 1, parked 0") || strings.Contains(errOut, "sluice:") {
		t.Fatalf("full replay: exit %d %q %q", code, out, errOut)
	}
}

// --dry-run without --allow or --to predicts the real run: both refuse to
// start, with the same exit code, and the dry run lists no letters it
// would park.
func TestDryRunWithoutAllowPredictsTheRefusal(t *testing.T) {
	f := newFixture(t)
	dryOut, dryErr, dryCode := run(t, "dlq", "replay", "--nats", f.url, "--dry-run")
	realOut, realErr, realCode := run(t, "dlq", "replay", "--nats", f.url)
	if dryCode != exitUsage || realCode != exitUsage {
		t.Fatalf("dry run exit %d, real run exit %d: want both %d", dryCode, realCode, exitUsage)
	}
	if !strings.Contains(dryErr, "dry run: a real run refuses to start: replay needs --allow PATTERN") ||
		!strings.Contains(realErr, "replay needs --allow PATTERN") || dryOut != "" || realOut != "" {
		t.Fatalf("dry run %q %q; real run %q %q", dryOut, dryErr, realOut, realErr)
	}
	if ls, _, _ := run(t, "dlq", "ls", "--nats", f.url); !strings.HasPrefix(ls, "stream SLUICE_DLQ: 5 letters") {
		t.Fatalf("letters moved: %q", ls)
	}
}

// dlq show on Kafka lists the letter's own headers, not the adapter's
// internal Sluice-Kafka-Header-Order (which it adds when a record's headers
// are not sorted by key), in text and JSON.
func TestKafkaShowHidesInternalHeaders(t *testing.T) {
	c := kafkatest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	topic := kafkatest.UniqueName("dlq")
	if err := c.CreateTopic(ctx, topic, 1); err != nil {
		t.Fatal(err)
	}
	sink, err := kafkaadapter.NewDeadLetterSink(c.Kafka(), topic)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	l := &dlq.Letter{Value: []byte("v"), Route: "orders", Class: dlq.ClassPermanent, Err: "bad", Attempts: 1,
		Headers: map[string][]string{"Z-Trace": {"t1"}, "A-Tenant": {"acme"}, kafkaadapter.HeaderOrder: {"Z-Trace", "A-Tenant"}},
		Origin:  dlq.Origin{Topic: "orders", Partition: 0, Offset: 1}}
	if err := sink.Write(ctx, l); err != nil {
		t.Fatal(err)
	}
	k := []string{"--brokers", strings.Join(c.Brokers, ","), "--topic", topic}
	for _, format := range []string{"table", "json"} {
		out, errOut, code := run(t, append([]string{"dlq", "show", "0/0", "-o", format}, k...)...)
		if code != 0 || !strings.Contains(out, "Z-Trace") || !strings.Contains(out, "A-Tenant") {
			t.Fatalf("%s: %d %q %q", format, code, out, errOut)
		}
		if strings.Contains(out, "Sluice-Kafka-") {
			t.Fatalf("%s shows an internal header:\n%s", format, out)
		}
		if format == "table" && !strings.Contains(out, "headers: 2\n") {
			t.Fatalf("header count:\n%s", out)
		}
	}
}

// purge --yes without --upto deletes nothing: it says how many letters it
// would delete and the --upto that bounds them, so letters written after
// a count are never deleted by a purge that forgot the count's bound;
// --upto end deletes what the stream held when the purge started.
func TestPurgeYesNeedsTheCountsBound(t *testing.T) {
	f := newFixture(t)
	_, errOut, code := run(t, "dlq", "purge", "--nats", f.url)
	if code != exitError || !strings.Contains(errOut, "add --yes --upto 5") {
		t.Fatalf("count: %d %q", code, errOut)
	}
	seedMore(t, f, 2) // arrive after the count
	out, errOut, code := run(t, "dlq", "purge", "--nats", f.url, "--yes")
	if code != exitUsage || out != "" || !strings.Contains(errOut, "purge --yes needs --upto") ||
		!strings.Contains(errOut, "holds 7 matching letters now (--upto 7 deletes exactly these)") {
		t.Fatalf("--yes alone: %d %q %q", code, out, errOut)
	}
	if ls, _, _ := run(t, "dlq", "ls", "--nats", f.url); !strings.HasPrefix(ls, "stream SLUICE_DLQ: 7 letters") {
		t.Fatalf("--yes alone deleted letters: %q", ls)
	}
	out, errOut, code = run(t, "dlq", "purge", "--nats", f.url, "--yes", "--upto", "5")
	if code != 0 || out != "purged 5 letters from stream SLUICE_DLQ\n" {
		t.Fatalf("--upto 5: %d %q %q", code, out, errOut)
	}
	out, errOut, code = run(t, "dlq", "purge", "--nats", f.url, "--yes", "--upto", "end")
	if code != 0 || out != "purged 2 letters from stream SLUICE_DLQ\n" {
		t.Fatalf("--upto end: %d %q %q", code, out, errOut)
	}
	out, errOut, code = run(t, "dlq", "purge", "--nats", f.url, "--yes", "--upto", "end")
	if code != 0 || out != "purged 0 letters from stream SLUICE_DLQ\n" {
		t.Fatalf("--upto end on an empty stream: %d %q %q", code, out, errOut)
	}
}

// A security.protocol that does not match the listener is named as the
// likely cause, as the silent-listener case is: plaintext to a SASL
// listener (the broker closes the connection: the issue saw "Metadata:
// unexpected EOF"), SASL or plaintext to a TLS listener (it saw "refused the
// credentials").
func TestKafkaProtocolMismatchNamed(t *testing.T) {
	saslK := startSecureKafka(t, "PLAIN")
	ks := saslK.seed(t)
	tlsK := startSecureKafka(t, "")
	kt := tlsK.seed(t)
	sasl := []string{"-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.mechanism=PLAIN", "-X", "sasl.username=sluice", "-X", "sasl.password=sluice-secret-pw"}
	for _, tc := range []struct {
		name    string
		brokers []string
		topic   string
		props   []string
		want    string
	}{
		{"plaintext to SASL", saslK.cluster.Brokers, ks.dlq, nil,
			"as a SASL listener does to a client that does not authenticate: set security.protocol=SASL_PLAINTEXT with sasl.mechanism"},
		{"SASL to TLS", tlsK.cluster.Brokers, kt.dlq, sasl,
			"the listener speaks TLS and closed the plaintext connection: set security.protocol=SASL_SSL"},
		{"plaintext to TLS", tlsK.cluster.Brokers, kt.dlq, nil,
			"the listener speaks TLS and closed the plaintext connection: set security.protocol=SSL"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"dlq", "ls", "-b", strings.Join(tc.brokers, ","), "--topic", tc.topic, "--timeout", "5s"}, tc.props...)
			_, errOut, code := run(t, args...)
			if code != exitError || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, tc.want) {
				t.Fatalf("exit %d, stderr %q; want one line with %q", code, errOut, tc.want)
			}
			if strings.Contains(errOut, "refused the credentials") || strings.Contains(errOut, "unexpected EOF") {
				t.Fatalf("the wrong cause: %q", errOut)
			}
		})
	}
}

// SIGTERM ends a command with 143, as SIGINT with 130 (the process test
// above): 128 + the signal's number, whatever the command was doing.
func TestSignalExitCodes(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		sig  syscall.Signal
		code int
	}{{syscall.SIGINT, 130}, {syscall.SIGTERM, 143}} {
		ctx, cancel := context.WithCancelCause(context.Background())
		errOut := &signalWriter{fn: func() { cancel(signalError{tc.sig}) }}
		var out bytes.Buffer
		code := execute(ctx, []string{"dlq", "replay", "--nats", f.url, "--allow", "orders.>", "--rate", "2/s", "--progress", "1ms"}, &out, errOut)
		cancel(nil)
		if code != tc.code || !strings.Contains(errOut.buf.String(), "sluice: interrupted after moving") {
			t.Fatalf("%v: exit %d, want %d; stderr %q", tc.sig, code, tc.code, errOut.buf.String())
		}
	}
}
