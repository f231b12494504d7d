package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/dlq"
)

func newRootCmd(out, errOut io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:           "sluice",
		Short:         "Inspect and replay sluice dead letters on NATS JetStream and Kafka",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(out)
	root.SetErr(errOut)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newDLQCmd(out, errOut))
	return root
}

func newDLQCmd(out, errOut io.Writer) *cobra.Command {
	var cf connFlags
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List, show, replay and purge dead letters",
		Long: `Dead letters are what a sluice consumer could not process: the original message
(key, value, headers untouched) plus why it died, in Sluice-Dlq-* headers.

Broker: --nats URL (default $NATS_URL, else nats://127.0.0.1:4222) or
--nats-store DIR (start an embedded NATS server on a JetStream store, for
example the quick start's -store DIR), with --stream (default SLUICE_DLQ);
or --brokers host:port,... with --topic for Kafka.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return noArgs(cmd, args) },
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&cf.natsURL, "nats", "", "NATS server URL (default $NATS_URL, else nats://127.0.0.1:4222)")
	pf.StringVar(&cf.natsStore, "nats-store", "", "start an embedded NATS server on this JetStream store `DIR` instead of connecting")
	pf.StringVar(&cf.stream, "stream", natsadapter.DefaultDLQStream, "NATS dead-letter stream")
	pf.StringVar(&cf.subject, "subject", "", "NATS: only letters on this DLQ subject (e.g. sluice.dlq.orders)")
	pf.StringVar(&cf.brokers, "brokers", "", "Kafka bootstrap brokers, comma-separated host:port")
	pf.StringVar(&cf.topic, "topic", "", "Kafka dead-letter topic")
	pf.StringVar(&cf.group, "group", "sluice-replay", "Kafka: consumer group of the replay (its commits are the resume point)")
	cmd.AddCommand(newLsCmd(&cf, out), newShowCmd(&cf, out), newReplayCmd(&cf, out, errOut), newPurgeCmd(&cf, out))
	return cmd
}

func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		if cmd.HasSubCommands() {
			return usageError{fmt.Errorf("unknown command %q for %q", args[0], cmd.CommandPath())}
		}
		return usageError{fmt.Errorf("%s takes no arguments, got %q", cmd.CommandPath(), args)}
	}
	if cmd.HasSubCommands() {
		return usageError{fmt.Errorf("%s needs a subcommand: ls, show, replay or purge", cmd.CommandPath())}
	}
	return nil
}

// filterFlag collects --filter terms.
func addFilterFlag(fs *pflag.FlagSet, terms *[]string) {
	fs.StringArrayVar(terms, "filter", nil, "select letters: `key=value` with keys class, origin (glob on topic/subject or stream),\n"+
		"route, since, until (RFC 3339 or a duration ago, e.g. 2h); repeat or space-separate terms")
}

func parseFilter(terms []string) (dlq.Filter, error) {
	f, err := dlq.ParseFilter(strings.Join(terms, " "), time.Now())
	if err != nil {
		return f, usageError{fmt.Errorf("--filter: %w", err)}
	}
	return f, nil
}

// eachLetter calls fn for every letter of a fresh pass.
func eachLetter(ctx context.Context, b backend, fn func(p *dlq.Pending)) error {
	src, done, err := b.open(ctx)
	if err != nil {
		return err
	}
	defer done()
	for {
		batch, err := src.Fetch(ctx, 256)
		if errors.Is(err, dlq.ErrDrained) {
			return nil
		}
		if err != nil {
			return err
		}
		for _, p := range batch {
			fn(p)
		}
	}
}

func newLsCmd(cf *connFlags, out io.Writer) *cobra.Command {
	var terms []string
	var each bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "Count dead letters by origin and error class",
		Example: `  sluice dlq ls --nats nats://127.0.0.1:4222
  sluice dlq ls --nats-store /tmp/qs --letters --filter class=permanent`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := parseFilter(terms)
			if err != nil {
				return err
			}
			b, err := cf.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer b.close()
			var tally dlq.Tally
			var rows [][]string
			err = eachLetter(cmd.Context(), b, func(p *dlq.Pending) {
				if p.Letter != nil && !f.Match(p.Letter) {
					return
				}
				tally.Add(p.Letter)
				if !each {
					return
				}
				if p.Letter == nil {
					rows = append(rows, []string{p.Pos, "-", "-", "-", "-", "malformed: " + p.Err.Error()})
					return
				}
				l := p.Letter
				rows = append(rows, []string{p.Pos, dlq.OriginName(l), l.Class, stamp(l.LastFailure),
					strconv.Itoa(l.Replays), oneLine(l.Err, 60)})
			})
			if err != nil {
				return err
			}
			what := "letters"
			if !f.IsZero() {
				what = "letters matching the filter"
			}
			fmt.Fprintf(out, "%s: %d %s\n", b.describe(), tally.Total, what)
			if tally.Total == 0 {
				return nil
			}
			tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', 0)
			fmt.Fprintln(tw, "\nORIGIN\tCLASS\tCOUNT\tMAX REPLAYS\tOLDEST FAILURE\tNEWEST FAILURE")
			for _, r := range tally.Rows() {
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", r.Origin, r.Class, r.Count, r.MaxReplays, stamp(r.Oldest), stamp(r.Newest))
			}
			if tally.Malformed > 0 {
				fmt.Fprintf(tw, "(malformed)\t-\t%d\t-\t-\t-\n", tally.Malformed)
			}
			if each {
				fmt.Fprintln(tw, "\nID\tORIGIN\tCLASS\tLAST FAILURE\tREPLAYS\tERROR")
				for _, r := range rows {
					fmt.Fprintln(tw, strings.Join(r, "\t"))
				}
			}
			return tw.Flush()
		},
	}
	addFilterFlag(cmd.Flags(), &terms)
	cmd.Flags().BoolVar(&each, "letters", false, "also list every letter with its id")
	return cmd
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n-1]) + "…"
	}
	return s
}

func newShowCmd(cf *connFlags, out io.Writer) *cobra.Command {
	var maxBytes int
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show one dead letter with its metadata, headers and payload",
		Long: `Show one dead letter. ID is the stream sequence on NATS (dlq ls --letters prints
it, e.g. SLUICE_DLQ#42 or just 42) and partition/offset on Kafka (e.g. 0/17).`,
		Example: "  sluice dlq show 42 --nats-store /tmp/qs",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("%s takes one letter id, got %d arguments", cmd.CommandPath(), len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := cf.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer b.close()
			l, pos, err := b.get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			printLetter(out, pos, l, maxBytes)
			return nil
		},
	}
	cmd.Flags().IntVar(&maxBytes, "max-bytes", 4096, "print at most this many bytes of the payload (0: all)")
	return cmd
}

