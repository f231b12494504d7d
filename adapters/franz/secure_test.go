package franzadapter_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"

	franzadapter "github.com/sluice-go/sluice/adapters/franz"
	"github.com/sluice-go/sluice/consumer"
)

// The user's TLS and SASL options reach every connection the Source makes
// (group, fetches, commits, retry writes): a Source on a TLS listener and
// on SASL PLAIN and SCRAM listeners consumes, commits and writes a retry.
// On kfake with a certificate made here; on the real broker of
// .ci/kafka-suite, its TLS and SASL listeners ($KAFKA_TLS_*, $KAFKA_SASL_*).
func TestSecureClusters(t *testing.T) {
	for _, c := range []struct {
		name string
		tls  bool
		sasl string
	}{{"tls", true, ""}, {"sasl-plain", false, "PLAIN"}, {"sasl-scram-sha-256", false, "SCRAM-SHA-256"}, {"sasl-scram-sha-512", false, "SCRAM-SHA-512"}} {
		t.Run(c.name, func(t *testing.T) {
			opts := secureCluster(t, c.tls, c.sasl)
			admin := func(extra ...kgo.Opt) *kgo.Client {
				cl, err := kgo.NewClient(append(append([]kgo.Opt{}, opts...), extra...)...)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(cl.Close)
				return cl
			}
			topic, retry := uniqueName("secure"), uniqueName("secure-retry")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			prod := admin(kgo.AllowAutoTopicCreation())
			for _, tp := range []string{topic, retry} {
				if err := prod.ProduceSync(ctx, &kgo.Record{Topic: tp, Key: []byte("k"), Value: []byte("warm")}).FirstErr(); err != nil {
					t.Fatalf("produce to %s: %v", tp, err)
				}
			}
			src, err := franzadapter.NewSource(franzadapter.Config{RetryTopic: retry, LocalRetryMaxDelay: time.Millisecond},
				append(opts, kgo.ConsumerGroup(uniqueName("secure")), kgo.ConsumeTopics(topic),
					kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.SessionTimeout(6*time.Second))...)
			if err != nil {
				t.Fatal(err)
			}
			defer src.Close()
			if _, err := src.Attach(consumer.RouteLimits{Route: "secure", Messages: 10, Bytes: 1 << 20, MaxDelay: time.Second}); err != nil {
				t.Fatal(err)
			}
			// Two records from the retry topic's warm-up and the topic's: the
			// warm-up retry record has no retry headers and is due at once.
			var got []*consumer.Message
			for len(got) < 2 && ctx.Err() == nil {
				ms, err := src.Fetch(ctx, 10, 1<<20)
				if err != nil && ctx.Err() == nil {
					t.Fatal(err)
				}
				got = append(got, ms...)
			}
			for _, m := range got {
				op := consumer.SettleAck
				if m.Topic == topic {
					op = consumer.SettleNak // through the retry topic (a write on the secured listener)
				}
				settle(t, m, op, 100*time.Millisecond)
			}
			m := fetchN(t, src, 1, 30*time.Second)[0]
			if m.Attempt != 2 || m.Topic != topic {
				t.Fatalf("retry came back as attempt %d of %s", m.Attempt, m.Topic)
			}
			settle(t, m, consumer.SettleAck, 0)
			if st := src.Stats(); st.RetryWrites != 1 {
				t.Fatalf("retry writes %d", st.RetryWrites)
			}
		})
	}
}

// secureCluster returns the kgo options of a secured cluster: kfake with
// TLS or SASL, or the real broker's listener from the environment (the
// test skips when it has none).
func secureCluster(t *testing.T, useTLS bool, mech string) []kgo.Opt {
	t.Helper()
	const user, pass = "sluice", "sluice-secret"
	var opts []kgo.Opt
	if strings.TrimSpace(os.Getenv("KAFKA_BROKERS")) != "" {
		env := "KAFKA_BROKERS"
		if useTLS {
			env = "KAFKA_TLS_BROKERS"
			pem, err := os.ReadFile(os.Getenv("KAFKA_TLS_CA"))
			if err != nil {
				t.Skipf("no TLS listener: KAFKA_TLS_CA: %v", err)
			}
			pool := x509.NewCertPool()
			pool.AppendCertsFromPEM(pem)
			opts = append(opts, kgo.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
		}
		if mech != "" {
			env = "KAFKA_SASL_BROKERS"
			if !strings.Contains(","+os.Getenv("KAFKA_SASL_MECHANISMS")+",", ","+mech+",") {
				t.Skipf("the broker offers no SASL %s", mech)
			}
			opts = append(opts, kgo.SASL(mechanism(t, mech, os.Getenv("KAFKA_SASL_USER"), os.Getenv("KAFKA_SASL_PASSWORD"))))
		}
		if os.Getenv(env) == "" {
			t.Skipf("$%s is not set", env)
		}
		return append(opts, kgo.SeedBrokers(strings.Split(os.Getenv(env), ",")...))
	}
	var fopts []kfake.Opt
	if useTLS {
		server, pool := selfSigned(t)
		fopts = append(fopts, kfake.TLS(server))
		opts = append(opts, kgo.DialTLSConfig(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}))
	}
	if mech != "" {
		fopts = append(fopts, kfake.EnableSASL(), kfake.Superuser(mech, user, pass))
		opts = append(opts, kgo.SASL(mechanism(t, mech, user, pass)))
	}
	fake, err := kfake.NewCluster(append(fopts, kfake.NumBrokers(1), kfake.Ports(0), kfake.AllowAutoTopicCreation())...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	return append(opts, kgo.SeedBrokers(fake.ListenAddrs()...))
}

func mechanism(t *testing.T, name, user, pass string) sasl.Mechanism {
	switch name {
	case "PLAIN":
		return plain.Auth{User: user, Pass: pass}.AsMechanism()
	case "SCRAM-SHA-256":
		return scram.Auth{User: user, Pass: pass}.AsSha256Mechanism()
	case "SCRAM-SHA-512":
		return scram.Auth{User: user, Pass: pass}.AsSha512Mechanism()
	}
	t.Fatalf("unknown SASL mechanism %q", name)
	return nil
}

// selfSigned makes a CA and a certificate it signs for 127.0.0.1 and
// localhost: the server's TLS config and a pool with the CA.
func selfSigned(t *testing.T) (*tls.Config, *x509.CertPool) {
	t.Helper()
	must := func(err error) {
		if err != nil {
			t.Fatal(err)
		}
	}
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	must(err)
	caCert, err := x509.ParseCertificate(caDER)
	must(err)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	must(err)
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der, caDER}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}, pool
}
