package natsadapter

import (
	"bytes"
	"testing"

	"github.com/nats-io/nats.go"
)

// TestConvertAllocatesOnlyTheDelivery guards the Source's per-message cost
// on the client side: parsing the $JS.ACK subject allocates nothing, and
// converting a delivery allocates the delivery alone (its Message, its
// settlement and, for a key seen in the previous delivery, its Key's bytes
// included).
func TestConvertAllocatesOnlyTheDelivery(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates on its own")
	}
	const reply = "$JS.ACK.ORDERS.d.1.42.42.1700000000000000000.7"
	m := &nats.Msg{Subject: "orders.eu", Reply: reply, Data: []byte("x")}
	if n := testing.AllocsPerRun(200, func() {
		if _, ok := parseAck(reply); !ok {
			t.Fatal("parseAck failed")
		}
	}); n != 0 {
		t.Errorf("parseAck: %v allocations, want 0", n)
	}
	s := &Source{stream: "ORDERS", name: "d"}
	md, _ := parseAck(reply)
	if n := testing.AllocsPerRun(200, func() { s.convert(m, md, true) }); n != 1 {
		t.Errorf("convert: %v allocations per delivery, want 1 (the delivery)", n)
	}
}

// TestConvertKeysFollowTheSubject: deliveries share their Key's bytes only
// while the key stays the same; each delivery's Key is its own subject.
func TestConvertKeysFollowTheSubject(t *testing.T) {
	s := &Source{stream: "ORDERS", name: "d"}
	subjects := []string{"orders.eu", "orders.eu", "orders.us", "orders.eu", "orders.us", "orders.us"}
	var keys [][]byte
	for _, subj := range subjects {
		cm := s.convert(&nats.Msg{Subject: subj, Data: []byte("x")}, ackMeta{}, false)
		keys = append(keys, cm.Key)
	}
	for i, subj := range subjects {
		if !bytes.Equal(keys[i], []byte(subj)) {
			t.Errorf("delivery %d on %s has Key %q", i, subj, keys[i])
		}
	}
	if &keys[0][0] != &keys[1][0] {
		t.Error("two deliveries in a row on one subject copied the key twice")
	}
}