func printLetter(out io.Writer, pos string, l *dlq.Letter, maxBytes int) {
	tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', 0)
	o := l.Origin
	origin := "topic " + o.Topic
	switch {
	case o.Stream != "":
		origin = fmt.Sprintf("stream %s, subject %s, sequence %d", o.Stream, o.Topic, o.Sequence)
	case o.Partition >= 0:
		origin = fmt.Sprintf("topic %s, partition %d, offset %d", o.Topic, o.Partition, o.Offset)
	}
	for _, kv := range [][2]string{
		{"letter", pos},
		{"route", l.Route},
		{"class", l.Class},
		{"error", l.Err},
		{"attempts", strconv.Itoa(l.Attempts)},
		{"first failure", stamp(l.FirstFailure)},
		{"last failure", stamp(l.LastFailure)},
		{"origin", origin},
		{"group", o.Group},
		{"replays", strconv.Itoa(l.Replays)},
		{"written by", "sluice " + l.Version},
	} {
		v := kv[1]
		if v == "" {
			v = "-"
		}
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], v)
	}
	_ = tw.Flush()
	keys := make([]string, 0, len(l.Headers))
	for k := range l.Headers {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	fmt.Fprintf(out, "headers: %d\n", len(keys))
	for _, k := range keys {
		for _, v := range l.Headers[k] {
			fmt.Fprintf(out, "  %s: %s\n", k, v)
		}
	}
	if len(l.Key) > 0 {
		fmt.Fprintf(out, "key: %s\n", printable(l.Key, 256))
	}
	fmt.Fprintf(out, "value: %d bytes\n", len(l.Value))
	if len(l.Value) > 0 {
		fmt.Fprintln(out, indent(printable(l.Value, maxBytes)))
	}
}

// printable returns b as text if it is text, else as a hex dump, cut at n
// bytes (0: no cut).
func printable(b []byte, n int) string {
	cut := ""
	if n > 0 && len(b) > n {
		b, cut = b[:n], fmt.Sprintf("\n… (%d more bytes)", len(b)-n)
	}
	text := utf8.Valid(b)
	for _, r := range string(b) {
		if !unicode.IsPrint(r) && !unicode.IsSpace(r) {
			text = false
			break
		}
	}
	if text {
		return string(b) + cut
	}
	return strings.TrimRight(hex.Dump(b), "\n") + cut
}

func indent(s string) string { return "  " + strings.ReplaceAll(s, "\n", "\n  ") }

// rateValue is a --rate flag: "200/s", "200" (per second), "600/m", "inf".
type rateValue struct{ perSecond float64 }

