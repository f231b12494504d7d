package natsadapter_test

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	natsadapter "github.com/sluice-go/sluice/adapters/nats"
	"github.com/sluice-go/sluice/adapters/nats/natstest"
	"github.com/sluice-go/sluice/dlq"
)

// replyDropper is a TCP proxy between a client and a NATS server that,
// once armed, drops the next message the server sends to an _INBOX
// subject: a PubAck lost on the way back, after the stream stored the
// message.
type replyDropper struct {
	ln      net.Listener
	target  string
	armed   atomic.Bool
	dropped atomic.Int64
	wg      sync.WaitGroup
	mu      sync.Mutex
	conns   []net.Conn
}

func startReplyDropper(t *testing.T, serverURL string) *replyDropper {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &replyDropper{ln: ln, target: strings.TrimPrefix(serverURL, "nats://")}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *replyDropper) url() string { return "nats://" + p.ln.Addr().String() }

func (p *replyDropper) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		p.wg.Go(func() { _, _ = io.Copy(s, c); _ = s.Close() })
		p.wg.Go(func() { p.filter(c, s); _ = c.Close() })
	}
}

// filter copies server → client protocol, dropping one _INBOX delivery
// when armed.
func (p *replyDropper) filter(client io.Writer, server io.Reader) {
	r := bufio.NewReader(server)
	for {
		line, err := r.ReadBytes('\n')
		if err != nil {
			return
		}
		var payload []byte
		if bytes.HasPrefix(line, []byte("MSG ")) || bytes.HasPrefix(line, []byte("HMSG ")) {
			f := strings.Fields(string(line))
			size, _ := strconv.Atoi(f[len(f)-1])
			payload = make([]byte, size+2)
			if _, err := io.ReadFull(r, payload); err != nil {
				return
			}
			if strings.HasPrefix(f[1], "_INBOX.") && p.armed.CompareAndSwap(true, false) {
				p.dropped.Add(1)
				continue
			}
		}
		if _, err := client.Write(append(line, payload...)); err != nil {
			return
		}
	}
}

// TestDeadLetterWriteRetriedAfterLostPubAckStoredOnce (issue 12.5): the
// first write of a letter is stored but its PubAck is lost, so Write
// fails and the message is redelivered (one more attempt); the second
// write of the same message's letter is dropped by the server as a
// duplicate: one letter, not two.
func TestDeadLetterWriteRetriedAfterLostPubAckStoredOnce(t *testing.T) {
	_, url := natstest.Start(t)
	proxy := startReplyDropper(t, url)
	nc, err := nats.Connect(proxy.url())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l := &dlq.Letter{Value: []byte("poison"), Route: "orders", Class: dlq.ClassExhausted, Err: "boom", Attempts: 2,
		Origin: dlq.Origin{Topic: "orders.new", Stream: "ORDERS", Sequence: 42, Group: "orders", Partition: -1}}

	proxy.armed.Store(true)
	wctx, wcancel := context.WithTimeout(ctx, time.Second)
	err = sink.Write(wctx, l)
	wcancel()
	if err == nil || proxy.dropped.Load() != 1 {
		t.Fatalf("first write: err %v, %d replies dropped; want a failure from the lost PubAck", err, proxy.dropped.Load())
	}
	// The redelivery: one attempt more, the same message.
	again := *l
	again.Attempts = 3
	if err := sink.Write(ctx, &again); err != nil {
		t.Fatal(err)
	}
	// A different message of the same route and stream is a letter of its own.
	other := *l
	other.Origin.Sequence = 43
	if err := sink.Write(ctx, &other); err != nil {
		t.Fatal(err)
	}
	st, _ := js.Stream(ctx, natsadapter.DefaultDLQStream)
	info, _ := st.Info(ctx)
	if info.State.Msgs != 2 {
		t.Fatalf("the DLQ holds %d letters, want 2 (the retried write stored once, plus the other message)", info.State.Msgs)
	}
}

