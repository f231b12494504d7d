package main

import (
	"encoding/json"
	"errors"
	"fmt"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/pflag"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
)

// connFlags are the broker connection flags every dlq subcommand shares.
// NATS flags are named like the nats CLI's (and read the same environment
// variables and contexts); Kafka flags like kcat's (-b, -X, -F).
type connFlags struct {
	fs *pflag.FlagSet

	// NATS
	natsURL     string
	natsStore   string
	stream      string
	subject     string
	context     string
	creds       string
	nkey        string
	user        string
	password    string
	token       string
	tlsCert     string
	tlsKey      string
	tlsCA       string
	tlsFirst    bool
	jsDomain    string
	jsAPIPrefix string
	inboxPrefix string
	timeout     time.Duration

	// Kafka
	brokers  string
	topic    string
	group    string
	props    []string // -X key=value
	propFile string   // -F file

	secrets *redactor
}

func (f *connFlags) register(fs *pflag.FlagSet) {
	f.fs = fs
	fs.StringVarP(&f.natsURL, "server", "s", "", "NATS server URLs, comma-separated ($NATS_URL, else the context's, else nats://127.0.0.1:4222)")
	fs.StringVar(&f.natsURL, "nats", "", "same as --server")
	fs.StringVar(&f.natsStore, "nats-store", "", "start an embedded NATS server on this JetStream store `DIR` instead of connecting")
	fs.StringVar(&f.stream, "stream", natsadapter.DefaultDLQStream, "NATS dead-letter stream")
	fs.StringVar(&f.subject, "subject", "", "NATS: only letters on this DLQ subject (e.g. sluice.dlq.orders)")
	fs.StringVar(&f.context, "context", "", "nats CLI context `NAME` to connect with ($NATS_CONTEXT, else the selected one: nats context select)")
	fs.StringVar(&f.creds, "creds", "", "NATS user credentials `FILE` (JWT and seed) ($NATS_CREDS)")
	fs.StringVar(&f.nkey, "nkey", "", "NATS user NKEY seed `FILE` ($NATS_NKEY)")
	fs.StringVar(&f.user, "user", "", "NATS user name ($NATS_USER)")
	fs.StringVar(&f.password, "password", "", "NATS password ($NATS_PASSWORD)")
	fs.StringVar(&f.token, "token", "", "NATS authentication token ($NATS_TOKEN)")
	fs.StringVar(&f.tlsCert, "tlscert", "", "TLS client certificate `FILE` ($NATS_CERT)")
	fs.StringVar(&f.tlsKey, "tlskey", "", "TLS client key `FILE` ($NATS_KEY)")
	fs.StringVar(&f.tlsCA, "tlsca", "", "TLS certificate authority `FILE` to verify the server ($NATS_CA)")
	fs.BoolVar(&f.tlsFirst, "tlsfirst", false, "NATS: TLS handshake before the server's INFO (servers with handshake_first)")
	fs.StringVar(&f.jsDomain, "js-domain", "", "JetStream domain")
	fs.StringVar(&f.jsAPIPrefix, "js-api-prefix", "", "JetStream API subject prefix (imported JetStream)")
	fs.StringVar(&f.inboxPrefix, "inbox-prefix", "", "NATS reply inbox prefix")
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "connect and request timeout ($NATS_TIMEOUT)")

	fs.StringVarP(&f.brokers, "brokers", "b", "", "Kafka bootstrap brokers, comma-separated host:port (or -X bootstrap.servers)")
	fs.StringVar(&f.topic, "topic", "", "Kafka dead-letter topic (needs --brokers)")
	fs.StringVar(&f.group, "group", "sluice-replay", "Kafka: consumer group of the replay (its commits are the resume point)")
	fs.StringArrayVarP(&f.props, "property", "X", nil, "Kafka client property `key=value` (repeatable): security.protocol, sasl.mechanism,\n"+
		"sasl.username, sasl.password, ssl.ca.location, ssl.certificate.location, ssl.key.location, client.id, ...")
	fs.StringVarP(&f.propFile, "config", "F", "", "Kafka client properties `FILE` (key=value lines, # comments), read before -X")
}

// changed reports whether the user set flag name.
func (f *connFlags) changed(name string) bool { return f.fs != nil && f.fs.Changed(name) }

// pick returns the first non-empty value: a flag the user set, then the
// environment variable, then the context's value, then def.
func (f *connFlags) pick(flag, val, env, ctxVal, def string) string {
	switch {
	case f.changed(flag):
		return val
	case env != "" && os.Getenv(env) != "":
		return os.Getenv(env)
	case ctxVal != "":
		return ctxVal
	}
	return def
}

