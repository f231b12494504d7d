package main

import (
	"cmp"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/dlq"
)

// kafkaBackend is a dead-letter topic seen through a replay group: the
// letters "in the queue" are those after the group's committed offsets.
type kafkaBackend struct {
	cluster *kafkaadapter.Cluster
	client  *kafka.Client // preflight and offset look-ups
	tr      *kafka.Transport
	topic   string
	group   string
	tgt     *kafkaadapter.ReplayTarget
	sinks   []*kafkaadapter.DeadLetterSink
}

func connectKafka(ctx context.Context, f *connFlags) (backend, error) {
	cl, err := f.kafkaCluster()
	if err != nil {
		return nil, err
	}
	if f.topic == "" {
		return nil, usageError{errors.New("Kafka needs --topic, the dead-letter topic")}
	}
	group := f.group
	if group == "" {
		group = kafkaadapter.DefaultReplayGroup
	}
	tr := &kafka.Transport{TLS: cl.TLS, SASL: cl.SASL, ClientID: cmp.Or(cl.ClientID, kafkaadapter.DefaultClientID),
		DialTimeout: cmp.Or(cl.DialTimeout, f.timeout)}
	b := &kafkaBackend{cluster: cl, topic: f.topic, group: group, tr: tr,
		client: &kafka.Client{Addr: kafka.TCP(cl.Brokers...), Transport: tr, Timeout: f.timeout}}
	// One metadata round trip: a bad address, refused credentials or a
	// missing topic fail here, clearly, rather than in the middle of a
	// command.
	cctx, cancel := context.WithTimeout(ctx, f.timeout)
	defer cancel()
	brokers := strings.Join(cl.Brokers, ",")
	md, err := b.client.Metadata(cctx, &kafka.MetadataRequest{Topics: []string{f.topic}})
	if err != nil {
		tr.CloseIdleConnections()
		return nil, kafkaConnectError(ctx, cl, f.timeout, err)
	}
	for _, t := range md.Topics {
		if t.Name == f.topic && t.Error == nil && len(t.Partitions) > 0 {
			return b, nil
		}
		if t.Name == f.topic && errors.Is(t.Error, kafka.TopicAuthorizationFailed) {
			tr.CloseIdleConnections()
			return nil, fmt.Errorf("topic %q on %s: not authorized (the principal has no ACL to describe it)", f.topic, brokers)
		}
	}
	tr.CloseIdleConnections()
	return nil, fmt.Errorf("topic %q %w on %s (--topic names the dead-letter topic)", f.topic, errNoStream, brokers)
}

// kafkaConnectError says why Kafka could not be reached in one line, and
// names the likely mismatch between security.protocol and the listener
// when the broker closed the connection or never answered.
func kafkaConnectError(ctx context.Context, cl *kafkaadapter.Cluster, timeout time.Duration, err error) error {
	brokers := strings.Join(cl.Brokers, ",")
	withSASL, withTLS := cl.SASL != nil, cl.TLS != nil
	msg := err.Error()
	closed := errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET)
	switch {
	case errors.Is(err, kafka.SASLAuthenticationFailed) || strings.Contains(msg, "SASL Authentication Failed"):
		return fmt.Errorf("cannot connect to Kafka at %s: the broker refused the credentials (SASL authentication failed): check sasl.mechanism, sasl.username and sasl.password", brokers)
	case closed && !withTLS && speaksTLS(ctx, cl.Brokers, timeout):
		// A TLS listener drops what is not a TLS handshake.
		want := "SSL"
		if withSASL {
			want = "SASL_SSL"
		}
		return fmt.Errorf("cannot connect to Kafka at %s: the listener speaks TLS and closed the plaintext connection: set security.protocol=%s (and ssl.ca.location)", brokers, want)
	case closed && !withSASL:
		// A SASL listener drops a client that sends requests before it
		// authenticates.
		want := "SASL_PLAINTEXT"
		if withTLS {
			want = "SASL_SSL"
		}
		return fmt.Errorf("cannot connect to Kafka at %s: the broker closed the connection before answering, as a SASL listener does to a client that does not authenticate: set security.protocol=%s with sasl.mechanism, sasl.username and sasl.password", brokers, want)
	case closed:
		// Some brokers refuse credentials by closing the connection.
		return fmt.Errorf("cannot connect to Kafka at %s: the broker closed the connection during SASL authentication: it refused the credentials or the mechanism (check sasl.mechanism, sasl.username and sasl.password)", brokers)
	case strings.Contains(msg, "x509:") || strings.Contains(msg, "tls:") || strings.Contains(msg, "first record does not look like a TLS handshake"):
		return fmt.Errorf("cannot connect to Kafka at %s: TLS: %s (check security.protocol and ssl.ca.location)", brokers, firstLine(msg))
	case errors.Is(err, context.DeadlineExceeded) && withTLS:
		return fmt.Errorf("cannot reach Kafka at %s: no answer within --timeout (a listener without TLS spoken to in TLS stays silent: check security.protocol, PLAINTEXT or SASL_PLAINTEXT for such a listener)", brokers)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("cannot reach Kafka at %s: no answer within --timeout (a TLS or SASL listener spoken to in plaintext stays silent: check security.protocol)", brokers)
	}
	return fmt.Errorf("cannot reach Kafka at %s: %s", brokers, firstLine(msg))
}

