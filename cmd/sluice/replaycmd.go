package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/dlq"
)

func newReplayCmd(cf *connFlags, o *outputFlag, out, errOut io.Writer) *cobra.Command {
	rate := rateValue{perSecond: 100}
	jitter := modeDuration{word: "auto", words: map[string]time.Duration{"auto": 0, "off": -1}}
	deadline := modeDuration{word: "drop", words: map[string]time.Duration{"drop": 0, "keep": -1}}
	var (
		terms       []string
		dry         bool
		max         int
		maxReplays  int
		burst       int
		concurrency int
		to          string
		allow       []string
		park        string
		every       time.Duration
	)
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Replay dead letters into their origin at a paced, jittered rate",
		Long: `Replay moves dead letters back into the topic or subject they came from, when
--allow admits it, or into --to, at --rate, in small batches (so the pace is
even) with full jitter on the start and between batches (so many replayers do
not synchronize).

Each letter is removed from the dead-letter queue only after its republish is
confirmed by the broker: stop a replay at any time (Ctrl-C prints the command
that resumes) and run it again to resume; if the target fails the letter stays
and the replay stops. The republished message is the original key, value and
headers, without the Sluice-Dlq-* envelope, with Sluice-Replay-Count
incremented; a letter already replayed --max-replays times is parked (--park)
instead of replayed again.

Letters are untrusted (anyone who can write the dead-letter store chooses their
headers), so a letter's origin is only a request: replay publishes to it only
when an --allow pattern matches, or to --to. Subjects starting with "$" (the
server's APIs) or "_INBOX", the connection's --js-api-prefix and
--inbox-prefix, and Kafka's "__" topics are always refused. A refused letter,
one the destination cannot take (no stream captures it, too large) and one
truncated when it was dead-lettered are parked with the reason, and the replay
goes on. --dry-run lists the destinations it would use.

The old deadline header (Sluice-Deadline) of a dead letter has passed; --deadline
sets a fresh one (a duration from the republish), drops it (default: a consumer's
max-age then counts from the republish) or keeps it.

Progress (count, rate, parked and refused, ETA) goes to stderr: one line kept
up to date on a terminal, a plain line every --progress otherwise.

Exit status: 0 when every selected letter was replayed (or there was none), 3
when some were replayed and others parked or left in place, 4 when none was
replayed, 2 without --allow or --to, 1 when the replay failed, 130 on Ctrl-C
(143 on SIGTERM). --dry-run exits as the real run would.`,
		Example: `  sluice dlq replay --nats-store /tmp/qs --allow 'orders.>' --dry-run
  sluice dlq replay --server nats://127.0.0.1:4222 --allow 'orders.>' --rate 200/s --filter class=permanent --filter since=1h
  sluice dlq replay --rate 50/s --jitter 2s --max 1000 --deadline 5m --to orders.retry
  sluice dlq replay -b kafka:9092 --topic orders.dlq --allow 'orders-*' -X security.protocol=SASL_SSL -F client.properties`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := parseFilter(terms)
			if err != nil {
				return err
			}
			if max < 0 || burst < 0 || concurrency < 0 {
				return usageError{errors.New("--max, --burst and --concurrency must be ≥ 0")}
			}
			if to != "" && len(allow) > 0 {
				return usageError{errors.New("give --to (one destination for all) or --allow (patterns the letters' origins must match), not both")}
			}
			opts := dlq.ReplayOptions{Rate: rate.perSecond, Burst: burst, Jitter: jitter.d, Concurrency: concurrency,
				Filter: f, DryRun: dry, Max: max, MaxReplays: maxReplays, Topic: to, Allow: allow, Deadline: deadline.d}
			if maxReplays == 0 {
				opts.MaxReplays = -1
			}
			ctx := cmd.Context()
			b, err := cf.connect(ctx)
			if err != nil {
				return err
			}
			defer b.close()
			if nb, ok := b.(*natsBackend); ok {
				// Never publish into this connection's own API or inboxes.
				if p := nb.conn.jsAPIPrefix; p != "" {
					opts.Deny = append(opts.Deny, p+".>")
				}
				if p := nb.conn.inboxPrefix; p != "" {
					opts.Deny = append(opts.Deny, p+".>")
				}
			}
			if kb, ok := b.(*kafkaBackend); ok && !cmd.Flags().Changed("park") {
				park = kb.topic + ".parked" // the NATS default names a stream
			}
			switch {
			case park != "" && dry:
				opts.Park = dlq.SinkFunc(func(context.Context, *dlq.Letter) error { return errors.New("dry run") }) // never called
			case park != "":
				if opts.Park, err = b.park(ctx, park); err != nil {
					return fmt.Errorf("--park %q: %w", park, err)
				}
			}
			var mu sync.Mutex
			if dry && !o.json() && (to != "" || len(allow) > 0) {
				// Without --allow or --to the real run refuses to start,
				// and so does the dry run (below): it lists no letters.
				fmt.Fprintf(out, "dry run on %s: nothing is published or removed\n", b.describe())
				opts.OnLetter = func(d dlq.Decision) {
					mu.Lock()
					defer mu.Unlock()
					printDecision(out, d, park)
				}
			}
			prog := newProgress(errOut, every)
			if !dry {
				opts.Progress = prog.update
			}
			rp, err := dlq.NewReplayer(opts)
			if err != nil {
				return usageError{fmt.Errorf("--to/--allow: %w", err)}
			}
			src, done, err := b.open(ctx)
			if err != nil {
				return err
			}
			defer done()
			if !dry && (to != "" || len(allow) > 0) {
				fmt.Fprintf(errOut, "replaying %s at %s in batches of %d (jitter %v)\n", b.describe(), rate.String(), rp.Batch(), rp.Jitter())
			}
			rep, err := rp.Run(ctx, src, b.target())
			prog.finish()
			var nd *dlq.NoDestinationError
			if errors.As(err, &nd) {
				what := "replay needs"
				if dry {
					what = "dry run: a real run refuses to start: replay needs"
				}
				return usageError{fmt.Errorf("%s --allow PATTERN (repeatable) or --to DEST: letters are untrusted and do not choose where a replay publishes; %s",
					what, askedList(nd.Asked))}
			}
			interrupted := errors.Is(err, context.Canceled)
			resume, notes := "", []string(nil)
			if interrupted {
				resume, notes = resumeCommand(cmd, cf.secrets)
			}
			if o.json() {
				if jerr := writeJSON(out, replayJSON(rep, dry, err, resume, notes)); jerr != nil {
					return jerr
				}
			} else {
				summary := rep.String()
				if dry {
					summary = fmt.Sprintf("would replay %d, park %d; left in place: held %d, skipped %d, malformed %d",
						rep.Replayed, rep.Parked, rep.Held, rep.Skipped, rep.Malformed)
					if rep.Refused > 0 {
						summary += fmt.Sprintf("; refused %d", rep.Refused)
					}
				}
				fmt.Fprintln(out, summary)
				if dry || rep.Refused > 0 {
					printDestinations(out, rep.Destinations)
				}
			}
			if interrupted {
				lines := append([]string{"resume with:", "  " + resume}, notes...)
				return &codedError{err: fmt.Errorf("interrupted after moving %d letters (replayed %d, parked %d): the rest are still in %s",
					rep.Moved(), rep.Replayed, rep.Parked, b.describe()), notes: lines}
			}
			if err != nil {
				return fmt.Errorf("replay stopped: %w (letters not replayed are still in %s)", err, b.describe())
			}
			return replayOutcome(rep, dry, park)
		},
	}
	fs := cmd.Flags()
	fs.Var(&rate, "rate", "pace in letters per second: 200/s, 600/m, or inf")
	fs.IntVar(&burst, "burst", 0, "letters per batch (0: rate × 5 ms, at least 1)")
	fs.Var(&jitter, "jitter", "largest random delay on start and per batch: a duration, auto (one batch interval) or off")
	fs.IntVar(&concurrency, "concurrency", 0, "publishes (Kafka: batches) in flight at once (0: 8)")
	addFilterFlag(fs, &terms)
	fs.BoolVar(&dry, "dry-run", false, "print what would move and the destinations it would use; publish and remove nothing")
	fs.IntVar(&max, "max", 0, "stop after moving this many letters (0: no limit)")
	fs.IntVar(&maxReplays, "max-replays", dlq.DefaultMaxReplays, "loop guard: park letters already replayed this many times (0: no guard)")
	fs.StringVar(&park, "park", natsadapter.DefaultParkStream, "where refused letters and letters over --max-replays go (NATS stream or Kafka topic; \"\": leave them in place)")
	fs.StringVar(&to, "to", "", "republish every letter to this topic/subject")
	fs.StringArrayVar(&allow, "allow", nil, "republish letters to their origin when it matches this `PATTERN` (repeatable): orders.new, orders.* (one token), orders.> (the rest), orders-* (glob)")
	fs.Var(&deadline, "deadline", "deadline header of republished messages: a duration from the republish, drop, or keep")
	fs.DurationVar(&every, "progress", 0, "interval of progress lines on stderr (0: kept up to date on a terminal, every 10s otherwise)")
	return cmd
}

