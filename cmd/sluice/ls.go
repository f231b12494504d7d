package main

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-go/sluice/dlq"
)

// lsJSON is `dlq ls --output json`.
type lsJSON struct {
	Store     string       `json:"store"`
	Filtered  bool         `json:"filtered"`
	Total     int          `json:"total"`
	Malformed int          `json:"malformed"`
	Groups    []lsGroup    `json:"groups"`
	Letters   []lsLetterJS `json:"letters,omitempty"`
}

type lsGroup struct {
	Origin     string  `json:"origin"`
	Class      string  `json:"class"`
	Count      int     `json:"count"`
	MaxReplays int     `json:"max_replays"`
	Oldest     *string `json:"oldest_failure"`
	Newest     *string `json:"newest_failure"`
}

type lsLetterJS struct {
	ID          string  `json:"id"`
	Origin      string  `json:"origin,omitempty"`
	Class       string  `json:"class,omitempty"`
	LastFailure *string `json:"last_failure,omitempty"`
	Replays     int     `json:"replays"`
	Error       string  `json:"error,omitempty"`
	Malformed   string  `json:"malformed,omitempty"`

	lastFailure time.Time
}

func newLsCmd(cf *connFlags, o *outputFlag, out io.Writer) *cobra.Command {
	var terms []string
	var each bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "Count dead letters by origin and error class",
		Example: `  sluice dlq ls --server nats://127.0.0.1:4222
  sluice dlq ls --nats-store /tmp/qs --letters --filter class=permanent
  sluice dlq ls --context prod --output json`,
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
			var letters []lsLetterJS
			err = eachLetter(cmd.Context(), b, func(p *dlq.Pending) {
				if p.Letter != nil && !f.Match(p.Letter) {
					return
				}
				tally.Add(p.Letter)
				if !each {
					return
				}
				if p.Letter == nil {
					letters = append(letters, lsLetterJS{ID: p.Pos, Malformed: errString(p.Err)})
					return
				}
				l := p.Letter
				letters = append(letters, lsLetterJS{ID: p.Pos, Origin: dlq.OriginName(l), Class: l.Class,
					LastFailure: jsonTime(l.LastFailure), Replays: l.Replays, Error: l.Err, lastFailure: l.LastFailure})
			})
			if err != nil {
				return err
			}
			if o.json() {
				doc := lsJSON{Store: b.describe(), Filtered: !f.IsZero(), Total: tally.Total, Malformed: tally.Malformed,
					Groups: []lsGroup{}, Letters: letters}
				for _, r := range tally.Rows() {
					doc.Groups = append(doc.Groups, lsGroup{Origin: r.Origin, Class: r.Class, Count: r.Count, MaxReplays: r.MaxReplays,
						Oldest: jsonTime(r.Oldest), Newest: jsonTime(r.Newest)})
				}
				return writeJSON(out, doc)
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
				fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%s\t%s\n", cell(r.Origin, 80), cell(r.Class, 30), r.Count, r.MaxReplays, stamp(r.Oldest), stamp(r.Newest))
			}
			if tally.Malformed > 0 {
				fmt.Fprintf(tw, "(malformed)\t-\t%d\t-\t-\t-\n", tally.Malformed)
			}
			if each {
				fmt.Fprintln(tw, "\nID\tORIGIN\tCLASS\tLAST FAILURE\tREPLAYS\tERROR")
				for _, r := range letters {
					if r.Malformed != "" {
						fmt.Fprintf(tw, "%s\t-\t-\t-\t-\tmalformed: %s\n", cell(r.ID, 80), oneLine(r.Malformed, 60))
						continue
					}
					fmt.Fprintln(tw, strings.Join([]string{cell(r.ID, 80), cell(r.Origin, 80), cell(r.Class, 30),
						stamp(r.lastFailure), strconv.Itoa(r.Replays), oneLine(r.Error, 60)}, "\t"))
				}
			}
			return tw.Flush()
		},
	}
	addFilterFlag(cmd.Flags(), &terms)
	cmd.Flags().BoolVar(&each, "letters", false, "also list every letter with its id")
	return cmd
}

// cell is untrusted text for a table cell: escaped (tabs and newlines
// too, so columns hold) and cut.
func cell(s string, n int) string { return dlq.Printable(s, n) }