// speaksTLS reports whether the first of brokers answers a TLS handshake
// (its certificate is not checked: this only tells a TLS listener from a
// plaintext one, to name the mismatch).
func speaksTLS(ctx context.Context, brokers []string, timeout time.Duration) bool {
	if len(brokers) == 0 {
		return false
	}
	// A plaintext listener stays silent: bound the wait (1 s at most).
	ctx, cancel := context.WithTimeout(ctx, min(cmp.Or(timeout, time.Second), time.Second))
	defer cancel()
	// Nothing is sent over it: the certificate does not matter here.
	d := &tls.Dialer{Config: &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}}
	conn, err := d.DialContext(ctx, "tcp", brokers[0])
	if err == nil {
		conn.Close()
		return true
	}
	// A TLS server that refused the handshake still answered in TLS.
	var alert tls.AlertError
	return errors.As(err, &alert)
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

func (b *kafkaBackend) describe() string {
	return fmt.Sprintf("topic %s (group %s)", b.topic, b.group)
}

func (b *kafkaBackend) open(ctx context.Context) (dlq.Source, func(), error) {
	src, err := kafkaadapter.NewLetterSource(ctx, kafkaadapter.LetterSourceConfig{Cluster: b.cluster, Topic: b.topic, Group: b.group})
	if err != nil {
		return nil, nil, err
	}
	return src, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = src.Close(cctx)
	}, nil
}

func (b *kafkaBackend) get(ctx context.Context, id string) (*dlq.Letter, string, error) {
	id = strings.TrimPrefix(id, b.topic+"/")
	id = strings.Replace(id, "@", "/", 1)
	// Answer at once for an offset the partition does not have.
	if ps, os, ok := strings.Cut(id, "/"); ok {
		part, err1 := strconv.Atoi(ps)
		off, err2 := strconv.ParseInt(os, 10, 64)
		if err1 == nil && err2 == nil && part >= 0 && off >= 0 {
			lo, err := b.client.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{
				b.topic: {kafka.FirstOffsetOf(part), kafka.LastOffsetOf(part)}}})
			if err == nil {
				found := false
				for _, po := range lo.Topics[b.topic] {
					found = found || po.Partition == part
					if po.Partition != part {
						continue
					}
					if po.Error != nil {
						return nil, "", fmt.Errorf("no letter %d/%d in topic %s: %v", part, off, b.topic, po.Error)
					}
					if off < po.FirstOffset || off >= po.LastOffset {
						return nil, "", fmt.Errorf("no letter %d/%d in topic %s (partition %d holds offsets %d to %d)",
							part, off, b.topic, part, po.FirstOffset, po.LastOffset-1)
					}
				}
				if !found {
					return nil, "", fmt.Errorf("no letter %d/%d: topic %s has no partition %d", part, off, b.topic, part)
				}
			}
		}
	}
	l, err := kafkaadapter.GetLetter(ctx, b.cluster, b.topic, id)
	if errors.Is(err, dlq.ErrInvalidOption) {
		return nil, "", usageError{err}
	}
	if err != nil {
		return nil, "", err
	}
	// What the adapter carries in a header map for itself (the wire order
	// of the headers, Sluice-Kafka-Header-Order) is not the letter's.
	for k := range l.Headers {
		if strings.HasPrefix(k, kafkaMetaPrefix) {
			delete(l.Headers, k)
		}
	}
	return l, b.topic + "/" + strings.Replace(id, "/", "@", 1), nil
}

// kafkaMetaPrefix starts the header names the Kafka adapter keeps in a
// letter's header map for itself (kafkaadapter.HeaderOrder): never on the
// wire, never shown.
const kafkaMetaPrefix = "Sluice-Kafka-"

func (b *kafkaBackend) target() dlq.Target {
	if b.tgt == nil {
		b.tgt, _ = kafkaadapter.NewReplayTarget(b.cluster, kafkaadapter.ReplayTargetOptions{}) // brokers are non-empty here
	}
	return b.tgt
}

func (b *kafkaBackend) park(ctx context.Context, name string) (dlq.Sink, error) {
	s, err := kafkaadapter.NewDeadLetterSink(b.cluster, name)
	if err != nil {
		return nil, err
	}
	b.sinks = append(b.sinks, s)
	return s, nil
}

func (b *kafkaBackend) close() {
	b.tr.CloseIdleConnections()
	if b.tgt != nil {
		_ = b.tgt.Close()
	}
	for _, s := range b.sinks {
		_ = s.Close()
	}
}
