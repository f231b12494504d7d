package main

import (
	"context"
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/dlq"
)

// backend is one broker's dead-letter queue as the commands see it.
type backend interface {
	// describe names the queue: `stream "SLUICE_DLQ"`.
	describe() string
	// open starts a pass over the letters present now.
	open(ctx context.Context) (dlq.Source, func(), error)
	// get reads one letter by its id (NATS: stream sequence; Kafka:
	// partition/offset).
	get(ctx context.Context, id string) (*dlq.Letter, string, error)
	target() dlq.Target
	// park returns the sink of letters over the loop guard, named name.
	park(ctx context.Context, name string) (dlq.Sink, error)
	close()
}

// errNoStream is what a missing stream or topic looks like to the user.
var errNoStream = errors.New("not found")

func (f *connFlags) connect(ctx context.Context) (backend, error) {
	kafkaSet := f.brokers != "" || len(f.props) > 0 || f.propFile != ""
	natsSet := f.natsStore != "" || f.natsURL != ""
	switch {
	case kafkaSet && natsSet:
		return nil, usageError{errors.New("give either --brokers (Kafka) or --server/--nats-store (NATS), not both")}
	case kafkaSet || f.changed("topic") || f.changed("group"):
		return connectKafka(ctx, f)
	}
	var srv *server.Server
	if f.natsStore != "" {
		if f.natsURL != "" {
			return nil, usageError{errors.New("give either --server or --nats-store, not both")}
		}
		if _, err := os.Stat(filepath.Join(f.natsStore, "jetstream")); err != nil {
			return nil, fmt.Errorf("--nats-store %q: no JetStream store there (run the quick start with -store %s first): %w",
				f.natsStore, f.natsStore, err)
		}
		s, err := startEmbedded(f.natsStore)
		if err != nil {
			return nil, fmt.Errorf("--nats-store %q: starting an embedded NATS server: %w", f.natsStore, err)
		}
		srv = s
	}
	conn, err := f.natsOptions()
	if err != nil {
		stopServer(srv)
		return nil, err
	}
	url := conn.url
	if srv != nil {
		url = srv.ClientURL()
	}
	if err := checkNatsURL(url); err != nil {
		stopServer(srv)
		return nil, err
	}
	shown := displayURL(url)
	nc, err := nats.Connect(url, conn.opts...)
	if err != nil {
		stopServer(srv)
		return nil, natsConnectError(shown, conn, err)
	}
	var js jetstream.JetStream
	jsOpts := []jetstream.JetStreamOpt{jetstream.WithDefaultTimeout(conn.timeout)}
	switch {
	case conn.jsDomain != "":
		js, err = jetstream.NewWithDomain(nc, conn.jsDomain, jsOpts...)
	case conn.jsAPIPrefix != "":
		js, err = jetstream.NewWithAPIPrefix(nc, conn.jsAPIPrefix, jsOpts...)
	default:
		js, err = jetstream.New(nc, jsOpts...)
	}
	if err != nil {
		nc.Close()
		stopServer(srv)
		return nil, err
	}
	stream := f.stream
	if stream == "" {
		stream = natsadapter.DefaultDLQStream
	}
	b := &natsBackend{nc: nc, js: js, srv: srv, stream: stream, subject: f.subject, url: shown, conn: conn}
	if _, err := js.Stream(ctx, stream); err != nil {
		b.close()
		switch {
		case errors.Is(err, jetstream.ErrStreamNotFound):
			return nil, fmt.Errorf("stream %q %w on %s (dead letters go to %s unless the sink was configured otherwise; --stream picks another)",
				stream, errNoStream, shown, natsadapter.DefaultDLQStream)
		case errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, nats.ErrNoResponders):
			return nil, fmt.Errorf("NATS at %s has no JetStream for this account (or --js-domain/--js-api-prefix is wrong): %w", shown, err)
		case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
			return nil, fmt.Errorf("stream %q: no answer from JetStream at %s within --timeout %v (permissions, or --js-domain/--js-api-prefix?)", stream, shown, conn.timeout)
		}
		return nil, fmt.Errorf("stream %q: %w", stream, err)
	}
	return b, nil
}