// TestDedupIDStable: the id ignores what changes between retries and
// tells messages, groups and routes apart.
func TestDedupIDStable(t *testing.T) {
	base := dlq.Letter{Route: "r", Attempts: 1, Err: "a", Origin: dlq.Origin{Stream: "S", Sequence: 5, Group: "g", Partition: -1}}
	retry := base
	retry.Attempts, retry.Err = 4, "b"
	if natsadapter.DedupID(&base) != natsadapter.DedupID(&retry) {
		t.Fatal("retry changes the id")
	}
	for _, edit := range []func(*dlq.Letter){
		func(l *dlq.Letter) { l.Origin.Sequence = 6 },
		func(l *dlq.Letter) { l.Origin.Group = "h" },
		func(l *dlq.Letter) { l.Route = "q" },
		func(l *dlq.Letter) { l.Origin.Stream = "T" },
	} {
		o := base
		edit(&o)
		if natsadapter.DedupID(&o) == natsadapter.DedupID(&base) {
			t.Errorf("%+v shares the id of %+v", o, base)
		}
	}
	kafka := dlq.Letter{Origin: dlq.Origin{Topic: "t", Partition: 0, Offset: 7}}
	if id := natsadapter.DedupID(&kafka); !strings.Contains(id, "t/0@7") {
		t.Fatalf("kafka origin id %q", id)
	}
	if id := natsadapter.DedupID(&dlq.Letter{Origin: dlq.Origin{Partition: -1}}); id != "" {
		t.Fatalf("no origin: id %q, want none (no dedup rather than false duplicates)", id)
	}
}

// TestDeadLetterOfHeadersAtTheLimit (issue 13.5): a message whose headers
// are just under JetStream's 64 KiB header limit is stored in its origin
// stream; its letter is stored too (the headers move into the value), and
// reads back whole.
func TestDeadLetterOfHeadersAtTheLimit(t *testing.T) {
	js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "ORDERS", Subjects: []string{"orders.>"}}); err != nil {
		t.Fatal(err)
	}
	// Just under the limit as the server counts it.
	big := strings.Repeat("h", 65535-len("NATS/1.0\r\n\r\n")-len("X-Big: \r\n")-len("App: a\r\n")-8)
	orig := &nats.Msg{Subject: "orders.new", Data: []byte("payload"), Header: nats.Header{"X-Big": {big}, "App": {"a"}}}
	ack, err := js.PublishMsg(ctx, orig)
	if err != nil {
		t.Fatalf("the original does not fit its own stream: %v", err)
	}
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	l := &dlq.Letter{Value: orig.Data, Headers: map[string][]string(orig.Header), Route: "orders", Class: dlq.ClassExhausted,
		Err: strings.Repeat("stack frame\n", 200), Attempts: 5,
		Origin: dlq.Origin{Topic: "orders.new", Stream: "ORDERS", Sequence: ack.Sequence, Group: "orders", Partition: -1}}
	if err := sink.Write(ctx, l); err != nil {
		t.Fatalf("the letter of a message at the header limit was refused: %v", err)
	}
	back, _, err := natsadapter.GetLetter(ctx, js, "", 1)
	if err != nil {
		t.Fatal(err)
	}
	if string(back.Value) != "payload" || !maps.EqualFunc(back.Headers, l.Headers, slices.Equal) || back.Truncated != "" {
		t.Fatalf("letter read back: value %q, headers %d (X-Big %d bytes), truncated %q", back.Value, len(back.Headers), len(first(back.Headers["X-Big"])), back.Truncated)
	}

	// At the payload limit: a message of the server's max payload; its
	// letter is stored cut, with the marker, and a replay refuses it.
	maxPayload := int(js.Conn().MaxPayload())
	full := &dlq.Letter{Value: bytes.Repeat([]byte("v"), maxPayload-200), Route: "orders", Class: dlq.ClassPermanent, Err: "too big to handle",
		Origin: dlq.Origin{Topic: "orders.new", Stream: "ORDERS", Sequence: 999, Group: "orders", Partition: -1}}
	if err := sink.Write(ctx, full); err != nil {
		t.Fatalf("letter at the payload limit refused: %v", err)
	}
	back, _, err = natsadapter.GetLetter(ctx, js, "", 2)
	if err != nil || !strings.Contains(back.Truncated, "value cut") || back.Err != "too big to handle" {
		t.Fatalf("%v: truncated %q err %q", err, back.Truncated, back.Err)
	}
	rp, _ := dlq.NewReplayer(dlq.ReplayOptions{Allow: []string{"orders.>"}, Rate: 1e6, Filter: dlq.Filter{Classes: []string{dlq.ClassPermanent}}})
	src, err := natsadapter.NewLetterSource(ctx, js, natsadapter.LetterSourceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close(ctx)
	rep, err := rp.Run(ctx, src, natsadapter.NewReplayTarget(js))
	if err != nil || rep.Refused != 1 || rep.Replayed != 0 {
		t.Fatalf("replay of a truncated letter: %+v %v", rep, err)
	}
}

func first(v []string) string {
	if len(v) == 0 {
		return ""
	}
	return v[0]
}