func printDecision(out io.Writer, d dlq.Decision, park string) {
	p := d.Pending
	if p.Letter == nil {
		fmt.Fprintf(out, "%-9s %s: %s\n", d.Action, p.Pos, oneLine(errString(p.Err), 200))
		return
	}
	var dest string
	switch {
	case d.Action == dlq.ActionReplay:
		dest = "→ " + d.Destination
	case d.Parked:
		dest = "→ " + park
	default:
		dest = "(stays)"
	}
	fmt.Fprintf(out, "%-6s %s %s  class=%s replays=%d last=%s", d.Action, p.Pos, dlq.Printable(dest, 120),
		dlq.Printable(p.Letter.Class, 40), p.Letter.Replays, stamp(p.Letter.LastFailure))
	if d.Reason != "" {
		fmt.Fprintf(out, "  (%s)", oneLine(d.Reason, 200))
	}
	fmt.Fprintln(out)
}

// replaySummary is the replay summary with --output json.
type replaySummary struct {
	DryRun         bool                   `json:"dry_run"`
	Replayed       int                    `json:"replayed"`
	Parked         int                    `json:"parked"`
	Refused        int                    `json:"refused"`
	Held           int                    `json:"held"`
	Skipped        int                    `json:"skipped"`
	Malformed      int                    `json:"malformed"`
	Unremoved      int                    `json:"unremoved"`
	ElapsedSeconds float64                `json:"elapsed_seconds"`
	Rate           float64                `json:"rate"`
	Destinations   []dlq.DestinationCount `json:"destinations"`
	Error          string                 `json:"error,omitempty"`
	Resume         string                 `json:"resume,omitempty"`
	// ResumeNotes say how to give back what Resume leaves out (secrets).
	ResumeNotes []string `json:"resume_notes,omitempty"`
}

