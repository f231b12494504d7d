package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/segmentio/kafka-go/sasl"
	"github.com/segmentio/kafka-go/sasl/plain"
	"github.com/segmentio/kafka-go/sasl/scram"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
)

// kafkaProperties are the librdkafka / Java client property names sluice
// reads from -X and -F.
var kafkaProperties = []string{
	"bootstrap.servers", "metadata.broker.list", "security.protocol", "sasl.mechanism", "sasl.mechanisms",
	"sasl.username", "sasl.password", "ssl.ca.location", "ssl.certificate.location", "ssl.key.location",
	"ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification", "client.id",
	"socket.connection.setup.timeout.ms",
}

// kafkaHints answer properties people reach for that sluice does not read.
var kafkaHints = map[string]string{
	"ssl.truststore.location":    "Java key stores are not read: give the CA as PEM with ssl.ca.location",
	"ssl.keystore.location":      "Java key stores are not read: give ssl.certificate.location and ssl.key.location (PEM)",
	"ssl.key.password":           "encrypted keys are not read: decrypt the key (openssl pkey -in key.pem -out plain.pem)",
	"sasl.jaas.config":           "give sasl.username and sasl.password instead of a JAAS config",
	"sasl.kerberos.service.name": "GSSAPI (Kerberos) is not supported: PLAIN, SCRAM-SHA-256 and SCRAM-SHA-512 are",
}

// kafkaCluster builds the Kafka connection from --brokers, -F and -X.
func (f *connFlags) kafkaCluster() (*kafkaadapter.Cluster, error) {
	props := map[string]string{}
	set := func(where, kv string) error {
		k, v, ok := strings.Cut(kv, "=")
		k = strings.TrimSpace(k)
		if !ok || k == "" {
			return usageError{fmt.Errorf("%s %q: want key=value", where, kv)}
		}
		if hint, ok := kafkaHints[k]; ok {
			return usageError{fmt.Errorf("%s: property %q: %s", where, k, hint)}
		}
		if !slices.Contains(kafkaProperties, k) {
			return usageError{fmt.Errorf("%s: unknown property %q (sluice reads %s)", where, k, strings.Join(kafkaProperties, ", "))}
		}
		props[k] = strings.TrimSpace(v)
		if k == "sasl.password" {
			f.secrets.add(props[k])
		}
		return nil
	}
	if f.propFile != "" {
		file, err := os.Open(f.propFile)
		if err != nil {
			return nil, fmt.Errorf("-F: %w", err)
		}
		sc := bufio.NewScanner(file)
		for n := 1; sc.Scan(); n++ {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, "!") {
				continue
			}
			if err := set(fmt.Sprintf("-F %s:%d", f.propFile, n), line); err != nil {
				file.Close()
				return nil, err
			}
		}
		file.Close()
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("-F %s: %w", f.propFile, err)
		}
	}
	for _, kv := range f.props {
		if err := set("-X", kv); err != nil {
			return nil, err
		}
	}
	get := func(keys ...string) string {
		for _, k := range keys {
			if v := props[k]; v != "" {
				return v
			}
		}
		return ""
	}
	list := f.brokers
	if list == "" {
		list = get("bootstrap.servers", "metadata.broker.list")
	}
	var brokers []string
	for _, b := range strings.Split(list, ",") {
		if b = strings.TrimSpace(b); b != "" {
			brokers = append(brokers, b)
		}
	}
	if len(brokers) == 0 {
		return nil, usageError{errors.New("Kafka needs --brokers host:port (or -X bootstrap.servers=...)")}
	}
	c := &kafkaadapter.Cluster{Brokers: brokers, ClientID: get("client.id")}
	if ms := get("socket.connection.setup.timeout.ms"); ms != "" {
		n, err := strconv.Atoi(ms)
		if err != nil || n <= 0 {
			return nil, usageError{fmt.Errorf("socket.connection.setup.timeout.ms %q: want milliseconds", ms)}
		}
		c.DialTimeout = time.Duration(n) * time.Millisecond
	}
	proto := strings.ToUpper(get("security.protocol"))
	if proto == "" {
		proto = "PLAINTEXT"
	}
	useTLS, useSASL := false, false
	switch proto {
	case "PLAINTEXT":
	case "SSL":
		useTLS = true
	case "SASL_PLAINTEXT":
		useSASL = true
	case "SASL_SSL":
		useTLS, useSASL = true, true
	default:
		return nil, usageError{fmt.Errorf("security.protocol %q: want PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL", get("security.protocol"))}
	}
	mech := strings.ToUpper(get("sasl.mechanism", "sasl.mechanisms"))
	user, pass := get("sasl.username"), get("sasl.password")
	switch {
	case !useSASL && (mech != "" || user != "" || pass != ""):
		return nil, usageError{fmt.Errorf("sasl.* properties given but security.protocol is %s: use SASL_PLAINTEXT or SASL_SSL", proto)}
	case useSASL:
		if user == "" || pass == "" {
			return nil, usageError{fmt.Errorf("security.protocol %s needs sasl.username and sasl.password", proto)}
		}
		m, err := saslMechanism(mech, user, pass)
		if err != nil {
			return nil, err
		}
		c.SASL = m
	}
	tlsProps := get("ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.endpoint.identification.algorithm", "enable.ssl.certificate.verification")
	switch {
	case !useTLS && tlsProps != "":
		return nil, usageError{fmt.Errorf("ssl.* properties given but security.protocol is %s: use SSL or SASL_SSL", proto)}
	case useTLS:
		cfg, err := kafkaTLS(props)
		if err != nil {
			return nil, err
		}
		c.TLS = cfg
	}
	return c, nil
}

