package kafkacore

import "testing"

// The vectors of Kafka's own UtilsTest.testMurmur2 (the Java client's
// partitioner hash): a key lands where a Java producer would put it.
func TestMurmur2JavaVectors(t *testing.T) {
	for key, want := range map[string]int32{
		"21":                         -973932308,
		"foobar":                     -790332482,
		"a-little-bit-long-string":   -985981536,
		"a-little-bit-longer-string": -1486304829,
		"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
		"abc": 479470107,
	} {
		if got := int32(Murmur2([]byte(key))); got != want {
			t.Errorf("murmur2(%q) = %d, want %d", key, got, want)
		}
	}
}

func TestKeyPartition(t *testing.T) {
	// (murmur2 & 0x7fffffff) % n, Java's toPositive, not abs.
	h := Murmur2([]byte("foobar"))
	for _, n := range []int{1, 3, 7, 100} {
		if got, want := KeyPartition([]byte("foobar"), n), int(h&0x7fffffff)%n; got != want {
			t.Errorf("n=%d: %d, want %d", n, got, want)
		}
	}
	if KeyPartition(nil, 5) != 0 || KeyPartition([]byte("x"), 0) != 0 {
		t.Error("nil key or no partitions: want 0")
	}
}
