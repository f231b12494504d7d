package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/dlq"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// fixture is an embedded server with an ORDERS stream and five dead letters
// with fixed contents: 3 permanent and 1 exhausted from ORDERS, 1 exhausted
// from BILLING replayed twice already.
type fixture struct {
	url string
	js  jetstream.JetStream
	ctx context.Context
}

func newFixture(tb testing.TB) *fixture {
	tb.Helper()
	_, url := natstest.Start(tb)
	nc, err := nats.Connect(url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	seedLetters(tb, ctx, js)
	return &fixture{url: url, js: js, ctx: ctx}
}

func seedLetters(tb testing.TB, ctx context.Context, js jetstream.JetStream) {
	tb.Helper()
	for _, name := range []string{"ORDERS", "BILLING"} {
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: name, Subjects: []string{strings.ToLower(name) + ".>"}}); err != nil {
			tb.Fatal(err)
		}
	}
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		tb.Fatal(err)
	}
	at := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	letters := []*dlq.Letter{
		{Route: "orders", Class: dlq.ClassPermanent, Err: "order cannot be parsed", Value: []byte(`{"id":7}`)},
		{Route: "orders", Class: dlq.ClassPermanent, Err: "order cannot be parsed", Value: []byte(`{"id":8}`)},
		{Route: "orders", Class: dlq.ClassPermanent, Err: "unknown currency \"XXX\"", Value: []byte(`{"id":9}`)},
		{Route: "orders", Class: dlq.ClassExhausted, Err: "inventory service: 503", Value: []byte{0x00, 0x01, 0xfe}},
		{Route: "billing", Class: dlq.ClassExhausted, Err: "timeout", Value: []byte("invoice-1"), Replays: 2},
	}
	for i, l := range letters {
		stream := strings.ToUpper(l.Route)
		l.Attempts = 1 + 2*i
		l.FirstFailure = at.Add(time.Duration(i) * time.Minute)
		l.LastFailure = l.FirstFailure.Add(30 * time.Second)
		l.Headers = map[string][]string{"Tenant": {"acme"}, "Sluice-Deadline": {"1796216985878"}}
		l.Origin = dlq.Origin{Topic: l.Route + ".new", Stream: stream, Sequence: uint64(100 + i), Group: l.Route, Partition: -1}
		if err := sink.Write(ctx, l); err != nil {
			tb.Fatal(err)
		}
	}
}

func run(t *testing.T, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	var out, errOut bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code = execute(ctx, args, &out, &errOut)
	return out.String(), errOut.String(), code
}

func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name+".golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s:\n--- got\n%s--- want\n%s", name, path, got, want)
	}
}

func TestGoldenOutputs(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		name string
		args []string
		code int
	}{
		{"ls", []string{"dlq", "ls"}, 0},
		{"ls_letters_filtered", []string{"dlq", "ls", "--letters", "--filter", "class=exhausted"}, 0},
		{"show", []string{"dlq", "show", "1"}, 0},
		{"show_binary", []string{"dlq", "show", "SLUICE_DLQ#4"}, 0},
		// The billing letter would be parked: the dry run exits as the real run would.
		{"replay_dry_run", []string{"dlq", "replay", "--dry-run", "--max-replays", "3", "--allow", "orders.*", "--filter", "origin=ORDERS,billing.*"}, exitPartial},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := run(t, append(tc.args, "--nats", f.url)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d: %s", code, tc.code, errOut)
			}
			golden(t, tc.name, out)
		})
	}
	// Nothing above moved a letter.
	out, _, _ := run(t, "dlq", "ls", "--nats", f.url)
	if !strings.HasPrefix(out, "stream SLUICE_DLQ: 5 letters\n") {
		t.Fatalf("after read-only commands: %q", out)
	}
}

