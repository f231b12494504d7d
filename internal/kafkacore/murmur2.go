package kafkacore

// Murmur2 is the hash of Kafka's Java client's default partitioner (and
// librdkafka's murmur2_random, kafka-go's Murmur2Balancer, franz-go's
// KafkaHasher): MurmurHash2 with seed 0x9747b28c.
func Murmur2(data []byte) uint32 {
	const (
		seed uint32 = 0x9747b28c
		m    uint32 = 0x5bd1e995
		r           = 24
	)
	n := len(data)
	h := seed ^ uint32(n)
	for i := 0; i+4 <= n; i += 4 {
		k := uint32(data[i]) | uint32(data[i+1])<<8 | uint32(data[i+2])<<16 | uint32(data[i+3])<<24
		k *= m
		k ^= k >> r
		k *= m
		h *= m
		h ^= k
	}
	tail := data[n&^3:]
	switch len(tail) {
	case 3:
		h ^= uint32(tail[2]) << 16
		fallthrough
	case 2:
		h ^= uint32(tail[1]) << 8
		fallthrough
	case 1:
		h ^= uint32(tail[0])
		h *= m
	}
	h ^= h >> 13
	h *= m
	h ^= h >> 15
	return h
}

// KeyPartition is the partition of n a Java producer puts key in:
// (murmur2(key) & 0x7fffffff) % n. A nil key has no partition of its own
// (the caller picks one); KeyPartition returns 0 for it, and 0 when n < 1.
func KeyPartition(key []byte, n int) int {
	if n < 1 || key == nil {
		return 0
	}
	return int(Murmur2(key)&0x7fffffff) % n
}
