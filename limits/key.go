package limits

import (
	"fmt"
	"strings"
	"unicode/utf8"
)

// Key layout: <prefix>:{<rule>:<identity>}:<suffix>
//
// The identity is the rule's key parts joined by '|', each value escaped so
// that only [A-Za-z0-9._~/:@-] stays literal and every other byte becomes %XX.
// '|', '{', '}', '%', '=' and '#' are therefore never literal inside a value,
// which makes the encoding injective (two different identities never give the
// same string) and keeps the Redis Cluster hash tag intact. An anonymous user
// encodes as "=" + ip, which no escaped user name can start with. When the
// encoded identity is longer than maxIdentity it is replaced by "#" followed
// by 32 hex digits of its SHA-256, so keys stay short whatever the headers hold.

// maxIdentity bounds the literal identity part of a key.
const maxIdentity = 96

// HeaderValueProblem says why v can never be the value of a request
// header, as /auth reads it ("" when it can be): white space at either end
// is trimmed (TrimValue), and no value holds a control byte other than a
// tab. An identity made of such a value (a user, a header dimension, a
// host) names no request: an override or exception of it would never
// apply.
func HeaderValueProblem(v string) string {
	if v == "" {
		return ""
	}
	if len(TrimValue([]byte(v))) != len(v) {
		return "starts or ends with white space, which rategate trims from a header value"
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return fmt.Sprintf("holds the control byte 0x%02x, which no header value carries", c)
		}
	}
	return ""
}

// TrimValue returns v without the white space at its ends, as a header
// value that names a client (the user, a header a rule is keyed on or
// matches) is counted. NGINX trims only spaces and tabs and passes the
// rest on; applications commonly trim more (Python's str.strip, Go's
// strings.TrimSpace, JavaScript's trim, Java's trim), so "k", "k\u00a0"
// and "k\x85" are one API key to them, and would otherwise be three
// quotas here. Trimmed at each end, repeatedly:
//   - bytes up to 0x20, and 0x7f (spaces, tabs, control bytes);
//   - Unicode white space in UTF-8 (unicode.IsSpace: NEL, NBSP, U+1680,
//     U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000), and the
//     invisible U+180E, U+200B and U+FEFF, which some runtimes trim;
//   - the single bytes 0x85 and 0xa0 where they are not part of a UTF-8
//     character: NEL and NBSP to an application that reads header bytes
//     as Latin-1, as HTTP's own default is.
//
// Trimming more than an application does joins spellings into one
// identity: one quota (the strict side), but also one exception, so an
// application account that differs from another only by such padding
// ("admin" and "admin\u3000") shares its exemption or override here.
// It returns a subslice of v: no allocation.
func TrimValue(v []byte) []byte {
	for len(v) > 0 {
		c := v[0]
		if c > ' ' && c < 0x7f {
			break
		}
		if c <= ' ' || c == 0x7f || c == 0x85 || c == 0xa0 {
			// Byte by byte where no rune needs decoding (0x85 and 0xa0
			// never start a UTF-8 character): a client may send 8 KiB.
			v = v[1:]
			continue
		}
		n := trimmableAt(v)
		if n == 0 {
			break
		}
		v = v[n:]
	}
	for len(v) > 0 {
		c := v[len(v)-1]
		if c > ' ' && c < 0x7f {
			break
		}
		if c <= ' ' || c == 0x7f {
			v = v[:len(v)-1]
			continue
		}
		n := trimmableBefore(v)
		if n == 0 {
			break
		}
		v = v[:len(v)-n]
	}
	return v
}

// trimmableAt is the length of the white space that starts v (0: none).
func trimmableAt(v []byte) int {
	r, n := utf8.DecodeRune(v)
	if r == utf8.RuneError && n == 1 {
		return latin1Space(v[0])
	}
	if isTrimmable(r) {
		return n
	}
	return 0
}

// trimmableBefore is the length of the white space that ends v (0: none).
func trimmableBefore(v []byte) int {
	r, n := utf8.DecodeLastRune(v)
	if r == utf8.RuneError && n == 1 {
		return latin1Space(v[len(v)-1])
	}
	if isTrimmable(r) {
		return n
	}
	return 0
}

