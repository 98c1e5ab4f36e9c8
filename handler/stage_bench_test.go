package handler

import (
	"net/netip"
	"testing"
)

// Benchmarks of identity parsing, the stage before rule matching (the
// whole request is BenchmarkServe in bench/):
//
//	go test -run '^$' -bench 'Identity' -benchmem ./handler/

// BenchmarkIdentityIP is the client address from X-Real-IP.
func BenchmarkIdentityIP(b *testing.B) {
	for _, ip := range []string{"203.0.113.7", "2001:db8::7"} {
		b.Run(ip, func(b *testing.B) {
			v := []byte(ip)
			b.ReportAllocs()
			for b.Loop() {
				if _, ok := parseIP(v); !ok {
					b.Fatal("not an IP")
				}
			}
		})
	}
}

// BenchmarkIdentityForwarded is the client address from X-Forwarded-For,
// walked right to left past trusted proxies: two header lines, four hops.
func BenchmarkIdentityForwarded(b *testing.B) {
	lines := [][]byte{[]byte("198.51.100.9, 203.0.113.7"), []byte("10.0.0.2, 10.0.0.1")}
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("127.0.0.0/8")}
	b.ReportAllocs()
	for b.Loop() {
		if a, ok := forwardedClient(lines, trusted); !ok || !a.Is4() {
			b.Fatal("no client")
		}
	}
}
