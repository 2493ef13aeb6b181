package inflight

import "strings"

// Slot returns the Redis Cluster hash slot of a Redis key (0–16383): CRC16 (XMODEM) of the
// key's hash tag — what lies between its first '{' and the first '}' after it, when that is
// not empty — or of the whole key, modulo 16384, as the cluster computes it.
func Slot(key string) int {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	var crc uint16
	for i := 0; i < len(key); i++ {
		crc ^= uint16(key[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc % 16384)
}
