package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/segmentio/kafka-go"
	"github.com/spf13/cobra"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/dlq"
)

func newPurgeCmd(cf *connFlags, o *outputFlag, out io.Writer) *cobra.Command {
	var terms []string
	var yes bool
	var upto uint64
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete dead letters (all, or those matching --filter); needs --yes",
		Long: `Purge deletes dead letters: all of them, or those matching --filter.

It reads the letters first and deletes only what it read: on NATS only
sequences up to the last one it counted (letters written meanwhile stay), on
Kafka it moves the replay group past exactly the records it read (Kafka cannot
delete single records; the topic keeps them for other groups).

Without --yes it only counts and prints the --upto to delete exactly those
letters later. Purge refuses a stream or topic that is not a sluice dead-letter
store (a stream without the sluice.store mark that holds messages that are not
dead letters), and on Kafka a group with active members.`,
		Example: `  sluice dlq purge --nats-store /tmp/qs --filter class=oversize
  sluice dlq purge --nats-store /tmp/qs --filter class=oversize --yes --upto 57`,
		Args: noArgs,
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
			kb, isKafka := b.(*kafkaBackend)
			if isKafka && !f.IsZero() {
				return usageError{fmt.Errorf("%s: Kafka cannot delete single records, so purge takes no --filter "+
					"(a purge moves the replay group past every letter; the topic keeps them)", kb.describe())}
			}
			if isKafka && cmd.Flags().Changed("upto") {
				return usageError{errors.New("--upto names a NATS stream sequence; on Kafka purge moves past exactly the records it reads")}
			}
			if isKafka {
				if err := kb.checkReplayGroup(ctx); err != nil {
					return err
				}
			}
			// Read: count what matches, up to --upto, and see what the store holds.
			var matched []*dlq.Pending
			var last uint64
			total, malformed := 0, 0
			src, done, err := b.open(ctx)
			if err != nil {
				return err
			}
			defer done()
			for {
				batch, err := src.Fetch(ctx, 256)
				if errors.Is(err, dlq.ErrDrained) {
					break
				}
				if err != nil {
					return err
				}
				for _, p := range batch {
					seq := natsSeq(p.Pos)
					if upto > 0 && seq > upto {
						continue
					}
					total++
					if p.Letter == nil {
						malformed++
					}
					if f.IsZero() || (p.Letter != nil && f.Match(p.Letter)) {
						matched = append(matched, p)
						last = max(last, seq)
					}
				}
			}
			if err := checkStore(ctx, b, total, malformed); err != nil {
				return err
			}
			if !yes {
				hint := ""
				if !isKafka && len(matched) > 0 {
					hint = fmt.Sprintf(" --upto %d", last)
				}
				return fmt.Errorf("%d letters in %s would be deleted; add --yes%s to purge them", len(matched), b.describe(), hint)
			}
			n := 0
			switch {
			case len(matched) == 0:
			case isKafka:
				for _, p := range matched {
					p.Leave()
				}
				if err := src.(interface{ Commit(context.Context) error }).Commit(ctx); err != nil {
					return err
				}
				n = len(matched)
			case f.IsZero():
				nb := b.(*natsBackend)
				if n, err = nb.purgeUpTo(ctx, last); err != nil {
					return err
				}
			default:
				for _, p := range matched {
					if err := p.Remove(ctx); err != nil {
						return fmt.Errorf("purged %d, then %s: %w", n, p.Pos, err)
					}
					n++
				}
			}
			if o.json() {
				return writeJSON(out, map[string]any{"store": b.describe(), "purged": n, "up_to": last})
			}
			fmt.Fprintf(out, "purged %d letters from %s\n", n, b.describe())
			return nil
		},
	}
	addFilterFlag(cmd.Flags(), &terms)
	cmd.Flags().BoolVar(&yes, "yes", false, "really delete")
	cmd.Flags().Uint64Var(&upto, "upto", 0, "NATS: consider only letters up to this stream sequence (what an earlier purge without --yes counted)")
	return cmd
}

// natsSeq reads the stream sequence of a NATS position ("STREAM#42"); 0
// for other positions.
func natsSeq(pos string) uint64 {
	_, s, ok := strings.Cut(pos, "#")
	if !ok {
		return 0
	}
	n, _ := strconv.ParseUint(s, 10, 64)
	return n
}

// checkStore refuses to purge what is not a sluice dead-letter store: a
// NATS stream needs the sluice.store mark or nothing but letters in it; a
// Kafka topic nothing but letters.
func checkStore(ctx context.Context, b backend, total, malformed int) error {
	if nb, ok := b.(*natsBackend); ok {
		st, err := nb.js.Stream(ctx, nb.stream)
		if err != nil {
			return err
		}
		if st.CachedInfo().Config.Metadata[natsadapter.StoreMetadataKey] != "" {
			return nil
		}
	}
	if malformed > 0 {
		return fmt.Errorf("%s is not a sluice dead-letter store: %d of the %d messages read are not dead letters; purge refuses it", b.describe(), malformed, total)
	}
	return nil
}

// purgeUpTo purges the stream (or its --subject) up to and including
// sequence last, and returns how many messages went.
func (b *natsBackend) purgeUpTo(ctx context.Context, last uint64) (int, error) {
	req := map[string]any{"seq": last + 1}
	if b.subject != "" {
		req["filter"] = b.subject
	}
	body, _ := json.Marshal(req)
	prefix := "$JS.API"
	switch {
	case b.conn.jsDomain != "":
		prefix = "$JS." + b.conn.jsDomain + ".API"
	case b.conn.jsAPIPrefix != "":
		prefix = strings.TrimSuffix(b.conn.jsAPIPrefix, ".")
	}
	msg, err := b.nc.RequestWithContext(ctx, prefix+".STREAM.PURGE."+b.stream, body)
	if err != nil {
		return 0, fmt.Errorf("purge %s: %w", b.stream, err)
	}
	var resp struct {
		Success bool                `json:"success"`
		Purged  int                 `json:"purged"`
		Error   *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &resp); err != nil {
		return 0, fmt.Errorf("purge %s: %w", b.stream, err)
	}
	if resp.Error != nil {
		return 0, fmt.Errorf("purge %s: %w", b.stream, resp.Error)
	}
	return resp.Purged, nil
}

// checkReplayGroup refuses a group with active members: that is an
// application's consumer group, and committing it would skip its work.
func (b *kafkaBackend) checkReplayGroup(ctx context.Context) error {
	resp, err := b.client.DescribeGroups(ctx, &kafka.DescribeGroupsRequest{GroupIDs: []string{b.group}})
	if err != nil {
		return nil // a broker that cannot describe groups: the replay group has no members anyway
	}
	for _, g := range resp.Groups {
		if g.GroupID == b.group && len(g.Members) > 0 {
			return fmt.Errorf("group %q has %d active members: it is an application's consumer group, not a replay group; purge refuses to move it (--group)", b.group, len(g.Members))
		}
	}
	return nil
}