// natsContext is the part of a nats CLI context file sluice reads
// (~/.config/nats/context/NAME.json).
type natsContext struct {
	URL         string `json:"url"`
	Token       string `json:"token"`
	User        string `json:"user"`
	Password    string `json:"password"`
	Creds       string `json:"creds"`
	NKey        string `json:"nkey"`
	UserJWT     string `json:"user_jwt"`
	UserSeed    string `json:"user_seed"`
	Cert        string `json:"cert"`
	Key         string `json:"key"`
	CA          string `json:"ca"`
	NSC         string `json:"nsc"`
	JSDomain    string `json:"jetstream_domain"`
	JSAPIPrefix string `json:"jetstream_api_prefix"`
	InboxPrefix string `json:"inbox_prefix"`
	SocksProxy  string `json:"socks_proxy"`
	TLSFirst    bool   `json:"tls_first"`
}

func natsConfigDir() (string, error) {
	if d := os.Getenv("XDG_CONFIG_HOME"); d != "" {
		return filepath.Join(d, "nats"), nil
	}
	home, err := os.UserHomeDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(home, ".config", "nats"), nil
}

// loadContext reads the context --context (or $NATS_CONTEXT, or the one
// `nats context select` chose) names. No context named or selected is not
// an error: it returns nil.
func (f *connFlags) loadContext() (*natsContext, string, error) {
	name := f.context
	if !f.changed("context") {
		name = os.Getenv("NATS_CONTEXT")
	}
	dir, err := natsConfigDir()
	if err != nil {
		if name != "" {
			return nil, "", fmt.Errorf("--context %q: %w", name, err)
		}
		return nil, "", nil
	}
	explicit := name != ""
	if !explicit {
		sel, err := os.ReadFile(filepath.Join(dir, "context.txt"))
		if err != nil {
			return nil, "", nil // nothing selected
		}
		name = strings.TrimSpace(string(sel))
		if name == "" {
			return nil, "", nil
		}
	}
	path := name
	if !strings.HasSuffix(name, ".json") || !filepath.IsAbs(name) {
		if strings.ContainsAny(name, `/\`) || !filepath.IsLocal(name) {
			return nil, "", usageError{fmt.Errorf("--context %q: not a context name", name)}
		}
		path = filepath.Join(dir, "context", name+".json")
	}
	b, err := os.ReadFile(path)
	if err != nil {
		how := "--context"
		if !explicit {
			how = "the selected nats context (" + filepath.Join(dir, "context.txt") + ")"
		}
		return nil, "", fmt.Errorf("%s %q: %w", how, name, err)
	}
	var c natsContext
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, "", fmt.Errorf("nats context %q (%s): %w", name, path, err)
	}
	f.secrets.add(c.Password, c.Token, c.UserSeed)
	switch {
	case c.NSC != "" || strings.HasPrefix(c.Creds, "nsc://"):
		return nil, "", fmt.Errorf("nats context %q uses nsc credentials, which sluice cannot read: export a creds file and give --creds", name)
	case c.SocksProxy != "":
		return nil, "", fmt.Errorf("nats context %q uses a SOCKS proxy, which sluice does not support", name)
	}
	return &c, name, nil
}

// natsOptions builds the connection options, and returns the server URLs
// and the JetStream domain and API prefix.
type natsConn struct {
	url         string
	opts        []nats.Option
	jsDomain    string
	jsAPIPrefix string
	inboxPrefix string
	timeout     time.Duration
	context     string // the context used, "" if none
}

func (f *connFlags) natsOptions() (*natsConn, error) {
	f.secrets.add(os.Getenv("NATS_PASSWORD"), os.Getenv("NATS_TOKEN"))
	f.secrets.add(f.password, f.token)
	c, ctxName, err := f.loadContext()
	if err != nil {
		return nil, err
	}
	if c == nil {
		c = &natsContext{}
	}
	nc := &natsConn{context: ctxName}
	nc.url = f.pick("server", f.natsURL, "NATS_URL", c.URL, nats.DefaultURL)
	if f.changed("nats") {
		nc.url = f.natsURL
	}
	timeout := f.timeout
	if !f.changed("timeout") && os.Getenv("NATS_TIMEOUT") != "" {
		d, err := time.ParseDuration(os.Getenv("NATS_TIMEOUT"))
		if err != nil || d <= 0 {
			return nil, usageError{fmt.Errorf("$NATS_TIMEOUT %q: want a duration such as 5s", os.Getenv("NATS_TIMEOUT"))}
		}
		timeout = d
	}
	if timeout <= 0 {
		return nil, usageError{errors.New("--timeout must be positive")}
	}
	nc.timeout = timeout
	nc.opts = append(nc.opts, nats.Name("sluice cli"), nats.Timeout(timeout), nats.NoReconnect())

	user := f.pick("user", f.user, "NATS_USER", c.User, "")
	password := f.pick("password", f.password, "NATS_PASSWORD", c.Password, "")
	token := f.pick("token", f.token, "NATS_TOKEN", c.Token, "")
	creds := f.pick("creds", f.creds, "NATS_CREDS", c.Creds, "")
	nkey := f.pick("nkey", f.nkey, "NATS_NKEY", c.NKey, "")
	methods := 0
	for _, set := range []bool{user != "" || password != "", token != "", creds != "", nkey != "", c.UserJWT != ""} {
		if set {
			methods++
		}
	}
	if methods > 1 {
		return nil, usageError{errors.New("give one way to authenticate: --user/--password, --token, --creds or --nkey (flags, $NATS_* variables and the context together)")}
	}
	switch {
	case user != "" || password != "":
		if user == "" {
			return nil, usageError{errors.New("--password needs --user")}
		}
		nc.opts = append(nc.opts, nats.UserInfo(user, password))
	case token != "":
		nc.opts = append(nc.opts, nats.Token(token))
	case creds != "":
		if _, err := os.Stat(creds); err != nil {
			return nil, fmt.Errorf("--creds: %w", err)
		}
		nc.opts = append(nc.opts, nats.UserCredentials(creds))
	case nkey != "":
		opt, err := nats.NkeyOptionFromSeed(nkey)
		if err != nil {
			return nil, fmt.Errorf("--nkey %q: %w", nkey, err)
		}
		nc.opts = append(nc.opts, opt)
	case c.UserJWT != "":
		nc.opts = append(nc.opts, nats.UserJWTAndSeed(c.UserJWT, c.UserSeed))
	}

	cert := f.pick("tlscert", f.tlsCert, "NATS_CERT", c.Cert, "")
	key := f.pick("tlskey", f.tlsKey, "NATS_KEY", c.Key, "")
	ca := f.pick("tlsca", f.tlsCA, "NATS_CA", c.CA, "")
	switch {
	case (cert == "") != (key == ""):
		return nil, usageError{errors.New("--tlscert and --tlskey go together")}
	case cert != "":
		nc.opts = append(nc.opts, nats.ClientCert(cert, key))
	}
	if ca != "" {
		nc.opts = append(nc.opts, nats.RootCAs(ca))
	}
	if f.tlsFirst || (!f.changed("tlsfirst") && c.TLSFirst) {
		nc.opts = append(nc.opts, nats.TLSHandshakeFirst())
	}
	nc.inboxPrefix = f.pick("inbox-prefix", f.inboxPrefix, "", c.InboxPrefix, "")
	if nc.inboxPrefix != "" {
		nc.opts = append(nc.opts, nats.CustomInboxPrefix(nc.inboxPrefix))
	}
	nc.jsDomain = f.pick("js-domain", f.jsDomain, "", c.JSDomain, "")
	nc.jsAPIPrefix = f.pick("js-api-prefix", f.jsAPIPrefix, "", c.JSAPIPrefix, "")
	if nc.jsDomain != "" && nc.jsAPIPrefix != "" {
		return nil, usageError{errors.New("give --js-domain or --js-api-prefix, not both")}
	}
	f.secrets.add(passwordsIn(nc.url)...)
	return nc, nil
}

// passwordsIn returns the passwords and tokens in a NATS URL list.
func passwordsIn(list string) []string {
	var out []string
	for _, u := range strings.Split(list, ",") {
		p, err := neturl.Parse(strings.TrimSpace(u))
		if err != nil || p.User == nil {
			continue
		}
		if pw, ok := p.User.Password(); ok {
			out = append(out, pw)
		} else if name := p.User.Username(); name != "" {
			out = append(out, name) // nats://TOKEN@host
		}
	}
	return out
}

// displayURL is a URL list without credentials.
func displayURL(list string) string {
	parts := strings.Split(list, ",")
	for i, u := range parts {
		u = strings.TrimSpace(u)
		if p, err := neturl.Parse(u); err == nil && p.User != nil {
			p.User = nil
			u = p.String()
		}
		parts[i] = u
	}
	return strings.Join(parts, ",")
}
