package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// secureNATS is a NATS server that demands credentials, with the CLI
// arguments that pass them and the secret that must never be printed.
type secureNATS struct {
	url    string
	args   []string // connection flags for the CLI
	secret string   // what must never appear in any output
	admin  []nats.Option
	wrong  []string // connection flags with a wrong secret
}

func startServer(t *testing.T, opts *server.Options) *server.Server {
	t.Helper()
	opts.Host, opts.Port, opts.JetStream, opts.StoreDir, opts.NoLog, opts.NoSigs = "127.0.0.1", -1, true, t.TempDir(), true, true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// seedSecure writes the fixture's letters through an admin connection.
func (s *secureNATS) seed(t *testing.T) {
	t.Helper()
	nc, err := nats.Connect(s.url, s.admin...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	seedLetters(t, ctx, js)
}

func writeFile(t *testing.T, name string, data []byte) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func userPasswordNATS(t *testing.T) *secureNATS {
	const pw = "s3cret-Pa55word"
	s := startServer(t, &server.Options{Users: []*server.User{{Username: "alice", Password: pw}}})
	return &secureNATS{url: s.ClientURL(), secret: pw, admin: []nats.Option{nats.UserInfo("alice", pw)},
		args:  []string{"--server", s.ClientURL(), "--user", "alice", "--password", pw},
		wrong: []string{"--server", s.ClientURL(), "--user", "alice", "--password", "wrong-" + pw}}
}

func tokenNATS(t *testing.T) *secureNATS {
	const tok = "t0ken-XYZ-123456"
	s := startServer(t, &server.Options{Authorization: tok})
	return &secureNATS{url: s.ClientURL(), secret: tok, admin: []nats.Option{nats.Token(tok)},
		args:  []string{"--server", s.ClientURL(), "--token", tok},
		wrong: []string{"--server", s.ClientURL(), "--token", tok + "-nope"}}
}

func nkeyNATS(t *testing.T) *secureNATS {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	s := startServer(t, &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}})
	seedFile := writeFile(t, "user.nk", seed)
	other, _ := nkeys.CreateUser()
	otherSeed, _ := other.Seed()
	opt, err := nats.NkeyOptionFromSeed(seedFile)
	if err != nil {
		t.Fatal(err)
	}
	return &secureNATS{url: s.ClientURL(), secret: string(seed), admin: []nats.Option{opt},
		args:  []string{"--server", s.ClientURL(), "--nkey", seedFile},
		wrong: []string{"--server", s.ClientURL(), "--nkey", writeFile(t, "other.nk", otherSeed)}}
}

// credsNATS runs the server in operator mode: an operator, a system
// account, an account with JetStream and a user, made here with
// nats-io/jwt and nkeys, served by a memory resolver.
func credsNATS(t *testing.T) *secureNATS {
	op, _ := nkeys.CreateOperator()
	opPub, _ := op.PublicKey()
	opc := jwt.NewOperatorClaims(opPub)
	opc.Name = "test-operator"
	sys, _ := nkeys.CreateAccount()
	sysPub, _ := sys.PublicKey()
	opc.SystemAccount = sysPub
	opJWT, err := opc.Encode(op)
	if err != nil {
		t.Fatal(err)
	}
	opClaims, err := jwt.DecodeOperatorClaims(opJWT)
	if err != nil {
		t.Fatal(err)
	}
	account := func(kp nkeys.KeyPair, js bool) (string, string) {
		pub, _ := kp.PublicKey()
		ac := jwt.NewAccountClaims(pub)
		if js {
			ac.Limits.JetStreamLimits = jwt.JetStreamLimits{MemoryStorage: -1, DiskStorage: -1, Streams: -1, Consumer: -1}
		}
		tok, err := ac.Encode(op)
		if err != nil {
			t.Fatal(err)
		}
		return pub, tok
	}
	acc, _ := nkeys.CreateAccount()
	accPub, accJWT := account(acc, true)
	_, sysJWT := account(sys, false)
	user := func() []byte {
		u, _ := nkeys.CreateUser()
		uPub, _ := u.PublicKey()
		uc := jwt.NewUserClaims(uPub)
		uc.IssuerAccount = accPub
		tok, err := uc.Encode(acc)
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := u.Seed()
		creds, err := jwt.FormatUserConfig(tok, seed)
		if err != nil {
			t.Fatal(err)
		}
		return creds
	}
	res := &server.MemAccResolver{}
	_ = res.Store(accPub, accJWT)
	_ = res.Store(sysPub, sysJWT)
	s := startServer(t, &server.Options{TrustedOperators: []*jwt.OperatorClaims{opClaims}, AccountResolver: res, SystemAccount: sysPub})
	creds := user()
	credsFile := writeFile(t, "user.creds", creds)
	// A user of an account the server does not know.
	stranger, _ := nkeys.CreateAccount()
	strangerPub, _ := stranger.PublicKey()
	sc := jwt.NewAccountClaims(strangerPub)
	_, _ = sc.Encode(op)
	u, _ := nkeys.CreateUser()
	uPub, _ := u.PublicKey()
	uc := jwt.NewUserClaims(uPub)
	badTok, _ := uc.Encode(stranger)
	badSeed, _ := u.Seed()
	badCreds, _ := jwt.FormatUserConfig(badTok, badSeed)
	seed := credsSeed(t, creds)
	return &secureNATS{url: s.ClientURL(), secret: seed, admin: []nats.Option{nats.UserCredentials(credsFile)},
		args:  []string{"--server", s.ClientURL(), "--creds", credsFile},
		wrong: []string{"--server", s.ClientURL(), "--creds", writeFile(t, "bad.creds", badCreds)}}
}