func TestReplayCommand(t *testing.T) {
	f := newFixture(t)
	out, errOut, code := run(t, "dlq", "replay", "--nats", f.url, "--allow", "orders.>", "--allow", "billing.>", "--rate", "200/s", "--max-replays", "2", "--deadline", "5m", "--progress", "1ms")
	if code != exitPartial || !strings.Contains(errOut, "sluice: replayed 4 of 5 letters: 1 parked in SLUICE_PARKED (exit 3)") {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(out, "replayed 4, parked 1 in ") {
		t.Fatalf("stdout %q", out)
	}
	if !strings.Contains(errOut, "replaying stream SLUICE_DLQ at 200/s in batches of 1") || !strings.Contains(errOut, "moved (replayed ") {
		t.Fatalf("stderr %q", errOut)
	}
	count := func(stream string) uint64 {
		st, err := f.js.Stream(f.ctx, stream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(f.ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs
	}
	if count("SLUICE_DLQ") != 0 || count("ORDERS") != 4 || count("BILLING") != 0 || count(natsadapter.DefaultParkStream) != 1 {
		t.Fatalf("DLQ %d ORDERS %d BILLING %d parked %d", count("SLUICE_DLQ"), count("ORDERS"), count("BILLING"), count(natsadapter.DefaultParkStream))
	}
	m, err := f.js.Stream(f.ctx, "ORDERS")
	if err != nil {
		t.Fatal(err)
	}
	raw, err := m.GetMsg(f.ctx, 1)
	if err != nil {
		t.Fatal(err)
	}
	if raw.Header.Get("Tenant") != "acme" || raw.Header.Get(dlq.HeaderReplayCount) != "1" || raw.Header.Get("Sluice-Deadline") == "1796216985878" {
		t.Fatalf("republished headers %v", raw.Header)
	}
	// The parked letter is listed with the same tool.
	out, _, code = run(t, "dlq", "ls", "--nats", f.url, "--stream", natsadapter.DefaultParkStream)
	if code != 0 || !strings.Contains(out, "BILLING/billing.new  exhausted  1      2") {
		t.Fatalf("parked ls: %d %q", code, out)
	}
}

func TestPurgeCommand(t *testing.T) {
	f := newFixture(t)
	_, errOut, code := run(t, "dlq", "purge", "--nats", f.url, "--filter", "class=exhausted")
	if code != 1 || !strings.Contains(errOut, "2 letters in stream SLUICE_DLQ would be deleted; add --yes") {
		t.Fatalf("without --yes: %d %q", code, errOut)
	}
	out, _, code := run(t, "dlq", "purge", "--nats", f.url, "--filter", "class=exhausted", "--yes", "--upto", "end")
	if code != 0 || out != "purged 2 letters from stream SLUICE_DLQ\n" {
		t.Fatalf("filtered purge: %d %q", code, out)
	}
	out, _, code = run(t, "dlq", "purge", "--nats", f.url, "--yes", "--upto", "end")
	if code != 0 || out != "purged 3 letters from stream SLUICE_DLQ\n" {
		t.Fatalf("purge all: %d %q", code, out)
	}
}

func TestErrorsAreClear(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"dlq", "replay", "--rate", "fast"}, exitUsage, `invalid argument "fast" for "--rate" flag: want letters per second such as 200/s`},
		{[]string{"dlq", "replay", "--rate", "-5/s"}, exitUsage, `for "--rate" flag`},
		{[]string{"dlq", "replay", "--jitter", "soon"}, exitUsage, `want a positive duration (e.g. 250ms) or one of auto, off`},
		{[]string{"dlq", "ls", "--bogus"}, exitUsage, "unknown flag: --bogus"},
		{[]string{"dlq", "ls", "--filter", "colour=red"}, exitUsage, `--filter: invalid option: bad filter: unknown key "colour"`},
		{[]string{"dlq", "replay", "--filter", "since=yesterday"}, exitUsage, `since="yesterday": want an RFC 3339 time or a duration`},
		{[]string{"dlq", "show"}, exitUsage, "takes one letter id"},
		{[]string{"dlq", "show", "abc", "--nats", f.url}, exitUsage, `letter id "abc"`},
		{[]string{"dlq", "show", "99", "--nats", f.url}, exitError, "no letter 99 in stream SLUICE_DLQ"},
		{[]string{"dlq", "frobnicate"}, exitUsage, `unknown command "frobnicate"`},
		{[]string{"dlq", "ls", "--nats", "nats://127.0.0.1:1"}, exitError, `cannot connect to NATS at nats://127.0.0.1:1: nats: no servers available`},
		{[]string{"dlq", "ls", "--nats", "http://127.0.0.1:4222"}, exitUsage, `NATS URL "http://127.0.0.1:4222": scheme "http"; want nats://host:port`},
		{[]string{"dlq", "ls", "--nats", "nats://"}, exitUsage, `NATS URL "nats://": no host`},
		{[]string{"dlq", "ls", "--nats", f.url, "--stream", "NOPE"}, exitError, `stream "NOPE" not found`},
		{[]string{"dlq", "ls", "--nats-store", t.TempDir()}, exitError, "no JetStream store there"},
		{[]string{"dlq", "ls", "--nats", f.url, "--brokers", "127.0.0.1:9092"}, exitUsage, "not both"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			_, errOut, code := run(t, tc.args...)
			if code != tc.code || !strings.Contains(errOut, tc.want) || !strings.HasPrefix(errOut, "sluice: ") {
				t.Fatalf("exit %d (want %d), stderr:\n%s\nwant it to contain %q", code, tc.code, errOut, tc.want)
			}
		})
	}
}

func TestReplayHelpDocumentsFlags(t *testing.T) {
	out, _, code := run(t, "dlq", "replay", "--help")
	if code != 0 {
		t.Fatalf("exit %d", code)
	}
	for _, want := range []string{"--rate rate", "--jitter duration", "--filter key=value", "--dry-run", "--max int",
		"--max-replays int", "--park string", "--deadline duration", "removed from the dead-letter queue only after", "--nats-store DIR",
		"Exit status: 0 when every selected letter was replayed", "4 when none was\nreplayed"} {
		if !strings.Contains(out, want) {
			t.Errorf("help lacks %q", want)
		}
	}
}

// TestNatsStore runs the CLI on a store directory left by an earlier
// server, as the README does with the quick start's -store.
func TestNatsStore(t *testing.T) {
	dir := t.TempDir()
	srv, err := natstest.Run(dir)
	if err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seedLetters(t, ctx, js)
	nc.Close()
	srv.Shutdown()
	srv.WaitForShutdown()

	out, errOut, code := run(t, "dlq", "ls", "--nats-store", dir)
	if code != 0 || !strings.HasPrefix(out, "stream SLUICE_DLQ: 5 letters") {
		t.Fatalf("exit %d: %q %q", code, out, errOut)
	}
	out, errOut, code = run(t, "dlq", "replay", "--nats-store", dir, "--allow", "orders.new", "--rate", "inf", "--filter", "route=orders")
	if code != 0 || !strings.HasPrefix(out, "replayed 4, parked 0") {
		t.Fatalf("exit %d: %q %q", code, out, errOut)
	}
	// The deletes reached the disk: a new server sees one letter left.
	out, _, _ = run(t, "dlq", "ls", "--nats-store", dir)
	if !strings.HasPrefix(out, "stream SLUICE_DLQ: 1 letters") {
		t.Fatalf("after replay: %q", out)
	}
}
