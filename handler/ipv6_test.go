package handler

import (
	"net/netip"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

func TestAppendIPIdentity(t *testing.T) {
	tests := []struct {
		addr string
		bits int
		want string
	}{
		{"2001:db8:1:2:3:4:5:6", 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:ffff:ffff:ffff:ffff", 64, "2001:db8:1:2::/64"},
		{"2001:db8:1:2:3:4:5:6", 0, "2001:db8:1:2::/64"}, // 0 = the default
		{"2001:db8:1:2:3:4:5:6", 48, "2001:db8:1::/48"},
		{"2001:db8:1:2:3:4:5:6", 56, "2001:db8:1::/56"},
		{"2001:db8:1:2ff:3:4:5:6", 56, "2001:db8:1:200::/56"},
		{"2001:db8:1:2:3:4:5:6", 127, "2001:db8:1:2:3:4:5:6/127"},
		{"2001:db8:1:2:3:4:5:7", 127, "2001:db8:1:2:3:4:5:6/127"},
		{"2001:db8:1:2:3:4:5:6", 128, "2001:db8:1:2:3:4:5:6"}, // every address its own
		{"::1", 64, "::/64"},
		{"192.0.2.7", 64, "192.0.2.7"}, // IPv4 is never masked
		{"192.0.2.7", 48, "192.0.2.7"},
		// IPv4-mapped: the IPv4 client, unmapped here too (the admin API's
		// ?ip= comes straight from netip.ParseAddr), not ::/64
		{"::ffff:192.0.2.7", 64, "192.0.2.7"},
		{"::ffff:192.0.2.7", 128, "192.0.2.7"},
	}
	for _, tt := range tests {
		got := string(limits.AppendIPIdentity([]byte("x="), netip.MustParseAddr(tt.addr), tt.bits))
		if got != "x="+tt.want {
			t.Errorf("limits.AppendIPIdentity(%s, %d) = %q, want %q", tt.addr, tt.bits, got, "x="+tt.want)
		}
	}
	// IPv4-mapped addresses are unmapped by parseIP, before masking.
	a, ok := parseIP([]byte("::ffff:192.0.2.7"))
	if got := string(limits.AppendIPIdentity(nil, a, 64)); !ok || got != "192.0.2.7" {
		t.Errorf("mapped address: %q, want 192.0.2.7", got)
	}
}

func TestAppendIPIdentityAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are only meaningful without -race")
	}
	buf := make([]byte, 0, 64)
	a := netip.MustParseAddr("2001:db8:1:2:3:4:5:6")
	if n := testing.AllocsPerRun(1000, func() { buf = limits.AppendIPIdentity(buf[:0], a, 64) }); n != 0 {
		t.Fatalf("%v allocations per AppendIPIdentity, want 0", n)
	}
}

// TestIPv6ClientIsItsPrefix: three addresses of one /64 are one client;
// another /64 is another.
func TestIPv6ClientIsItsPrefix(t *testing.T) {
	ts := pinned(t, Options{}, rule("per-ip", 3, time.Minute, limits.KeyIP))
	for i, ip := range []string{"2001:db8:1:2::1", "2001:db8:1:2:ffff::9", "2001:db8:1:2:aaaa:bbbb:cccc:dddd"} {
		r := ts.auth(t, std(ip)...)
		equal(t, 204, r.status, "%s", ip)
		equal(t, string(rune('0'+2-i)), r.headers["x-ratelimit-remaining"], "%s: the /64's quota", ip)
	}
	equal(t, 429, ts.auth(t, std("2001:db8:1:2::42")...).status, "a fourth address of the /64")
	r := ts.auth(t, std("2001:db8:1:3::1")...)
	equal(t, 204, r.status, "another /64")
	equal(t, "2", r.headers["x-ratelimit-remaining"], "another /64: its own quota")
	equal(t, 204, ts.auth(t, std("192.0.2.1")...).status, "IPv4")
}

// TestIPv6PrefixOption: identity.ipv6_prefix widens or narrows the client.
func TestIPv6PrefixOption(t *testing.T) {
	ts := pinned(t, Options{IPv6Prefix: 48}, rule("per-ip", 2, time.Minute, limits.KeyIP))
	equal(t, 204, ts.auth(t, std("2001:db8:1:2::1")...).status)
	equal(t, 204, ts.auth(t, std("2001:db8:1:ffff::1")...).status)
	equal(t, 429, ts.auth(t, std("2001:db8:1:7::1")...).status, "one /48")
	equal(t, 204, ts.auth(t, std("2001:db8:2::1")...).status, "another /48")

	ts = pinned(t, Options{IPv6Prefix: 128}, rule("per-ip", 1, time.Minute, limits.KeyIP))
	equal(t, 204, ts.auth(t, std("2001:db8:1:2::1")...).status)
	equal(t, 204, ts.auth(t, std("2001:db8:1:2::2")...).status, "/128: every address its own")
	equal(t, 429, ts.auth(t, std("2001:db8:1:2::1")...).status)
}

// TestIPv6AnonymousUser: an anonymous user keyed by IP is its /64 too.
func TestIPv6AnonymousUser(t *testing.T) {
	ts := pinned(t, Options{}, rule("per-user", 2, time.Minute, limits.KeyUser))
	equal(t, 204, ts.auth(t, std("2001:db8:1:2::1")...).status)
	equal(t, 204, ts.auth(t, std("2001:db8:1:2::2")...).status)
	equal(t, 429, ts.auth(t, std("2001:db8:1:2::3")...).status, "anonymous, same /64")
	equal(t, 204, ts.auth(t, std("2001:db8:1:2::3", "X-User-Id", "alice")...).status, "a named user is not the /64")
}

// TestIPv6TrustedProxiesUseTheFullAddress: the X-Forwarded-For walk matches
// trusted_proxies against whole addresses; only the client found is masked.
func TestIPv6TrustedProxiesUseTheFullAddress(t *testing.T) {
	rec := &recorder{got: make(chan string, 1)}
	ts := serve(t, New(rec, nil, Options{
		IPHeader:       "X-Forwarded-For",
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("2001:db8:1:2::1/128")},
	}))
	// The proxy's neighbour in its own /64 is not trusted: it is the client.
	ts.auth(t, "X-Original-URI", "/", "X-Original-Host", "x", "X-Forwarded-For", "2001:db8:9::9, 2001:db8:1:2::7, 2001:db8:1:2::1")
	equal(t, "method=GET route=/ host=x ip=2001:db8:1:2::/64 user= cost=0", <-rec.got)
}