func credsSeed(t *testing.T, creds []byte) string {
	kp, err := jwt.ParseDecoratedUserNKey(creds)
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	return string(seed)
}

// tlsFiles makes a CA, a server certificate for 127.0.0.1 and a client
// certificate, as PEM files.
type tlsFiles struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func makeTLS(t *testing.T) tlsFiles {
	t.Helper()
	dir := t.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	caKey := key()
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	leaf := func(name string, usage x509.ExtKeyUsage, serial int64) (string, string) {
		k := key()
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kd, _ := x509.MarshalECPrivateKey(k)
		return write(name+".pem", "CERTIFICATE", der), write(name+"-key.pem", "EC PRIVATE KEY", kd)
	}
	f := tlsFiles{ca: write("ca.pem", "CERTIFICATE", caDER)}
	f.serverCert, f.serverKey = leaf("server", x509.ExtKeyUsageServerAuth, 2)
	f.clientCert, f.clientKey = leaf("client", x509.ExtKeyUsageClientAuth, 3)
	return f
}

// tlsNATS is a TLS server with a password; mutual makes it demand a
// client certificate too.
func tlsNATS(t *testing.T, mutual bool) *secureNATS {
	f := makeTLS(t)
	cfg, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: f.serverCert, KeyFile: f.serverKey, CaFile: f.ca, Verify: mutual})
	if err != nil {
		t.Fatal(err)
	}
	const pw = "tls-Pa55word-77"
	s := startServer(t, &server.Options{TLS: true, TLSConfig: cfg, TLSVerify: mutual, TLSTimeout: 5,
		Users: []*server.User{{Username: "bob", Password: pw}}})
	url := "tls://" + strings.TrimPrefix(strings.TrimPrefix(s.ClientURL(), "nats://"), "tls://")
	admin := []nats.Option{nats.RootCAs(f.ca), nats.UserInfo("bob", pw)}
	args := []string{"--server", url, "--tlsca", f.ca, "--user", "bob", "--password", pw}
	wrong := []string{"--server", url, "--tlsca", f.ca, "--user", "bob", "--password", pw + "x"}
	if mutual {
		admin = append(admin, nats.ClientCert(f.clientCert, f.clientKey))
		args = append(args, "--tlscert", f.clientCert, "--tlskey", f.clientKey)
		wrong = []string{"--server", url, "--tlsca", f.ca, "--user", "bob", "--password", pw} // no client certificate
	}
	return &secureNATS{url: url, secret: pw, admin: admin, args: args, wrong: wrong}
}

