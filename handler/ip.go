package handler

import (
	"bytes"
	"net/netip"
	"unsafe"
)

// parseIP parses one client address as it appears in X-Real-IP or one
// X-Forwarded-For element: surrounding spaces and tabs are ignored, a port
// is dropped ("192.0.2.7:4711", "[2001:db8::7]:4711" and "[2001:db8::7]",
// as Azure Application Gateway and IIS ARR write the client), an
// IPv4-mapped IPv6 address is unmapped (so "::ffff:1.2.3.4" and "1.2.3.4"
// share a counter), and a zone ("fe80::1%eth0") is rejected: a zone is
// meaningless off the host and would let one client pick many identities.
func parseIP(b []byte) (netip.Addr, bool) {
	b = withoutPort(bytes.Trim(b, " \t"))
	// Reject zones before parsing: ParseAddr interns zone strings, and no
	// header should be able to grow a process-wide table.
	if len(b) == 0 || len(b) > 64 || bytes.IndexByte(b, '%') >= 0 {
		return netip.Addr{}, false
	}
	// The string only lives for the call: on success ParseAddr keeps nothing
	// of it (no zone), and the error, which would keep it, is dropped. This
	// saves one allocation per request on the hot path.
	addr, err := netip.ParseAddr(unsafe.String(unsafe.SliceData(b), len(b)))
	if err != nil {
		return netip.Addr{}, false
	}
	return addr.Unmap(), true
}

// withoutPort returns the address of "a.b.c.d:port", "[v6]:port" or
// "[v6]"; anything else as it is. (A port of an IPv6 address needs the
// brackets: "::1:80" is an address.)
func withoutPort(b []byte) []byte {
	if len(b) > 0 && b[0] == '[' {
		end := bytes.IndexByte(b, ']')
		if end < 0 {
			return b
		}
		if rest := b[end+1:]; len(rest) == 0 || rest[0] == ':' && isPort(rest[1:]) {
			return b[1:end]
		}
		return b
	}
	i := bytes.IndexByte(b, ':')
	if i > 0 && bytes.IndexByte(b[i+1:], ':') < 0 && bytes.IndexByte(b[:i], '.') >= 0 && isPort(b[i+1:]) {
		return b[:i]
	}
	return b
}

// isPort reports whether b is a port number: one to five digits.
func isPort(b []byte) bool {
	if len(b) == 0 || len(b) > 5 {
		return false
	}
	for _, c := range b {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// trusted reports whether addr is inside one of the prefixes.
func trusted(addr netip.Addr, prefixes []netip.Prefix) bool {
	for _, p := range prefixes {
		if p.Contains(addr) {
			return true
		}
	}
	return false
}

// forwardedClient finds the client in X-Forwarded-For values (one per header
// line, in order; each a comma-separated list).
//
// Each proxy appends the address it received the request from, so the list
// can be believed from the right only as far as it was written by proxies we
// trust. The walk goes right-to-left over every element of every line,
// skipping empty elements and hops inside trustedProxies; the first valid
// untrusted address is the client. Anything left of it was written by the
// client itself and never counts, whatever it says.
//
// When no untrusted address is found — every hop is trusted, or the walk
// meets an element that is not an IP address, which no trusted proxy would
// write and beyond which nothing can be vouched for — the client is the last
// (left-most) trusted hop passed. ok is false when there is none.
func forwardedClient(lines [][]byte, trustedProxies []netip.Prefix) (client netip.Addr, ok bool) {
	for l := len(lines) - 1; l >= 0; l-- {
		line := lines[l]
		for len(line) > 0 {
			elem := line
			i := bytes.LastIndexByte(line, ',')
			if i >= 0 {
				elem, line = line[i+1:], line[:i]
			} else {
				line = nil
			}
			if len(bytes.Trim(elem, " \t")) == 0 {
				continue
			}
			addr, valid := parseIP(elem)
			if !valid {
				return client, ok
			}
			if !trusted(addr, trustedProxies) {
				return addr, true
			}
			client, ok = addr, true
		}
	}
	return client, ok
}
