package redisstore

// Redis Cluster hash slots (https://redis.io/docs/reference/cluster-spec/):
// slot = CRC16-XMODEM(tag) mod 16384, where tag is the part of the key
// between the first '{' and the first '}' after it when that part is not
// empty, else the whole key. rategate keys put "{rule:identity}" there
// (docs/design.md, "Keys"), so every key of one rule and identity lands in one slot.
//
// go-redis has the same function internally but does not export it; this
// copy is checked against CLUSTER KEYSLOT on a real cluster in cluster_test.go.

// NumSlots is the number of Redis Cluster hash slots.
const NumSlots = 16384

// crc16Table is the CRC16-CCITT (XMODEM: polynomial 0x1021, initial value 0,
// no reflection) table.
var crc16Table = func() (t [256]uint16) {
	for i := range t {
		c := uint16(i) << 8
		for range 8 {
			if c&0x8000 != 0 {
				c = c<<1 ^ 0x1021
			} else {
				c <<= 1
			}
		}
		t[i] = c
	}
	return t
}()

func crc16(s string) uint16 {
	var c uint16
	for i := 0; i < len(s); i++ {
		c = c<<8 ^ crc16Table[byte(c>>8)^s[i]]
	}
	return c
}

// KeySlot returns the Redis Cluster hash slot of key.
//
// Example: KeySlot("rg:{login-per-ip:203.0.113.7}:gc2") hashes only
// "login-per-ip:203.0.113.7".
func KeySlot(key string) int {
	for i := 0; i < len(key); i++ {
		if key[i] != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j > i+1 {
					key = key[i+1 : j]
				}
				return int(crc16(key) % NumSlots)
			}
		}
		break
	}
	return int(crc16(key) % NumSlots)
}
