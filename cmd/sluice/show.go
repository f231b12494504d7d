package main

import (
	"encoding/hex"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode"
	"unicode/utf8"

	"github.com/spf13/cobra"

	"github.com/sluice-go/sluice/dlq"
)

// Bounds of `dlq show` on a terminal: letters are untrusted, and a letter
// with 3,000 headers or a 60 KiB one must not flood the screen.
const (
	showHeaderName  = 128  // bytes of a header name
	showHeaderValue = 512  // bytes of a header value
	showText        = 2048 // bytes of the error, park reason, truncation note
)

func newShowCmd(cf *connFlags, o *outputFlag, out io.Writer) *cobra.Command {
	var maxBytes, maxHeaders int
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show one dead letter with its metadata, headers and payload",
		Long: `Show one dead letter. ID is the stream sequence on NATS (dlq ls --letters prints
it, e.g. SLUICE_DLQ#42 or just 42) and partition/offset on Kafka (e.g. 0/17).

A letter's contents are untrusted: control characters are escaped (\x1b, \n),
binary payloads are shown as a hex dump, and long values and many headers are
cut (--max-bytes, --max-headers). --output json prints everything, escaped.`,
		Example: "  sluice dlq show 42 --nats-store /tmp/qs\n  sluice dlq show 0/17 -b kafka:9092 --topic orders.dlq -o json",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) != 1 {
				return usageError{fmt.Errorf("%s takes one letter id, got %d arguments", cmd.CommandPath(), len(args))}
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if maxBytes < 0 || maxHeaders < 0 {
				return usageError{fmt.Errorf("--max-bytes and --max-headers must be ≥ 0")}
			}
			b, err := cf.connect(cmd.Context())
			if err != nil {
				return err
			}
			defer b.close()
			l, pos, err := b.get(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if o.json() {
				return writeJSON(out, letterJSON(pos, l))
			}
			printLetter(out, pos, l, maxBytes, maxHeaders)
			return nil
		},
	}
	cmd.Flags().IntVar(&maxBytes, "max-bytes", 4096, "print at most this many bytes of the payload (0: all)")
	cmd.Flags().IntVar(&maxHeaders, "max-headers", 100, "print at most this many header values (0: all)")
	return cmd
}

// showJSON is `dlq show --output json`.
type showJSON struct {
	ID           string              `json:"id"`
	Route        string              `json:"route"`
	Class        string              `json:"class"`
	Error        string              `json:"error"`
	Attempts     int                 `json:"attempts"`
	FirstFailure *string             `json:"first_failure"`
	LastFailure  *string             `json:"last_failure"`
	Origin       originJSON          `json:"origin"`
	Replays      int                 `json:"replays"`
	Version      string              `json:"version"`
	ParkReason   string              `json:"park_reason,omitempty"`
	Truncated    string              `json:"truncated,omitempty"`
	Headers      map[string][]string `json:"headers"`
	Key          []byte              `json:"key"`   // base64
	Value        []byte              `json:"value"` // base64
	ValueText    *string             `json:"value_text,omitempty"`
}

type originJSON struct {
	Topic     string `json:"topic"`
	Stream    string `json:"stream,omitempty"`
	Sequence  uint64 `json:"sequence,omitempty"`
	Partition *int32 `json:"partition,omitempty"`
	Offset    *int64 `json:"offset,omitempty"`
	Group     string `json:"group,omitempty"`
}

func letterJSON(pos string, l *dlq.Letter) showJSON {
	o := l.Origin
	doc := showJSON{ID: pos, Route: l.Route, Class: l.Class, Error: l.Err, Attempts: l.Attempts,
		FirstFailure: jsonTime(l.FirstFailure), LastFailure: jsonTime(l.LastFailure), Replays: l.Replays, Version: l.Version,
		ParkReason: l.ParkReason, Truncated: l.Truncated, Headers: l.Headers, Key: l.Key, Value: l.Value,
		Origin: originJSON{Topic: o.Topic, Stream: o.Stream, Sequence: o.Sequence, Group: o.Group}}
	if o.Partition >= 0 && o.Stream == "" {
		doc.Origin.Partition, doc.Origin.Offset = &o.Partition, &o.Offset
	}
	if utf8.Valid(l.Value) {
		s := string(l.Value)
		doc.ValueText = &s
	}
	if doc.Headers == nil {
		doc.Headers = map[string][]string{}
	}
	return doc
}

func printLetter(out io.Writer, pos string, l *dlq.Letter, maxBytes, maxHeaders int) {
	tw := tabwriter.NewWriter(out, 2, 8, 2, ' ', 0)
	o := l.Origin
	origin := "topic " + o.Topic
	switch {
	case o.Stream != "":
		origin = fmt.Sprintf("stream %s, subject %s, sequence %d", o.Stream, o.Topic, o.Sequence)
	case o.Partition >= 0:
		origin = fmt.Sprintf("topic %s, partition %d, offset %d", o.Topic, o.Partition, o.Offset)
	}
	rows := [][2]string{
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
	}
	if l.ParkReason != "" {
		rows = append(rows, [2]string{"parked because", l.ParkReason})
	}
	if l.Truncated != "" {
		rows = append(rows, [2]string{"TRUNCATED", l.Truncated})
	}
	for _, kv := range rows {
		v := kv[1]
		if v == "" {
			v = "-"
		}
		fmt.Fprintf(tw, "%s:\t%s\n", kv[0], dlq.Printable(v, showText))
	}
	_ = tw.Flush()
	keys := make([]string, 0, len(l.Headers))
	values := 0
	for k, vs := range l.Headers {
		keys = append(keys, k)
		values += len(vs)
	}
	slices.Sort(keys)
	fmt.Fprintf(out, "headers: %d\n", len(keys))
	shown := 0
	for _, k := range keys {
		for _, v := range l.Headers[k] {
			if maxHeaders > 0 && shown == maxHeaders {
				fmt.Fprintf(out, "  … %d more header values (--max-headers 0 shows all, --output json prints them escaped)\n", values-shown)
				goto key
			}
			fmt.Fprintf(out, "  %s: %s\n", dlq.Printable(k, showHeaderName), dlq.Printable(v, showHeaderValue))
			shown++
		}
	}
key:
	if len(l.Key) > 0 {
		fmt.Fprintf(out, "key: %s\n", printable(l.Key, 256))
	}
	fmt.Fprintf(out, "value: %d bytes\n", len(l.Value))
	if len(l.Value) > 0 {
		fmt.Fprintln(out, indent(printable(l.Value, maxBytes)))
	}
}

// printable returns b as text if it is printable text (newlines and tabs
// allowed), else as a hex dump, cut at n bytes (0: no cut). A carriage
// return, an escape or a bidi override makes it a hex dump.
func printable(b []byte, n int) string {
	cut := ""
	if n > 0 && len(b) > n {
		b, cut = b[:n], fmt.Sprintf("\n… (%d more bytes)", len(b)-n)
	}
	text := utf8.Valid(b)
	for _, r := range string(b) {
		if !unicode.IsPrint(r) && r != '\n' && r != '\t' {
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
