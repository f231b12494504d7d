package main

import (
	"context"
	"crypto/tls"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kfake"

	kafkaadapter "github.com/sluice-go/sluice/adapters/kafka"
	"github.com/sluice-go/sluice/adapters/kafka/kafkatest"
	"github.com/sluice-go/sluice/dlq"
)

// secureKafka is a Kafka listener that demands TLS or SASL, with the CLI
// properties that reach it and the adapter's settings for seeding.
type secureKafka struct {
	cluster *kafkaadapter.Cluster
	props   []string // -X key=value
	wrong   []string // the same with a wrong password ("" when TLS only)
	secret  string
}

// startSecureKafka starts kfake with TLS (a CA made in the test) or a SASL
// user; with $KAFKA_BROKERS set (the real broker of .ci/kafka-suite) it
// uses the script's TLS or SASL listener instead, or skips.
func startSecureKafka(t *testing.T, mech string) *secureKafka {
	t.Helper()
	const user, pass = "sluice", "sluice-secret-pw"
	if os.Getenv(kafkatest.EnvBrokers) != "" {
		return realSecureKafka(t, mech)
	}
	var opts []kfake.Opt
	s := &secureKafka{cluster: &kafkaadapter.Cluster{}}
	if mech == "" {
		f := makeTLS(t)
		pair, err := tls.LoadX509KeyPair(f.serverCert, f.serverKey)
		if err != nil {
			t.Fatal(err)
		}
		opts = append(opts, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}))
		props := []string{"security.protocol=SSL", "ssl.ca.location=" + f.ca}
		cfg, err := kafkaTLS(map[string]string{"ssl.ca.location": f.ca})
		if err != nil {
			t.Fatal(err)
		}
		s.cluster.TLS, s.props = cfg, props
	} else {
		opts = append(opts, kfake.EnableSASL(), kfake.Superuser(mech, user, pass))
		m, err := saslMechanism(mech, user, pass)
		if err != nil {
			t.Fatal(err)
		}
		s.cluster.SASL, s.secret = m, pass
		base := []string{"security.protocol=SASL_PLAINTEXT", "sasl.mechanism=" + mech, "sasl.username=" + user}
		s.props = append(base, "sasl.password="+pass)
		s.wrong = append(base, "sasl.password=wrong-"+pass)
	}
	fake, err := kfake.NewCluster(append(opts, kfake.NumBrokers(1), kfake.Ports(0))...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fake.Close)
	s.cluster.Brokers = fake.ListenAddrs()
	return s
}

func realSecureKafka(t *testing.T, mech string) *secureKafka {
	s := &secureKafka{cluster: &kafkaadapter.Cluster{}}
	env := kafkatest.EnvTLSBrokers
	if mech == "" {
		ca := os.Getenv(kafkatest.EnvTLSCA)
		cfg, err := kafkaTLS(map[string]string{"ssl.ca.location": ca})
		if err != nil || os.Getenv(env) == "" {
			t.Skipf("the real broker has no TLS listener (%s, %s)", env, kafkatest.EnvTLSCA)
		}
		s.cluster.TLS, s.props = cfg, []string{"security.protocol=SSL", "ssl.ca.location=" + ca}
	} else {
		env = kafkatest.EnvSASLBrokers
		if os.Getenv(env) == "" || !strings.Contains(","+os.Getenv(kafkatest.EnvSASLMechanisms)+",", ","+mech+",") {
			t.Skipf("the real broker offers no SASL %s", mech)
		}
		user, pass := os.Getenv(kafkatest.EnvSASLUser), os.Getenv(kafkatest.EnvSASLPassword)
		m, err := saslMechanism(mech, user, pass)
		if err != nil {
			t.Fatal(err)
		}
		s.cluster.SASL, s.secret = m, pass
		base := []string{"security.protocol=SASL_PLAINTEXT", "sasl.mechanism=" + mech, "sasl.username=" + user}
		s.props = append(base, "sasl.password="+pass)
		s.wrong = append(base, "sasl.password=wrong-"+pass)
	}
	s.cluster.Brokers = strings.Split(os.Getenv(env), ",")
	return s
}

