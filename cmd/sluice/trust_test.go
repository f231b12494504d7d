package main

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/dlq"
)

// TestShowEscapesAndBounds (issue 12.14): header names and values and the
// error text are untrusted; dlq show escapes control characters and cuts
// a 60 KiB header and 3,000 headers.
func TestShowEscapesAndBounds(t *testing.T) {
	f := newFixture(t)
	sink, err := natsadapter.NewDeadLetterSink(f.ctx, f.js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	h := map[string][]string{"X-Evil\x1b[31m": {"\x1b[2J\x1b]0;pwned\x07\rgone"}, "X-Big": {strings.Repeat("b", 60<<10)},
		"X-Bidi": {"abc\u202edcba"}}
	for i := range 3000 {
		h["Z-"+strconv.Itoa(i)] = []string{"v"}
	}
	l := &dlq.Letter{Route: "orders", Class: dlq.ClassPermanent, Err: "bad\x1b[1A\x1b[2Kinput\r\nsecond line", Value: []byte("x\ry"),
		Headers: h, Origin: dlq.Origin{Topic: "orders.new", Stream: "ORDERS", Sequence: 77, Partition: -1}}
	if err := sink.Write(f.ctx, l); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := run(t, "dlq", "show", "6", "--nats", f.url)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	for _, bad := range []string{"\x1b", "\r", "\x07", "\u202e"} {
		if strings.Contains(out, bad) {
			t.Fatalf("show printed a raw %q", bad)
		}
	}
	if len(out) > 64<<10 {
		t.Fatalf("show printed %d bytes for one letter", len(out))
	}
	for _, want := range []string{`\x1b[2K`, `more header values`, `more bytes)`, `X-Evil\x1b[31m`} {
		if !strings.Contains(out, want) {
			t.Errorf("show output lacks %q", want)
		}
	}
	// JSON has it all, escaped by the encoder.
	out, _, code = run(t, "dlq", "show", "6", "--nats", f.url, "-o", "json")
	var doc showJSON
	if code != 0 || json.Unmarshal([]byte(out), &doc) != nil || len(doc.Headers) != 3003 || strings.Contains(out, "\x1b") {
		t.Fatalf("json: exit %d, %d headers", code, len(doc.Headers))
	}
}

// TestPurgeRefusesStreamsThatAreNotDeadLetterStores (issue 12.13): purge
// --stream ORDERS --yes purged a live stream; now it refuses, and the
// stream keeps its messages.
func TestPurgeRefusesStreamsThatAreNotDeadLetterStores(t *testing.T) {
	f := newFixture(t)
	for i := range 3 {
		if _, err := f.js.Publish(f.ctx, "orders.new", []byte("order-"+strconv.Itoa(i))); err != nil {
			t.Fatal(err)
		}
	}
	_, errOut, code := run(t, "dlq", "purge", "--nats", f.url, "--stream", "ORDERS", "--yes")
	if code != exitError || !strings.Contains(errOut, "is not a sluice dead-letter store") {
		t.Fatalf("exit %d: %q", code, errOut)
	}
	st, _ := f.js.Stream(f.ctx, "ORDERS")
	if info, _ := st.Info(f.ctx); info.State.Msgs != 3 {
		t.Fatalf("ORDERS holds %d messages after the refused purge", info.State.Msgs)
	}
}

// TestPurgeOnlyWhatWasShown (issue 12.13): purge counts, prints --upto;
// letters written afterwards survive the purge --yes --upto that follows.
func TestPurgeOnlyWhatWasShown(t *testing.T) {
	f := newFixture(t)
	_, errOut, code := run(t, "dlq", "purge", "--nats", f.url)
	if code != exitError || !strings.Contains(errOut, "5 letters in stream SLUICE_DLQ would be deleted; add --yes --upto 5") {
		t.Fatalf("count: %d %q", code, errOut)
	}
	seedMore(t, f, 2) // arrive between the count and the purge
	out, errOut, code := run(t, "dlq", "purge", "--nats", f.url, "--yes", "--upto", "5")
	if code != 0 || out != "purged 5 letters from stream SLUICE_DLQ\n" {
		t.Fatalf("purge: %d %q %q", code, out, errOut)
	}
	out, _, _ = run(t, "dlq", "ls", "--nats", f.url)
	if !strings.HasPrefix(out, "stream SLUICE_DLQ: 2 letters") {
		t.Fatalf("after purge: %q", out)
	}
}

func seedMore(t *testing.T, f *fixture, n int) {
	t.Helper()
	sink, err := natsadapter.NewDeadLetterSink(f.ctx, f.js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		l := &dlq.Letter{Route: "late", Class: dlq.ClassPermanent, Err: "late", Value: []byte("late"),
			Origin: dlq.Origin{Topic: "orders.new", Stream: "ORDERS", Sequence: uint64(500 + i), Partition: -1}}
		if err := sink.Write(f.ctx, l); err != nil {
			t.Fatal(err)
		}
	}
}

// TestReplayRefusesCraftedPurgeLetter is issue 12.12's regression through
// the CLI: a letter naming $JS.API.STREAM.PURGE.WORK is parked, even with
// --allow '>', and WORK keeps its messages.
func TestReplayRefusesCraftedPurgeLetter(t *testing.T) {
	f := newFixture(t)
	if _, err := f.js.CreateStream(f.ctx, jetstream.StreamConfig{Name: "WORK", Subjects: []string{"work.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.js.Publish(f.ctx, "work.item", []byte("keep me")); err != nil {
		t.Fatal(err)
	}
	sink, _ := natsadapter.NewDeadLetterSink(f.ctx, f.js, natsadapter.SinkOptions{})
	if err := sink.Write(f.ctx, &dlq.Letter{Route: "evil", Class: dlq.ClassPermanent, Err: "x", Value: []byte("{}"),
		Origin: dlq.Origin{Topic: "$JS.API.STREAM.PURGE.WORK", Partition: -1}}); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := run(t, "dlq", "replay", "--nats", f.url, "--allow", ">", "--rate", "inf", "--max-replays", "0")
	if code != exitPartial || !strings.Contains(out, "refused 1") || !strings.Contains(out, `$JS.API.STREAM.PURGE.WORK  1 letters  REFUSED`) {
		t.Fatalf("exit %d: %q %q", code, out, errOut)
	}
	st, _ := f.js.Stream(f.ctx, "WORK")
	if info, _ := st.Info(f.ctx); info.State.Msgs != 1 {
		t.Fatal("WORK was purged")
	}
	// Without --allow or --to nothing moves, and the error names what the letters ask for.
	_, errOut, code = run(t, "dlq", "replay", "--nats", f.url, "--stream", natsadapter.DefaultParkStream)
	if code != exitUsage || !strings.Contains(errOut, "replay needs --allow PATTERN (repeatable) or --to DEST") ||
		!strings.Contains(errOut, "$JS.API.STREAM.PURGE.WORK (1)") {
		t.Fatalf("no policy: %d %q", code, errOut)
	}
}

// TestOutputJSON: ls and the replay summary are machine-readable.
func TestOutputJSON(t *testing.T) {
	f := newFixture(t)
	out, _, code := run(t, "dlq", "ls", "--nats", f.url, "--letters", "-o", "json")
	var ls lsJSON
	if code != 0 || json.Unmarshal([]byte(out), &ls) != nil || ls.Total != 5 || len(ls.Letters) != 5 || len(ls.Groups) != 3 {
		t.Fatalf("ls json: %d %s", code, out)
	}
	out, _, code = run(t, "dlq", "replay", "--nats", f.url, "--allow", "orders.*", "--rate", "inf", "-o", "json")
	var rs replaySummary
	if code != exitPartial || json.Unmarshal([]byte(out), &rs) != nil || rs.Replayed != 4 || rs.Refused != 1 || len(rs.Destinations) != 2 {
		t.Fatalf("replay json: %d %s", code, out)
	}
	_, errOut, code := run(t, "dlq", "ls", "--nats", f.url, "-o", "yaml")
	if code != exitUsage || !strings.Contains(errOut, `--output "yaml": want table or json`) {
		t.Fatalf("bad output: %d %q", code, errOut)
	}
}

// signalWriter calls fn once when a write contains want.
// signalWriter calls fn once, when a write holds a line that says the
// command moved something: "N moved" with N > 0. Not "1 moved": a pacer with
// a burst of 2 reported "0 moved", then "2 moved", the writer never called
// fn, and the replay ran to its end (a CI failure under -race).
type signalWriter struct {
	mu  sync.Mutex
	buf bytes.Buffer
	fn  func()
}

var movedSome = regexp.MustCompile(`(?m)^[1-9][0-9]* moved`)

func (w *signalWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.buf.Write(p)
	if w.fn != nil && movedSome.Match(p) {
		w.fn()
		w.fn = nil
	}
	return len(p), nil
}

// TestReplayProgressAndInterrupt: without a terminal progress comes as
// plain lines; Ctrl-C (ctx cancelled) prints where it stopped and the
// command that resumes, and that command finishes the job.
func TestReplayProgressAndInterrupt(t *testing.T) {
	f := newFixture(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	errOut := &signalWriter{fn: cancel}
	var out bytes.Buffer
	args := []string{"dlq", "replay", "--nats", f.url, "--allow", "orders.>", "--rate", "10/s", "--progress", "1ms", "--filter", "route=orders"}
	code := execute(ctx, args, &out, errOut)
	text := errOut.buf.String()
	if code != exitError || !strings.Contains(text, "interrupted after moving") || !strings.Contains(text, "\nresume with:\n  sluice dlq replay") {
		t.Fatalf("exit %d, stderr %q", code, text)
	}
	resume := strings.TrimSpace(text[strings.Index(text, "resume with:\n")+len("resume with:\n"):])
	if !strings.Contains(resume, "--allow 'orders.>'") || !strings.Contains(resume, "--filter route=orders") {
		t.Fatalf("resume command %q", resume)
	}
	// Run the printed command (it is shell-quoted; unquote the simple way).
	fields := strings.Fields(strings.ReplaceAll(resume, "'", ""))[1:]
	fields = append(fields, "--rate", "inf")
	o2, e2, code := run(t, fields...)
	if code != 0 {
		t.Fatalf("resume: %d %q %q", code, o2, e2)
	}
	ls, _, _ := run(t, "dlq", "ls", "--nats", f.url)
	if !strings.HasPrefix(ls, "stream SLUICE_DLQ: 1 letters") { // the billing letter stays
		t.Fatalf("after resume: %q", ls)
	}
}

func TestVersionAndRoughEdges(t *testing.T) {
	out, _, code := run(t, "--version")
	if code != 0 || !strings.HasPrefix(out, "sluice ") || !strings.Contains(out, "dead-letter envelope "+dlq.Version) {
		t.Fatalf("--version: %d %q", code, out)
	}
	_, errOut, code := run(t, "dlq", "ls", "--topic", "orders.dlq")
	if code != exitUsage || !strings.Contains(errOut, "Kafka needs --brokers") {
		t.Fatalf("--topic without --brokers: %d %q", code, errOut)
	}
	_, errOut, code = run(t, "dlq", "ls", "-b", "127.0.0.1:1", "--topic", "x", "-X", "fetch.wait.max.ms=10")
	if code != exitUsage || !strings.Contains(errOut, `unknown property "fetch.wait.max.ms" (sluice reads bootstrap.servers`) {
		t.Fatalf("unknown property: %d %q", code, errOut)
	}
	_, errOut, code = run(t, "dlq", "ls", "-b", "127.0.0.1:1", "--topic", "x", "-X", "ssl.truststore.location=/x.jks")
	if code != exitUsage || !strings.Contains(errOut, "give the CA as PEM with ssl.ca.location") {
		t.Fatalf("jks: %d %q", code, errOut)
	}
	_, errOut, _ = run(t, "dlq", "ls", "--filter", "colour=red")
	if strings.Count(errOut, "sluice:") != 1 {
		t.Fatalf("doubled prefix: %q", errOut)
	}
}
