package kafkatest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"
	"github.com/twmb/franz-go/pkg/kfake"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
)

// Environment of a real broker's secured listeners, as printed by
// `scripts/kafka start --tls --sasl plain,scram`.
const (
	EnvTLSBrokers     = "KAFKA_TLS_BROKERS"     // host:port of the SSL listener
	EnvTLSCA          = "KAFKA_TLS_CA"          // PEM file of the CA that signed the broker
	EnvSASLBrokers    = "KAFKA_SASL_BROKERS"    // host:port of the SASL_PLAINTEXT listener
	EnvSASLMechanisms = "KAFKA_SASL_MECHANISMS" // e.g. PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
	EnvSASLUser       = "KAFKA_SASL_USER"
	EnvSASLPassword   = "KAFKA_SASL_PASSWORD"
)

// Security asks for a secured cluster.
type Security struct {
	// TLS: the listener speaks TLS, signed by a CA the client trusts.
	TLS bool
	// SASL is the mechanism ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"),
	// "" for none.
	SASL string
}

// StartSecure returns a cluster with the asked security for tb: an
// in-process kfake cluster with a CA and certificate made here with
// crypto/x509 (and a SASL user), or, when $KAFKA_BROKERS names a real
// broker, its listener from the environment above. It skips tb when the
// real broker has no such listener. Kafka() of the result carries the
// client side: the CA pool and the SASL mechanism.
func StartSecure(tb testing.TB, sec Security) *Cluster {
	tb.Helper()
	if strings.TrimSpace(os.Getenv(EnvBrokers)) != "" {
		c, err := realSecure(sec)
		if err != nil {
			tb.Skip(err)
		}
		tb.Cleanup(c.Close)
		return c
	}
	var opts []kfake.Opt
	c := &Cluster{}
	c.kafka = &kafkaadapter.Cluster{}
	if sec.TLS {
		server, pool, err := selfSigned()
		if err != nil {
			tb.Fatal(err)
		}
		opts = append(opts, kfake.TLS(server))
		c.kafka.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if sec.SASL != "" {
		const user, pass = "sluice", "sluice-secret"
		opts = append(opts, kfake.EnableSASL(), kfake.Superuser(sec.SASL, user, pass))
		m, err := Mechanism(sec.SASL, user, pass)
		if err != nil {
			tb.Fatal(err)
		}
		c.kafka.SASL = m
	}
	fake, err := kfake.NewCluster(append(opts, kfake.NumBrokers(1), kfake.Ports(0))...)
	if err != nil {
		tb.Fatalf("kafkatest: start kfake: %v", err)
	}
	c.Fake, c.owned, c.Brokers = fake, true, fake.ListenAddrs()
	c.kafka.Brokers = c.Brokers
	tb.Cleanup(c.Close)
	return c
}

func realSecure(sec Security) (*Cluster, error) {
	c := &Cluster{kafka: &kafkaadapter.Cluster{}}
	env := EnvBrokers
	if sec.TLS {
		env = EnvTLSBrokers
		pem, err := os.ReadFile(os.Getenv(EnvTLSCA))
		if err != nil {
			return nil, fmt.Errorf("kafkatest: no TLS listener: %s: %w", EnvTLSCA, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kafkatest: %s holds no certificate", EnvTLSCA)
		}
		c.kafka.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	if sec.SASL != "" {
		if sec.TLS {
			return nil, errors.New("kafkatest: the script's broker has no SASL_SSL listener")
		}
		env = EnvSASLBrokers
		if !strings.Contains(","+os.Getenv(EnvSASLMechanisms)+",", ","+sec.SASL+",") {
			return nil, fmt.Errorf("kafkatest: the broker does not offer SASL %s (%s=%q)", sec.SASL, EnvSASLMechanisms, os.Getenv(EnvSASLMechanisms))
		}
		m, err := Mechanism(sec.SASL, os.Getenv(EnvSASLUser), os.Getenv(EnvSASLPassword))
		if err != nil {
			return nil, err
		}
		c.kafka.SASL = m
	}
	for _, b := range strings.Split(os.Getenv(env), ",") {
		if b = strings.TrimSpace(b); b != "" {
			c.Brokers = append(c.Brokers, b)
		}
	}
	if len(c.Brokers) == 0 {
		return nil, fmt.Errorf("kafkatest: $%s is not set: the broker has no such listener", env)
	}
	c.kafka.Brokers = c.Brokers
	return c, nil
}

// Mechanism returns kafka-go's SASL mechanism by its Kafka name.
func Mechanism(name, user, pass string) (sasl.Mechanism, error) {
	switch name {
	case "PLAIN":
		return plain.Mechanism{Username: user, Password: pass}, nil
	case "SCRAM-SHA-256":
		return scram.Mechanism(scram.SHA256, user, pass)
	case "SCRAM-SHA-512":
		return scram.Mechanism(scram.SHA512, user, pass)
	}
	return nil, fmt.Errorf("kafkatest: unknown SASL mechanism %q", name)
}

// selfSigned makes a CA and a certificate it signs for 127.0.0.1 and
// localhost, and returns the server's TLS config and a pool with the CA.
func selfSigned() (*tls.Config, *x509.CertPool, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	now := time.Now()
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, err
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, nil, err
	}
	pool := x509.NewCertPool()
	pool.AddCert(caCert)
	server := &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der, caDER}, PrivateKey: key}},
		MinVersion:   tls.VersionTLS12,
	}
	return server, pool, nil
}