func saslMechanism(mech, user, pass string) (sasl.Mechanism, error) {
	switch mech {
	case "", "PLAIN":
		return plain.Mechanism{Username: user, Password: pass}, nil
	case "SCRAM-SHA-256", "SCRAM-SHA-512":
		algo := scram.SHA256
		if mech == "SCRAM-SHA-512" {
			algo = scram.SHA512
		}
		m, err := scram.Mechanism(algo, user, pass)
		if err != nil {
			return nil, fmt.Errorf("sasl.mechanism %s: %w", mech, err)
		}
		return m, nil
	}
	return nil, usageError{fmt.Errorf("sasl.mechanism %q: want PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", mech)}
}

func kafkaTLS(props map[string]string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca := props["ssl.ca.location"]; ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, fmt.Errorf("ssl.ca.location: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("ssl.ca.location %s: no PEM certificate in it", ca)
		}
		cfg.RootCAs = pool
	}
	cert, key := props["ssl.certificate.location"], props["ssl.key.location"]
	switch {
	case (cert == "") != (key == ""):
		return nil, usageError{errors.New("ssl.certificate.location and ssl.key.location go together")}
	case cert != "":
		pair, err := tls.LoadX509KeyPair(cert, key)
		if err != nil {
			return nil, fmt.Errorf("ssl.certificate.location/ssl.key.location: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	switch v := strings.ToLower(props["enable.ssl.certificate.verification"]); v {
	case "", "true":
	case "false":
		cfg.InsecureSkipVerify = true
	default:
		return nil, usageError{fmt.Errorf("enable.ssl.certificate.verification %q: want true or false", v)}
	}
	switch v := strings.ToLower(props["ssl.endpoint.identification.algorithm"]); v {
	case "", "https":
	case "none":
		// Verify the chain, not the host name.
		roots := cfg.RootCAs
		cfg.InsecureSkipVerify = true
		cfg.VerifyPeerCertificate = func(raw [][]byte, _ [][]*x509.Certificate) error {
			certs := make([]*x509.Certificate, len(raw))
			for i, r := range raw {
				c, err := x509.ParseCertificate(r)
				if err != nil {
					return err
				}
				certs[i] = c
			}
			if len(certs) == 0 {
				return errors.New("no server certificate")
			}
			inter := x509.NewCertPool()
			for _, c := range certs[1:] {
				inter.AddCert(c)
			}
			_, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter})
			return err
		}
	default:
		return nil, usageError{fmt.Errorf("ssl.endpoint.identification.algorithm %q: want https or none", v)}
	}
	return cfg, nil
}
