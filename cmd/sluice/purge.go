package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
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
	var uptoFlag string
	cmd := &cobra.Command{
		Use:   "purge",
		Short: "Delete dead letters (all, or those matching --filter); needs --yes --upto",
		Long: `Purge deletes dead letters: all of them, or those matching --filter.

It reads the letters first and deletes only what it read: on NATS only
sequences up to the last one it counted (letters written meanwhile stay), on
Kafka it moves the replay group past exactly the records it read (Kafka cannot
delete single records; the topic keeps them for other groups).

Without --yes it only counts and prints the --upto that deletes exactly those
letters later (NATS: the last stream sequence; Kafka: partition@offset of the
last record read in each partition). --yes needs --upto, so what goes is what
a count showed, never letters written since; --upto end deletes what the store
holds when the purge starts. Purge refuses a stream or topic that is not a sluice dead-letter
store (a stream without the sluice.store mark that holds messages that are not
dead letters), and on Kafka a group with active members.`,
		Example: `  sluice dlq purge --nats-store /tmp/qs --filter class=oversize
  sluice dlq purge --nats-store /tmp/qs --filter class=oversize --yes --upto 57
  sluice dlq purge -b kafka:9092 --topic orders.dlq --yes --upto 0@120,1@97`,
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
			upto, kupto, err := parseUpto(uptoFlag, isKafka)
			if err != nil {
				return err
			}
			if isKafka {
				if err := kb.checkReplayGroup(ctx); err != nil {
					return err
				}
			}
			if uptoFlag == "end" {
				// What the store holds now: letters written while the
				// purge reads stay.
				upto, kupto, err = storeEnd(ctx, b)
				if errors.Is(err, errEmptyAtStart) {
					fmt.Fprintf(out, "purged 0 letters from %s\n", b.describe())
					return nil
				}
				if err != nil {
					return err
				}
			}
			// Read: count what matches, up to --upto, and see what the store holds.
			var matched []*dlq.Pending
			var last uint64
			lastOff := map[int]int64{} // Kafka: last offset read per partition
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
					if part, off, ok := kafkaPos(p.Pos); ok {
						if lim, set := kupto[part]; kupto != nil && (!set || off > lim) {
							continue // past what was shown: not left, so the commit stops before it
						}
						lastOff[part] = max(lastOff[part], off)
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
			bound := ""
			switch {
			case len(matched) == 0:
			case isKafka:
				var parts []string
				for _, p := range slices.Sorted(maps.Keys(lastOff)) {
					parts = append(parts, fmt.Sprintf("%d@%d", p, lastOff[p]))
				}
				bound = strings.Join(parts, ",")
			default:
				bound = strconv.FormatUint(last, 10)
			}
			if !yes {
				hint := ""
				if bound != "" {
					hint = " --upto " + bound
				}
				return fmt.Errorf("%d letters in %s would be deleted; add --yes%s to purge them", len(matched), b.describe(), hint)
			}
			if uptoFlag == "" && len(matched) > 0 {
				// --yes alone would delete what this run reads, not what an
				// earlier count showed: letters written since would go too.
				return usageError{fmt.Errorf("purge --yes needs --upto, the bound a count (purge without --yes) printed, so that letters written since stay: "+
					"%s holds %d matching letters now (--upto %s deletes exactly these); --upto end deletes what it holds when the purge starts", b.describe(), len(matched), bound)}
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
	cmd.Flags().StringVar(&uptoFlag, "upto", "", "delete only up to what an earlier purge without --yes counted: a stream `SEQ` (NATS) or PART@OFFSET,... (Kafka); \"end\": what the store holds when the purge starts. --yes needs it")
	return cmd
}

// parseUpto reads --upto: a stream sequence on NATS, partition@offset
// pairs on Kafka ("end" is resolved by storeEnd).
func parseUpto(v string, isKafka bool) (uint64, map[int]int64, error) {
	if v == "" || v == "end" {
		return 0, nil, nil
	}
	if !isKafka {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n == 0 {
			return 0, nil, usageError{fmt.Errorf("--upto %q: want the stream sequence an earlier purge printed, e.g. 57", v)}
		}
		return n, nil, nil
	}
	out := map[int]int64{}
	for _, kv := range strings.Split(v, ",") {
		ps, os, ok := strings.Cut(strings.TrimSpace(kv), "@")
		p, err1 := strconv.Atoi(ps)
		o, err2 := strconv.ParseInt(os, 10, 64)
		if !ok || err1 != nil || err2 != nil || p < 0 || o < 0 {
			return 0, nil, usageError{fmt.Errorf("--upto %q: want partition@offset pairs as an earlier purge printed, e.g. 0@120,1@97", v)}
		}
		out[p] = o
	}
	return 0, out, nil
}

// errEmptyAtStart: --upto end on a stream that held nothing.
var errEmptyAtStart = errors.New("the stream holds no letters")

// storeEnd is --upto end: the last stream sequence (NATS) or the last
// offset of each partition (Kafka) the store holds now. An empty store
// bounds at nothing.
func storeEnd(ctx context.Context, b backend) (uint64, map[int]int64, error) {
	switch b := b.(type) {
	case *natsBackend:
		st, err := b.js.Stream(ctx, b.stream)
		if err != nil {
			return 0, nil, err
		}
		info, err := st.Info(ctx)
		if err != nil {
			return 0, nil, err
		}
		if info.State.LastSeq == 0 {
			return 0, nil, errEmptyAtStart
		}
		return info.State.LastSeq, nil, nil
	case *kafkaBackend:
		md, err := b.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{b.topic}})
		if err != nil {
			return 0, nil, err
		}
		var reqs []kafka.OffsetRequest
		for _, t := range md.Topics {
			if t.Name == b.topic {
				for _, p := range t.Partitions {
					reqs = append(reqs, kafka.LastOffsetOf(p.ID))
				}
			}
		}
		lo, err := b.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{b.topic: reqs}})
		if err != nil {
			return 0, nil, err
		}
		out := map[int]int64{}
		for _, po := range lo.Topics[b.topic] {
			if po.Error != nil {
				return 0, nil, fmt.Errorf("--upto end: partition %d: %w", po.Partition, po.Error)
			}
			out[po.Partition] = po.LastOffset - 1 // the next offset, less one
		}
		return 0, out, nil
	}
	return 0, nil, fmt.Errorf("--upto end: unknown store")
}

// kafkaPos reads partition and offset of a Kafka position ("topic/0@17").
func kafkaPos(pos string) (int, int64, bool) {
	i := strings.LastIndexByte(pos, '/')
	ps, os, ok := strings.Cut(pos[i+1:], "@")
	if i < 0 || !ok {
		return 0, 0, false
	}
	p, err1 := strconv.Atoi(ps)
	o, err2 := strconv.ParseInt(os, 10, 64)
	return p, o, err1 == nil && err2 == nil
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
