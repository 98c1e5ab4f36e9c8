package redisstore

import "testing"

// TestKeySlot checks KeySlot against CLUSTER KEYSLOT answers of a real
// redis-server 7.0 (TestKeySlotMatchesCluster asks a live cluster for more).
func TestKeySlot(t *testing.T) {
	for _, tc := range []struct {
		key  string
		want int
	}{
		{"", 0},
		{"foo", 12182},
		{"bar", 5061},
		{"123456789", 12739}, // CRC16-XMODEM check value 0x31C3
		{"{user1000}.following", 3443},
		{"{user1000}.followers", 3443},
		{"foo{}{bar}", 8363},    // empty first tag: the whole key
		{"foo{{bar}}zap", 4015}, // tag is "{bar"
		{"foo{bar}{zap}", 5061}, // first tag only: "bar"
		{"{}", 15257},
		{"rg:{login-per-ip:203.0.113.7}:gc", 14149},
	} {
		if got := KeySlot(tc.key); got != tc.want {
			t.Errorf("KeySlot(%q) = %d, want %d", tc.key, got, tc.want)
		}
	}
}

func BenchmarkKeySlot(b *testing.B) {
	for b.Loop() {
		KeySlot("rg:{login-per-ip:203.0.113.7}:gc")
	}
}