// TestDeadLetterOfHeadersNATSCannotStore: a Kafka record dead-lettered
// into a NATS store may carry header names nats.go refuses to publish (a
// space, a colon, a control byte, an empty name) and values NATS would
// change (CR LF, leading or trailing blanks). The write used to fail
// every time (the message looped between nak and rewrite); the original
// headers now travel packed in the stored value and come back unchanged.
func TestDeadLetterOfHeadersNATSCannotStore(t *testing.T) {
	js := natstest.JetStream(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []map[string][]string{
		{"with space": {"v"}, "App": {"a"}},
		{"colon:name": {"v"}},
		{"ctl\x01byte": {"v"}},
		{"": {"empty name"}},
		{"tab\tname": {"v"}, "Nats-Msg-Id": {"producer-1"}},
		{"App": {"line\r\nbreak", " padded ", "ctl\x00"}},
		{"ok": {"plain"}, "ünïcode": {"v"}},
	}
	for i, h := range cases {
		l := &dlq.Letter{Key: []byte("k"), Value: []byte("payload"), Headers: h, Route: "orders", Class: dlq.ClassPermanent, Err: "bad",
			Origin: dlq.Origin{Topic: "orders", Partition: 3, Offset: int64(i)}}
		if err := sink.Write(ctx, l); err != nil {
			t.Fatalf("case %d %q: %v", i, h, err)
		}
		back, _, err := natsadapter.GetLetter(ctx, js, "", uint64(i+1))
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if string(back.Value) != "payload" || !maps.EqualFunc(back.Headers, h, slices.Equal) {
			t.Fatalf("case %d: headers %q value %q, want %q", i, back.Headers, back.Value, h)
		}
	}
	// Headers NATS stores as they are stay headers.
	l := &dlq.Letter{Value: []byte("payload"), Headers: map[string][]string{"Ok": {"plain"}}, Route: "orders", Class: dlq.ClassPermanent, Err: "bad",
		Origin: dlq.Origin{Topic: "orders", Partition: 3, Offset: 99}}
	if err := sink.Write(ctx, l); err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctx, sink.Stream())
	if err != nil {
		t.Fatal(err)
	}
	raw, err := st.GetMsg(ctx, uint64(len(cases)+1))
	if err != nil {
		t.Fatal(err)
	}
	if raw.Header.Get("Ok") != "plain" || raw.Header.Get(dlq.HeaderPackedHeaders) != "" || string(raw.Data) != "payload" {
		t.Fatalf("a storable header was packed: %q %q", raw.Header, raw.Data)
	}
}

// FuzzDeadLetterHeaders: whatever one original header is, the letter is
// stored and reads back with the original headers unchanged.
func FuzzDeadLetterHeaders(f *testing.F) {
	for _, s := range [][2]string{{"App", "a"}, {"with space", "v"}, {"", ""}, {"a:b", " x "}, {"x", "\r\n"}, {"\x7f", "\x00"}} {
		f.Add(s[0], s[1])
	}
	js := natstest.JetStream(f)
	ctx := context.Background()
	sink, err := natsadapter.NewDeadLetterSink(ctx, js, natsadapter.SinkOptions{})
	if err != nil {
		f.Fatal(err)
	}
	var seq atomic.Uint64
	f.Fuzz(func(t *testing.T, k, v string) {
		if len(k)+len(v) > 4096 {
			return
		}
		if strings.HasPrefix(strings.ToLower(k), strings.ToLower(dlq.HeaderPrefix)) || k == "Nats-Msg-Id" {
			return // sluice's own envelope, and the producer id the sink moves aside
		}
		n := seq.Add(1)
		h := map[string][]string{k: {v}, "App": {"a"}}
		if k == "App" {
			h = map[string][]string{k: {v}}
		}
		l := &dlq.Letter{Value: []byte("payload"), Headers: h, Route: "r", Class: dlq.ClassPermanent, Err: "bad",
			Origin: dlq.Origin{Topic: "t", Partition: 0, Offset: int64(n)}}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := sink.Write(wctx, l); err != nil {
			t.Fatalf("header %q: %q: %v", k, v, err)
		}
		back, _, err := natsadapter.GetLetter(wctx, js, "", n)
		if err != nil {
			t.Fatal(err)
		}
		if string(back.Value) != "payload" || !maps.EqualFunc(back.Headers, h, slices.Equal) {
			t.Fatalf("header %q: %q: read back %q value %q", k, v, back.Headers, back.Value)
		}
	})
}