func replayJSON(p dlq.Progress, dry bool, err error, resume string, notes []string) replaySummary {
	s := replaySummary{DryRun: dry, Replayed: p.Replayed, Parked: p.Parked, Refused: p.Refused, Held: p.Held, Skipped: p.Skipped,
		Malformed: p.Malformed, Unremoved: p.Unremoved, ElapsedSeconds: p.Elapsed.Seconds(), Rate: p.Rate,
		Destinations: p.Destinations, Resume: resume}
	for _, n := range notes {
		s.ResumeNotes = append(s.ResumeNotes, strings.TrimSpace(n))
	}
	if s.Destinations == nil {
		s.Destinations = []dlq.DestinationCount{}
	}
	if err != nil {
		s.Error = oneErrorLine(err)
	}
	return s
}

// replayOutcome is the exit of a replay that ran to its end (or a dry run,
// which predicts it): nil when every letter it selected was replayed, else
// an error with exitPartial (some replayed) or exitNothingReplayed (none),
// naming what was not replayed.
func replayOutcome(p dlq.Progress, dry bool, park string) error {
	left := p.Held + p.Malformed
	if p.Parked+left == 0 {
		return nil
	}
	verb, where := "replayed", "parked in "+park
	if dry {
		verb, where = "a real run would replay", "would be parked in "+park
	}
	what := fmt.Sprintf("%d %s", p.Parked, where)
	if park == "" || p.Parked == 0 {
		what = ""
	}
	if left > 0 {
		if what != "" {
			what += ", "
		}
		what += fmt.Sprintf("%d left in place (held %d, malformed %d)", left, p.Held, p.Malformed)
	}
	if p.Refused > 0 {
		what += fmt.Sprintf(" (refused %d)", p.Refused)
	}
	if p.Replayed == 0 {
		return &codedError{code: exitNothingReplayed, err: fmt.Errorf("%s none of %d letters: %s (exit %d)",
			verb, p.Parked+left, what, exitNothingReplayed)}
	}
	return &codedError{code: exitPartial, err: fmt.Errorf("%s %d of %d letters: %s (exit %d)",
		verb, p.Replayed, p.Replayed+p.Parked+left, what, exitPartial)}
}