// seed creates the dead-letter, origin and park topics and writes two
// letters through the real sink.
func (s *secureKafka) seed(t *testing.T) kafkaTopics {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	k := kafkaTopics{dlq: kafkatest.UniqueName("dlq"), orders: kafkatest.UniqueName("orders")}
	tr := &kafka.Transport{TLS: s.cluster.TLS, SASL: s.cluster.SASL}
	defer tr.CloseIdleConnections()
	client := &kafka.Client{Addr: kafka.TCP(s.cluster.Brokers...), Transport: tr}
	for _, topic := range []string{k.dlq, k.orders, k.dlq + ".parked"} {
		res, err := client.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: []kafka.TopicConfig{{Topic: topic, NumPartitions: 1, ReplicationFactor: 1}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := res.Errors[topic]; err != nil && !errors.Is(err, kafka.TopicAlreadyExists) {
			t.Fatal(err)
		}
	}
	sink, err := kafkaadapter.NewDeadLetterSink(s.cluster, k.dlq)
	if err != nil {
		t.Fatal(err)
	}
	defer sink.Close()
	for i := range 2 {
		l := &dlq.Letter{Key: []byte{'a' + byte(i)}, Value: []byte("order"), Route: "orders", Class: dlq.ClassPermanent, Err: "bad",
			Origin: dlq.Origin{Topic: k.orders, Partition: 0, Offset: int64(i)}}
		for try := 0; ; try++ { // a fresh topic may need a moment for its leader
			if err = sink.Write(ctx, l); err == nil || try == 20 {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	return k
}

// TestKafkaSecuredClusters (issue 18): ls, show, replay and purge work
// over TLS and SASL PLAIN / SCRAM-SHA-256 / SCRAM-SHA-512 with -X and -F;
// a wrong password gives one clear line, exit 1, and no output holds the
// password. On kfake in go test, on the real broker's TLS and SASL
// listeners in .ci/kafka-suite.
func TestKafkaSecuredClusters(t *testing.T) {
	for _, mech := range []string{"", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"} {
		name := mech
		if name == "" {
			name = "TLS"
		}
		t.Run(name, func(t *testing.T) {
			s := startSecureKafka(t, mech)
			k := s.seed(t)
			var outputs []string
			conn := []string{"-b", strings.Join(s.cluster.Brokers, ","), "--topic", k.dlq}
			for i, p := range s.props {
				if i == 0 {
					// The first property from a file, as kcat -F does.
					conn = append(conn, "-F", writeFile(t, "client.properties", []byte("# from the test\n"+p+"\n")))
					continue
				}
				conn = append(conn, "-X", p)
			}
			cli := func(args ...string) (string, string, int) {
				out, errOut, code := run(t, append(args, conn...)...)
				outputs = append(outputs, out, errOut)
				return out, errOut, code
			}
			if out, errOut, code := cli("dlq", "ls"); code != 0 || !strings.Contains(out, ": 2 letters") {
				t.Fatalf("ls: %d %q %q", code, out, errOut)
			}
			if out, errOut, code := cli("dlq", "show", "0/1"); code != 0 || !strings.Contains(out, "class:          permanent") {
				t.Fatalf("show: %d %q %q", code, out, errOut)
			}
			if _, errOut, code := cli("dlq", "show", "0/99999"); code != exitError || !strings.Contains(errOut, "no letter 0/99999") {
				t.Fatalf("show past the end: %d %q", code, errOut)
			}
			if _, errOut, code := cli("dlq", "show", "7/0"); code != exitError || !strings.Contains(errOut, "no letter 7/0") {
				t.Fatalf("show of a missing partition: %d %q", code, errOut)
			}
			if out, errOut, code := cli("dlq", "replay", "--allow", k.orders, "--rate", "inf", "--max", "1"); code != 0 || !strings.HasPrefix(out, "replayed 1") {
				t.Fatalf("replay: %d %q %q", code, out, errOut)
			}
			if out, errOut, code := cli("dlq", "purge", "--yes", "--upto", "end"); code != 0 || !strings.Contains(out, "purged 1 letters") {
				t.Fatalf("purge: %d %q %q", code, out, errOut)
			}
			if len(s.wrong) > 0 {
				args := []string{"dlq", "ls", "-b", strings.Join(s.cluster.Brokers, ","), "--topic", k.dlq}
				for _, p := range s.wrong {
					args = append(args, "-X", p)
				}
				_, errOut, code := run(t, args...)
				outputs = append(outputs, errOut)
				if code != exitError || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "refused the credentials") {
					t.Fatalf("wrong password: exit %d, stderr %q", code, errOut)
				}
				t.Logf("wrong password: %s", strings.TrimSpace(errOut))
			}
			for _, o := range outputs {
				if s.secret != "" && strings.Contains(o, s.secret) {
					t.Fatalf("output holds the password:\n%s", o)
				}
			}
		})
	}
}