func (r *rateValue) String() string {
	if math.IsInf(r.perSecond, 1) {
		return "inf"
	}
	return strconv.FormatFloat(r.perSecond, 'f', -1, 64) + "/s"
}

func (r *rateValue) Type() string { return "rate" }

func (r *rateValue) Set(s string) error {
	v := strings.ToLower(strings.TrimSpace(s))
	if v == "inf" || v == "unlimited" || v == "max" {
		r.perSecond = math.Inf(1)
		return nil
	}
	num, unit, _ := strings.Cut(v, "/")
	per := map[string]float64{"": 1, "s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600}[unit]
	n, err := strconv.ParseFloat(num, 64)
	if err != nil || per == 0 || n <= 0 || math.IsInf(n, 0) || math.IsNaN(n) {
		return fmt.Errorf("want letters per second such as 200/s, 600/m or inf, got %q", s)
	}
	r.perSecond = n / per
	return nil
}

// modeDuration is a flag that is a duration or one of a few words.
type modeDuration struct {
	d     time.Duration
	word  string
	words map[string]time.Duration
}

func (m *modeDuration) String() string {
	if m.word != "" {
		return m.word
	}
	return m.d.String()
}

func (m *modeDuration) Type() string { return "duration" }

func (m *modeDuration) Set(s string) error {
	if d, ok := m.words[s]; ok {
		m.d, m.word = d, s
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		names := make([]string, 0, len(m.words))
		for w := range m.words {
			names = append(names, w)
		}
		slices.Sort(names)
		return fmt.Errorf("want a positive duration (e.g. 250ms) or one of %s, got %q", strings.Join(names, ", "), s)
	}
	m.d, m.word = d, ""
	return nil
}

func newReplayCmd(cf *connFlags, out, errOut io.Writer) *cobra.Command {
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
--allow admits it, or into --to, at --rate, in small batches (so the rate holds on coarse timers) with full jitter
on the start and between batches (so many replayers do not synchronize).

Each letter is removed from the dead-letter queue only after its republish is
confirmed by the broker: stop a replay at any time (Ctrl-C) and run it again to
resume; if the target refuses a publish the letter stays and the replay stops.
The republished message is the original key, value and headers, without the
Sluice-Dlq-* envelope, with Sluice-Replay-Count incremented; a letter already
replayed --max-replays times is parked (--park) instead of replayed again.

The old deadline header (Sluice-Deadline) of a dead letter has passed; --deadline
sets a fresh one (a duration from the republish), drops it (default: a consumer's
max-age then counts from the republish) or keeps it.

Letters are untrusted (anyone who can write the dead-letter store chooses their
headers), so a letter's origin is only a request: replay publishes to it only
when an --allow pattern matches, or to --to. Subjects starting with "$" (the
server's APIs) or "_INBOX", and Kafka's "__" topics, are always refused. A
refused letter is parked (--park) with the reason and the replay goes on;
--dry-run lists the destinations it would use.

A progress line with rate and ETA goes to stderr every --progress.`,
		Example: `  sluice dlq replay --nats-store /tmp/qs --dry-run
  sluice dlq replay --nats nats://127.0.0.1:4222 --allow 'orders.>' --rate 200/s --filter class=permanent --filter since=1h
  sluice dlq replay --rate 50/s --jitter 2s --max 1000 --deadline 5m --to orders.retry`,
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
			if dry {
				fmt.Fprintf(out, "dry run on %s: nothing is published or removed\n", b.describe())
				opts.OnLetter = func(d dlq.Decision) {
					mu.Lock()
					defer mu.Unlock()
					p := d.Pending
					if p.Letter == nil {
						fmt.Fprintf(out, "%-9s %s: %s\n", d.Action, p.Pos, dlq.Printable(errString(p.Err), 200))
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
						fmt.Fprintf(out, "  (%s)", dlq.Printable(d.Reason, 200))
					}
					fmt.Fprintln(out)
				}
			}
			var lastLine time.Time
			opts.Progress = func(p dlq.Progress) {
				if p.Done || dry || time.Since(lastLine) < every {
					return
				}
				lastLine = time.Now()
				fmt.Fprintln(errOut, p.String())
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
			if !dry {
				fmt.Fprintf(errOut, "replaying %s at %s in batches of %d (jitter %v)\n", b.describe(), rate.String(), rp.Batch(), rp.Jitter())
			}
			rep, err := rp.Run(ctx, src, b.target())
			summary := rep.String()
			if dry {
				summary = fmt.Sprintf("would replay %d, park %d; left in place: held %d, skipped %d, malformed %d",
					rep.Replayed, rep.Parked, rep.Held, rep.Skipped, rep.Malformed)
			}
			fmt.Fprintln(out, summary)
			var nd *dlq.NoDestinationError
			if errors.As(err, &nd) {
				return usageError{fmt.Errorf("replay needs --allow PATTERN (repeatable) or --to DEST: letters are untrusted and do not choose where a replay publishes; %s",
					askedList(nd.Asked))}
			}
			if dry {
				printDestinations(out, rep.Destinations)
			}
			if errors.Is(err, context.Canceled) {
				return fmt.Errorf("interrupted: the letters not replayed are still in %s; run the same command to resume", b.describe())
			}
			if err != nil {
				return fmt.Errorf("replay stopped: %w (letters not replayed are still in %s)", err, b.describe())
			}
			return nil
		},
	}
	fs := cmd.Flags()
	fs.Var(&rate, "rate", "pace in letters per second: 200/s, 600/m, or inf")
	fs.IntVar(&burst, "burst", 0, "letters per batch (0: rate × 50 ms, at least 1)")
	fs.Var(&jitter, "jitter", "largest random delay on start and per batch: a duration, auto (one batch interval) or off")
	fs.IntVar(&concurrency, "concurrency", 0, "publishes in flight at once (0: 8)")
	addFilterFlag(fs, &terms)
	fs.BoolVar(&dry, "dry-run", false, "print what would move, publish and remove nothing")
	fs.IntVar(&max, "max", 0, "stop after moving this many letters (0: no limit)")
	fs.IntVar(&maxReplays, "max-replays", dlq.DefaultMaxReplays, "loop guard: park letters already replayed this many times (0: no guard)")
	fs.StringVar(&park, "park", natsadapter.DefaultParkStream, "where letters over --max-replays go (NATS stream or Kafka topic; \"\": leave them in place)")
	fs.StringVar(&to, "to", "", "republish every letter to this topic/subject")
	fs.StringArrayVar(&allow, "allow", nil, "republish letters to their origin when it matches this `PATTERN` (repeatable): orders.new, orders.* (one token), orders.> (the rest), orders-* (glob)")
	fs.Var(&deadline, "deadline", "deadline header of republished messages: a duration from the republish, drop, or keep")
	fs.DurationVar(&every, "progress", time.Second, "interval of the progress line on stderr")
	return cmd
}

func newPurgeCmd(cf *connFlags, out io.Writer) *cobra.Command {
	var terms []string
	var yes bool
	cmd := &cobra.Command{
		Use:     "purge",
		Short:   "Delete dead letters (all, or those matching --filter); needs --yes",
		Example: `  sluice dlq purge --nats-store /tmp/qs --filter class=oversize --yes`,
		Args:    noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := parseFilter(terms)
			if err != nil {
				return err
			}
			ctx := cmd.Context()
			b, err := cf.connect(ctx)
			if err != nil {
				return err
			}
			defer b.close()
			if f.IsZero() && yes {
				n, err := b.purgeAll(ctx)
				if err != nil {
					return err
				}
				fmt.Fprintf(out, "purged %d letters from %s\n", n, b.describe())
				return nil
			}
			var matched []*dlq.Pending
			if err := eachLetter(ctx, b, func(p *dlq.Pending) {
				if f.IsZero() || (p.Letter != nil && f.Match(p.Letter)) {
					matched = append(matched, p)
				}
			}); err != nil {
				return err
			}
			if kb, ok := b.(*kafkaBackend); ok && !f.IsZero() {
				return usageError{fmt.Errorf("%s: Kafka cannot delete single records, so purge takes no --filter "+
					"(a purge moves the replay group past every letter; the topic keeps them)", kb.describe())}
			}
			if !yes {
				return fmt.Errorf("%d letters in %s would be deleted; add --yes to purge them", len(matched), b.describe())
			}
			n := 0
			for _, p := range matched {
				if err := p.Remove(ctx); err != nil {
					return fmt.Errorf("purged %d, then %s: %w", n, p.Pos, err)
				}
				n++
			}
			fmt.Fprintf(out, "purged %d letters from %s\n", n, b.describe())
			return nil
		},
	}
	addFilterFlag(cmd.Flags(), &terms)
	cmd.Flags().BoolVar(&yes, "yes", false, "really delete")
	return cmd
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
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

// printDestinations lists a dry run's destinations.
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
			fmt.Fprintf(out, "  %s  %d letters  REFUSED: %s\n", dlq.Printable(name, 120), d.Letters, dlq.Printable(d.Refused, 200))
		} else {
			fmt.Fprintf(out, "  %s  %d letters\n", dlq.Printable(name, 120), d.Letters)
		}
	}
}
