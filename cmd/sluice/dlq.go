package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/sluice-go/sluice/dlq"
)

func newRootCmd(out, errOut io.Writer, secrets *redactor) *cobra.Command {
	root := &cobra.Command{
		Use:           "sluice",
		Short:         "Inspect and replay sluice dead letters on NATS JetStream and Kafka",
		Version:       version(),
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetVersionTemplate("sluice {{.Version}}\n")
	root.SetOut(out)
	root.SetErr(errOut)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	root.AddCommand(newDLQCmd(out, errOut, secrets))
	return root
}

// version names the build: the module version, the envelope version and
// the commit when the binary knows them.
func version() string {
	v := "(devel)"
	var rev, goVersion string
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Version != "" {
			v = bi.Main.Version
		}
		goVersion = bi.GoVersion
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 {
				rev = ", commit " + s.Value[:12]
			}
		}
	}
	return fmt.Sprintf("%s (dead-letter envelope %s%s, %s)", v, dlq.Version, rev, goVersion)
}

func newDLQCmd(out, errOut io.Writer, secrets *redactor) *cobra.Command {
	cf := &connFlags{secrets: secrets}
	var output string
	cmd := &cobra.Command{
		Use:   "dlq",
		Short: "List, show, replay and purge dead letters",
		Long: `Dead letters are what a sluice consumer could not process: the original message
(key, value, headers untouched) plus why it died, in Sluice-Dlq-* headers.

NATS: --server URL (default $NATS_URL, else the nats CLI context's, else
nats://127.0.0.1:4222) with the nats CLI's flags and variables for credentials
and TLS (--creds, --nkey, --user/--password, --token, --tlscert/--tlskey/--tlsca,
--tlsfirst, --context), or --nats-store DIR (an embedded server on a JetStream
store, for example the quick start's -store DIR); --stream (default SLUICE_DLQ).

Kafka: --brokers host:port,... (-b) with --topic, and kcat's -X key=value and
-F FILE for security.protocol, sasl.*, ssl.* and client.id.

Secrets never appear in any output: passwords, tokens and URL credentials are
replaced by [REDACTED].`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, args []string) error { return noArgs(cmd, args) },
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return usageError{fmt.Errorf("--output %q: want table or json", output)}
			}
			return nil
		},
	}
	pf := cmd.PersistentFlags()
	cf.register(pf)
	pf.StringVarP(&output, "output", "o", "table", "output format: table or json")
	o := &outputFlag{format: &output}
	cmd.AddCommand(newLsCmd(cf, o, out), newShowCmd(cf, o, out), newReplayCmd(cf, o, out, errOut), newPurgeCmd(cf, o, out))
	return cmd
}

// outputFlag is the --output format the subcommands read.
type outputFlag struct{ format *string }

func (o *outputFlag) json() bool { return *o.format == "json" }

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

func stamp(t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	return t.UTC().Format(time.RFC3339)
}

// oneLine is untrusted text on one line: whitespace runs become one
// space, control characters are escaped, and it is cut at n runes.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if utf8.RuneCountInString(s) > n {
		s = string([]rune(s)[:n-1]) + "…"
	}
	return dlq.Printable(s, 0)
}

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