func isTrimmable(r rune) bool {
	if r < 0x1680 {
		return r <= ' ' || r == 0x7f || r == 0x85 || r == 0xa0
	}
	// unicode.IsSpace beyond Latin-1 (White_Space), spelled out: the
	// table search cost more than the rest of a trim.
	switch r {
	case 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000, 0x180e, 0x200b, 0xfeff:
		return true
	}
	return 0x2000 <= r && r <= 0x200a
}

// latin1Space is 1 for a byte outside any UTF-8 character that is white
// space in Latin-1 (NEL, NBSP), else 0.
func latin1Space(c byte) int {
	if c == 0x85 || c == 0xa0 {
		return 1
	}
	return 0
}

// MaxKeyLen is the longest key AppendKey can produce for a valid rule
// (prefix <= 32, rule name <= 64).
const MaxKeyLen = 32 + 2 + 64 + 1 + maxIdentity + 2 + 2

var literal = func() (t [256]bool) {
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for _, c := range "._~/:@-" {
		t[c] = true
	}
	return t
}()

const hexDigits = "0123456789ABCDEF"

// appendEscaped appends v with every non-literal byte as %XX.
func appendEscaped(dst, v []byte) []byte {
	for _, c := range v {
		if literal[c] {
			dst = append(dst, c)
		} else {
			dst = append(dst, '%', hexDigits[c>>4], hexDigits[c&15])
		}
	}
	return dst
}

// AppendIdentity appends the escaped identity of req for rule r. ok is false
// when the rule does not apply (a `user` key with anonymous: skip and no user).
func AppendIdentity(dst []byte, r *Rule, req *Request) (out []byte, ok bool) {
	for i, p := range r.Key {
		if i > 0 {
			dst = append(dst, '|')
		}
		switch p.Kind {
		case KeyIP:
			dst = appendEscaped(dst, req.IP)
		case KeyUser:
			user := TrimValue(req.User)
			if len(user) == 0 {
				if r.Anonymous == AnonymousSkip {
					return dst, false
				}
				dst = append(dst, '=')
				dst = appendEscaped(dst, req.IP)
			} else {
				dst = appendEscaped(dst, user)
			}
		case KeyRoute:
			dst = appendEscaped(dst, req.Route)
		case KeyMethod:
			// HEAD is GET without the body (a rule on GET matches it
			// too): one counter, or HEAD would be a second quota.
			if string(req.Method) == "HEAD" {
				dst = append(dst, "GET"...)
			} else {
				dst = appendEscaped(dst, req.Method)
			}
		case KeyHost:
			dst = appendEscaped(dst, req.Host)
		case KeyHeader:
			if req.Headers != nil {
				dst = appendEscaped(dst, TrimValue(req.Headers.Peek(p.Header)))
			}
		}
	}
	return dst, true
}

// AppendKey appends the full store key for rule r and an identity already
// produced by AppendIdentity.
func AppendKey(dst []byte, prefix string, r *Rule, identity []byte) []byte {
	dst = append(dst, prefix...)
	dst = append(dst, ":{"...)
	dst = append(dst, r.Name...)
	dst = append(dst, ':')
	dst = appendIdentityKey(dst, identity)
	dst = append(dst, "}:"...)
	dst = append(dst, r.Algorithm.Suffix()...)
	return dst
}

// SiblingKey returns a key in the hash slot of key (its hash tag, then
// ":<suffix>"): a record that must live next to key on Redis Cluster, such
// as its lease record or a refund marker.
func SiblingKey(key, suffix string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[:i+1+j+1] + ":" + suffix
		}
	}
	return "{" + key + "}:" + suffix
}

// LeaseKey returns the key of the lease record of a rule's key: the same
// hash tag (the same slot), suffix "lease":
// "rg:{login:203.0.113.7}:gc2" → "rg:{login:203.0.113.7}:lease".
func LeaseKey(key string) string { return SiblingKey(key, "lease") }

// ResetStampKey returns the key of the stamp an operator's reset of key
// leaves beside it (lua/reset.lua): the same hash tag, suffix "reset":
// "rg:{login:203.0.113.7}:fw2" → "rg:{login:203.0.113.7}:reset".
// lua/refund.lua names it the same way.
func ResetStampKey(key string) string { return SiblingKey(key, "reset") }