// TestNATSSecuredClusters (issue 18): ls, show, replay and purge work
// against a server that demands a password, a token, an NKEY, a creds
// file (operator mode), TLS and mutual TLS; the wrong credential gives one
// clear line and exit 1; no output of any command contains the secret.
func TestNATSSecuredClusters(t *testing.T) {
	for _, tc := range []struct {
		name  string
		start func(*testing.T) *secureNATS
		want  string // in the wrong-credential error
	}{
		{"user-password", userPasswordNATS, "refused the credentials"},
		{"token", tokenNATS, "refused the credentials"},
		{"nkey", nkeyNATS, "refused the credentials"},
		{"creds", credsNATS, "refused the credentials"},
		{"tls", func(t *testing.T) *secureNATS { return tlsNATS(t, false) }, "refused the credentials"},
		{"mtls", func(t *testing.T) *secureNATS { return tlsNATS(t, true) }, "TLS: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.start(t)
			s.seed(t)
			var outputs []string
			cli := func(args ...string) (string, string, int) {
				out, errOut, code := run(t, append(args, s.args...)...)
				outputs = append(outputs, out, errOut)
				return out, errOut, code
			}
			if out, errOut, code := cli("dlq", "ls"); code != 0 || !strings.Contains(out, "5 letters") {
				t.Fatalf("ls: %d %q %q", code, out, errOut)
			}
			if out, errOut, code := cli("dlq", "show", "1", "-o", "json"); code != 0 || !strings.Contains(out, `"class": "permanent"`) {
				t.Fatalf("show: %d %q %q", code, out, errOut)
			}
			if out, errOut, code := cli("dlq", "replay", "--allow", "orders.>", "--rate", "inf", "--filter", "route=orders"); code != 0 || !strings.HasPrefix(out, "replayed 4") {
				t.Fatalf("replay: %d %q %q", code, out, errOut)
			}
			if out, errOut, code := cli("dlq", "purge", "--yes", "--upto", "end"); code != 0 || out != "purged 1 letters from stream SLUICE_DLQ\n" {
				t.Fatalf("purge: %d %q %q", code, out, errOut)
			}
			_, errOut, code := run(t, append([]string{"dlq", "ls"}, s.wrong...)...)
			outputs = append(outputs, errOut)
			if code != exitError || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, tc.want) {
				t.Fatalf("wrong credential: exit %d, stderr %q; want exit 1 and one line saying %q", code, errOut, tc.want)
			}
			for _, o := range outputs {
				if strings.Contains(o, s.secret) {
					t.Fatalf("output contains the secret:\n%s", o)
				}
			}
			t.Logf("wrong credential: %s", strings.TrimSpace(errOut))
		})
	}
}