// secretFlags says, for a flag whose value holds a secret, how the
// resumed command gets it back.
var secretFlags = map[string]string{
	"password": "the password is not printed: export NATS_PASSWORD=... before running it (sluice reads it like --password)",
	"token":    "the token is not printed: export NATS_TOKEN=... before running it (sluice reads it like --token)",
	"server":   "the server URL holds credentials and is not printed: export NATS_URL=<the URL> before running it (sluice reads it like --server)",
	"nats":     "the server URL holds credentials and is not printed: export NATS_URL=<the URL> before running it (sluice reads it like --nats)",
}

// resumeCommand is the command line that resumes cmd: the same arguments
// (a replay resumes from what is left), shell-quoted, so it runs as
// printed. An argument holding a secret is left out, and a note (one line
// each) says how to give it back: the environment variable sluice reads
// it from, or the flag to add.
func resumeCommand(cmd *cobra.Command, secrets *redactor) (string, []string) {
	args := strings.Fields(cmd.CommandPath())
	var notes []string
	secret := func(v string) bool { return secrets != nil && secrets.redact(v) != v }
	cmd.Flags().Visit(func(f *pflag.Flag) {
		if sv, ok := f.Value.(interface{ GetSlice() []string }); ok {
			for _, v := range sv.GetSlice() {
				if secret(v) {
					key, _, _ := strings.Cut(v, "=")
					flag := "--" + f.Name + " " + key + "=..."
					if f.Shorthand != "" {
						flag = "-" + f.Shorthand + " " + key + "=..."
					}
					notes = append(notes, fmt.Sprintf("  %s is not printed: add it back (or put %s in the -F properties file)", flag, key))
					continue
				}
				args = append(args, "--"+f.Name, v)
			}
			return
		}
		if secret(f.Value.String()) {
			note, ok := secretFlags[f.Name]
			if !ok {
				note = "--" + f.Name + " holds a secret and is not printed: add it back"
			}
			notes = append(notes, "  "+note)
			return
		}
		if f.Value.Type() == "bool" {
			args = append(args, "--"+f.Name+"="+f.Value.String())
			return
		}
		args = append(args, "--"+f.Name, f.Value.String())
	})
	for i, a := range args {
		args[i] = shellQuote(a)
	}
	return strings.Join(args, " "), notes
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./:=,@%+", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// askedList names the destinations letters asked for.
func askedList(asked []dlq.DestinationCount) string {
	if len(asked) == 0 {
		return "there is no letter to replay"
	}
	var b strings.Builder
	b.WriteString("the letters ask for ")
	for i, d := range asked {
		if i == 10 {
			fmt.Fprintf(&b, " and %d more", len(asked)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		name := d.Name
		if name == "" {
			name = "(no origin)"
		}
		fmt.Fprintf(&b, "%s (%d)", dlq.Printable(name, 80), d.Letters)
	}
	return b.String()
}

// printDestinations lists the destinations of a replay.
func printDestinations(out io.Writer, ds []dlq.DestinationCount) {
	if len(ds) == 0 {
		return
	}
	fmt.Fprintln(out, "destinations:")
	for _, d := range ds {
		name := d.Name
		if name == "" {
			name = "(none)"
		}
		if d.Refused != "" {
			fmt.Fprintf(out, "  %s  %d letters  REFUSED: %s\n", dlq.Printable(name, 120), d.Letters, oneLine(d.Refused, 200))
		} else {
			fmt.Fprintf(out, "  %s  %d letters\n", dlq.Printable(name, 120), d.Letters)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	if rw, ok := w.(*redactWriter); ok {
		w = rw.w
	}
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
