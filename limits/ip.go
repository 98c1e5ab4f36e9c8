package limits

import (
	"net/netip"
	"strconv"
)

// DefaultIPv6Prefix is the length of the network an IPv6 client is counted
// as (identity.ipv6_prefix): a /64 is what one customer line, host or VM
// usually gets, and every address in it is the same client.
const DefaultIPv6Prefix = 64

// AppendIPIdentity appends the `ip` dimension of addr to dst: an IPv4
// address as itself; an IPv6 address as its network of ipv6Prefix bits,
// written as a prefix ("2001:db8:1:2::/64"), or as itself when ipv6Prefix is
// 128 or more. ipv6Prefix <= 0 means DefaultIPv6Prefix. An IPv4-mapped
// address counts as the IPv4 address; a zone is dropped. Matching against
// trusted_proxies uses the full address and happens before this.
//
// Everything that turns an address into the `ip` dimension must call it
// (the /auth handler, the admin API's ?ip= parameter), so that one client
// is one key everywhere. It does not allocate when dst has room.
func AppendIPIdentity(dst []byte, addr netip.Addr, ipv6Prefix int) []byte {
	addr = addr.Unmap().WithZone("")
	if ipv6Prefix <= 0 {
		ipv6Prefix = DefaultIPv6Prefix
	}
	if !addr.Is6() || ipv6Prefix >= 128 {
		return addr.AppendTo(dst)
	}
	p, err := addr.Prefix(ipv6Prefix)
	if err != nil {
		return addr.AppendTo(dst)
	}
	dst = p.Addr().AppendTo(dst)
	dst = append(dst, '/')
	return strconv.AppendInt(dst, int64(ipv6Prefix), 10)
}