// TestSecretsNeverPrinted runs every error path we can provoke with a
// password in the flags, the URL, the environment and a nats context,
// and greps all output for it.
func TestSecretsNeverPrinted(t *testing.T) {
	s := userPasswordNATS(t)
	s.seed(t)
	pw := s.secret
	host := strings.TrimPrefix(s.url, "nats://")
	ctxDir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(ctxDir, "nats", "context"), 0o700); err != nil {
		t.Fatal(err)
	}
	ctxJSON := `{"url": "` + s.url + `", "user": "alice", "password": "` + pw + `"}`
	if err := os.WriteFile(filepath.Join(ctxDir, "nats", "context", "prod.json"), []byte(ctxJSON), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("XDG_CONFIG_HOME", ctxDir)
	urlWithPw := "nats://alice:" + pw + "@" + host
	cases := [][]string{
		{"dlq", "ls", "--server", urlWithPw},
		{"dlq", "ls", "--server", "nats://alice:" + pw + "@127.0.0.1:1"},
		{"dlq", "ls", "--server", "http://alice:" + pw + "@127.0.0.1:1"},
		{"dlq", "ls", "--server", s.url, "--user", "alice", "--password", pw + "x"},
		{"dlq", "ls", "--server", s.url, "--user", "alice", "--password", pw, "--stream", "NOPE"},
		{"dlq", "ls", "--server", s.url, "--user", "alice", "--password", pw, "--filter", "colour=red"},
		{"dlq", "show", "99", "--server", urlWithPw},
		{"dlq", "replay", "--server", urlWithPw},
		{"dlq", "replay", "--server", urlWithPw, "--to", "$JS.API.X"},
		{"dlq", "purge", "--server", urlWithPw},
		{"dlq", "ls", "--context", "prod", "--stream", "NOPE"},
		{"dlq", "ls", "--context", "prod", "--password", pw + "y"},
		{"dlq", "ls", "--context", "missing"},
		{"dlq", "ls", "--server", s.url, "--token", pw, "--user", "alice"},
		{"dlq", "ls", "--password", pw, "--server", s.url},
		{"dlq", "ls", "-b", "127.0.0.1:1", "--topic", "x", "-X", "security.protocol=SASL_PLAINTEXT", "-X", "sasl.username=u", "-X", "sasl.password=" + pw},
		{"dlq", "ls", "-b", "127.0.0.1:1", "--topic", "x", "-X", "sasl.password=" + pw},
		{"dlq", "ls", "-b", "127.0.0.1:1", "--topic", "x", "-X", "sasl.passwd=" + pw},
	}
	for _, args := range cases {
		out, errOut, code := run(t, args...)
		if strings.Contains(out+errOut, pw) {
			t.Errorf("%v (exit %d) printed the secret:\n%s%s", args, code, out, errOut)
		}
	}
	// The environment and the context work, and still print nothing secret.
	t.Setenv("NATS_URL", s.url)
	t.Setenv("NATS_USER", "alice")
	t.Setenv("NATS_PASSWORD", pw)
	out, errOut, code := run(t, "dlq", "ls")
	if code != 0 || !strings.Contains(out, "5 letters") || strings.Contains(out+errOut, pw) {
		t.Fatalf("NATS_USER/NATS_PASSWORD: %d %q %q", code, out, errOut)
	}
	t.Setenv("NATS_URL", "")
	t.Setenv("NATS_USER", "")
	t.Setenv("NATS_PASSWORD", "")
	out, errOut, code = run(t, "dlq", "ls", "--context", "prod")
	if code != 0 || !strings.Contains(out, "5 letters") {
		t.Fatalf("--context prod: %d %q %q", code, out, errOut)
	}
	// The selected context (nats context select) is used without --context.
	if err := os.WriteFile(filepath.Join(ctxDir, "nats", "context.txt"), []byte("prod\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, errOut, code = run(t, "dlq", "ls")
	if code != 0 || !strings.Contains(out, "5 letters") {
		t.Fatalf("selected context: %d %q %q", code, out, errOut)
	}
}

// TestNATSConnectionOptions: --tlsfirst against a server that wants the
// TLS handshake first, --js-domain, --js-api-prefix and --inbox-prefix.
func TestNATSConnectionOptions(t *testing.T) {
	f := makeTLS(t)
	cfg, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: f.serverCert, KeyFile: f.serverKey, CaFile: f.ca})
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, &server.Options{TLS: true, TLSConfig: cfg, TLSTimeout: 5, TLSHandshakeFirst: true, JetStreamDomain: "hub"})
	url := "tls://" + strings.TrimPrefix(strings.TrimPrefix(s.ClientURL(), "nats://"), "tls://")
	sn := &secureNATS{url: url, admin: []nats.Option{nats.RootCAs(f.ca), nats.TLSHandshakeFirst()}}
	sn.seed(t)
	base := []string{"--server", url, "--tlsca", f.ca}
	out, errOut, code := run(t, append([]string{"dlq", "ls", "--tlsfirst", "--js-domain", "hub", "--inbox-prefix", "_INBOX_ops"}, base...)...)
	if code != 0 || !strings.Contains(out, "5 letters") {
		t.Fatalf("--tlsfirst --js-domain: %d %q %q", code, out, errOut)
	}
	out, errOut, code = run(t, append([]string{"dlq", "ls", "--tlsfirst", "--js-api-prefix", "$JS.hub.API"}, base...)...)
	if code != 0 || !strings.Contains(out, "5 letters") {
		t.Fatalf("--js-api-prefix: %d %q %q", code, out, errOut)
	}
	_, errOut, code = run(t, append([]string{"dlq", "ls", "--timeout", "1s"}, base...)...)
	if code != exitError || !strings.Contains(errOut, "cannot connect to NATS") {
		t.Fatalf("without --tlsfirst: %d %q", code, errOut)
	}
	_, errOut, code = run(t, append([]string{"dlq", "ls", "--tlsfirst", "--js-domain", "nowhere", "--timeout", "1s"}, base...)...)
	if code != exitError || !strings.Contains(errOut, "--js-domain") {
		t.Fatalf("wrong domain: %d %q", code, errOut)
	}
}
