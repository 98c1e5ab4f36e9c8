package handler

import (
	"net/netip"
	"strings"
	"testing"
)

func TestParseIP(t *testing.T) {
	tests := []struct{ in, want string }{
		{"192.0.2.7", "192.0.2.7"},
		{"  192.0.2.7\t", "192.0.2.7"},
		{"2001:db8::1", "2001:db8::1"},
		{"2001:DB8:0:0:0:0:0:1", "2001:db8::1"},
		{"::ffff:192.0.2.7", "192.0.2.7"},
		{"::1", "::1"},
		{"", ""},
		{"   ", ""},
		{"fe80::1%eth0", ""},
		{"192.0.2.7%25", ""},
		{"192.0.2.7:8080", "192.0.2.7"},
		{" 192.0.2.7:1 ", "192.0.2.7"},
		{"[2001:db8::1]", "2001:db8::1"},
		{"[2001:DB8::1]:443", "2001:db8::1"},
		{"[::ffff:192.0.2.7]:443", "192.0.2.7"},
		{"::1:80", "::1:80"},
		{"192.0.2.7:", ""},
		{"192.0.2.7:123456", ""},
		{"192.0.2.7:80x", ""},
		{"192.0.2.7:80:80", ""},
		{"[2001:db8::1]x", ""},
		{"[2001:db8::1]:", ""},
		{"[2001:db8::1", ""},
		{"[192.0.2.7]", "192.0.2.7"},
		{"[fe80::1%eth0]:80", ""},
		{"host.example:80", ""},
		{"192.0.2.7, 192.0.2.8", ""},
		{"192.0.2", ""},
		{"0192.0.2.7", ""},
		{"unknown", ""},
		{"\xff\xfe", ""},
		{strings.Repeat("1", 8192), ""},
	}
	for _, tt := range tests {
		addr, ok := parseIP([]byte(tt.in))
		got := ""
		if ok {
			got = addr.String()
		}
		if got != tt.want {
			t.Errorf("parseIP(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

func TestForwardedClient(t *testing.T) {
	trustedProxies := []netip.Prefix{
		netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("::1/128"),
	}
	tests := []struct {
		name  string
		lines []string
		want  string // "" = no client
	}{
		{"single", []string{"203.0.113.9"}, "203.0.113.9"},
		{"client-sent left-most ignored", []string{"1.1.1.1, 203.0.113.9"}, "203.0.113.9"},
		{"client-sent left-most ignored behind trusted hops",
			[]string{"1.1.1.1, 203.0.113.9, 10.0.0.2, 10.0.0.1"}, "203.0.113.9"},
		{"spoofed trusted-looking entry left of the client",
			[]string{"10.9.9.9, 203.0.113.9, 10.0.0.1"}, "203.0.113.9"},
		{"untrusted right-most wins", []string{"203.0.113.9, 198.51.100.4"}, "198.51.100.4"},
		{"several lines walked as one list",
			[]string{"1.1.1.1, 2.2.2.2", "203.0.113.9", "10.0.0.1"}, "203.0.113.9"},
		{"client spoof in its own line", []string{"1.1.1.1", "203.0.113.9, 10.0.0.1"}, "203.0.113.9"},
		{"all trusted: left-most", []string{"10.0.0.3, 10.0.0.2, ::1"}, "10.0.0.3"},
		{"spaces and empty elements", []string{" ,203.0.113.9 ,, 10.0.0.1 , "}, "203.0.113.9"},
		{"mapped IPv6 is unmapped, then checked",
			[]string{"203.0.113.9, ::ffff:10.0.0.1"}, "203.0.113.9"},
		{"IPv6 client", []string{"2001:db8::7, 10.0.0.1"}, "2001:db8::7"},
		{"garbage left of the client is never read", []string{"not-an-ip, 203.0.113.9"}, "203.0.113.9"},
		{"garbage right-most: no client", []string{"203.0.113.9, garbage"}, ""},
		{"garbage behind trusted hops: the last trusted hop",
			[]string{"203.0.113.9, garbage, 10.0.0.2, 10.0.0.1"}, "10.0.0.2"},
		{"zone rejected", []string{"fe80::1%eth0"}, ""},
		{"port dropped", []string{"203.0.113.9:443"}, "203.0.113.9"},
		{"ports written by a trusted proxy (Application Gateway)",
			[]string{"203.0.113.9:4001, 10.0.0.1"}, "203.0.113.9"},
		{"bracketed IPv6 with a port behind a trusted proxy",
			[]string{"[2001:db8::7]:4001, 10.0.0.1:443"}, "2001:db8::7"},
		{"empty", []string{""}, ""},
		{"no lines", nil, ""},
	}
	for _, tt := range tests {
		var lines [][]byte
		for _, l := range tt.lines {
			lines = append(lines, []byte(l))
		}
		addr, ok := forwardedClient(lines, trustedProxies)
		got := ""
		if ok {
			got = addr.String()
		}
		if got != tt.want {
			t.Errorf("%s: forwardedClient(%q) = %q, want %q", tt.name, tt.lines, got, tt.want)
		}
	}
}

func TestForwardedClientNoTrustedProxies(t *testing.T) {
	addr, ok := forwardedClient([][]byte{[]byte("10.0.0.5, 1.1.1.1, 127.0.0.1")}, nil)
	if !ok || addr.String() != "127.0.0.1" {
		t.Fatalf("got %v %v, want the right-most hop 127.0.0.1", addr, ok)
	}
}