// natsConnectError says why a connection failed in one line an operator
// can act on.
func natsConnectError(url string, conn *natsConn, err error) error {
	via := ""
	if conn.context != "" {
		via = " (context " + conn.context + ")"
	}
	switch {
	case errors.Is(err, nats.ErrAuthorization) || strings.Contains(strings.ToLower(err.Error()), "authorization violation"):
		return fmt.Errorf("cannot connect to NATS at %s%s: the server refused the credentials (authorization violation): check --user/--password, --token, --creds or --nkey", url, via)
	case errors.Is(err, nats.ErrAuthExpired):
		return fmt.Errorf("cannot connect to NATS at %s%s: the credentials have expired", url, via)
	case strings.Contains(err.Error(), "x509:") || strings.Contains(err.Error(), "tls:") || strings.Contains(err.Error(), "tls error"):
		return fmt.Errorf("cannot connect to NATS at %s%s: TLS: %w (check --tlsca, --tlscert/--tlskey, --tlsfirst)", url, via, err)
	}
	return fmt.Errorf("cannot connect to NATS at %s%s: %w", url, via, err)
}

// checkNatsURL refuses what cannot be a NATS server list before dialling.
func checkNatsURL(list string) error {
	for _, u := range strings.Split(list, ",") {
		u = strings.TrimSpace(u)
		if !strings.Contains(u, "://") {
			u = "nats://" + u // nats.go accepts host:port
		}
		p, err := neturl.Parse(u)
		if err == nil && p.Host == "" {
			err = errors.New("no host")
		}
		if err == nil {
			switch p.Scheme {
			case "nats", "tls", "ws", "wss":
			default:
				err = fmt.Errorf("scheme %q", p.Scheme)
			}
		}
		if err != nil {
			return usageError{fmt.Errorf("NATS URL %q: %v; want nats://host:port (comma-separated for a cluster)", displayURL(list), err)}
		}
	}
	return nil
}

// startEmbedded runs a JetStream server on storeDir, on a random loopback
// port, for --nats-store.
func startEmbedded(storeDir string) (*server.Server, error) {
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: storeDir, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, err
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		stopServer(s)
		return nil, errors.New("server not ready after 10s")
	}
	return s, nil
}

func stopServer(s *server.Server) {
	if s != nil {
		s.Shutdown()
		s.WaitForShutdown()
	}
}

type natsBackend struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	srv     *server.Server
	stream  string
	subject string
	url     string // without credentials
	conn    *natsConn
}

func (b *natsBackend) describe() string {
	if b.subject != "" {
		return fmt.Sprintf("stream %s (subject %s)", b.stream, b.subject)
	}
	return "stream " + b.stream
}

func (b *natsBackend) open(ctx context.Context) (dlq.Source, func(), error) {
	src, err := natsadapter.NewLetterSource(ctx, b.js, natsadapter.LetterSourceOptions{Stream: b.stream, Subject: b.subject})
	if err != nil {
		return nil, nil, err
	}
	return src, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		_ = src.Close(cctx)
	}, nil
}

func (b *natsBackend) get(ctx context.Context, id string) (*dlq.Letter, string, error) {
	seq, err := strconv.ParseUint(strings.TrimPrefix(id, b.stream+"#"), 10, 64)
	if err != nil || seq == 0 {
		return nil, "", usageError{fmt.Errorf("letter id %q: want the stream sequence, as `dlq ls --ids` prints it (e.g. 42)", id)}
	}
	l, _, err := natsadapter.GetLetter(ctx, b.js, b.stream, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, "", fmt.Errorf("no letter %d in stream %s", seq, b.stream)
	}
	return l, b.stream + "#" + strconv.FormatUint(seq, 10), err
}

func (b *natsBackend) target() dlq.Target { return natsadapter.NewReplayTarget(b.js) }

func (b *natsBackend) park(ctx context.Context, name string) (dlq.Sink, error) {
	if name == natsadapter.DefaultParkStream {
		return natsadapter.NewParkSink(ctx, b.js)
	}
	return natsadapter.NewDeadLetterSink(ctx, b.js, natsadapter.SinkOptions{Stream: name,
		SubjectPrefix: "sluice.parked." + strings.ToLower(name)})
}

func (b *natsBackend) close() {
	b.nc.Close()
	stopServer(b.srv)
}
