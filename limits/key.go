package limits

import (
	"fmt"
	"strings"
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
// header, as /auth reads it ("" when it can be): HTTP trims white space
// from both ends of a value, and no value holds a control byte other than
// a tab. An identity made of such a value (a user, a header dimension, a
// host) names no request: an override or exception of it would never
// apply.
func HeaderValueProblem(v string) string {
	if v == "" {
		return ""
	}
	if isBlank(v[0]) || isBlank(v[len(v)-1]) {
		return "starts or ends with white space, which HTTP trims from a header value"
	}
	for i := 0; i < len(v); i++ {
		if c := v[i]; (c < 0x20 && c != '\t') || c == 0x7f {
			return fmt.Sprintf("holds the control byte 0x%02x, which no header value carries", c)
		}
	}
	return ""
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' }

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
			if len(req.User) == 0 {
				if r.Anonymous == AnonymousSkip {
					return dst, false
				}
				dst = append(dst, '=')
				dst = appendEscaped(dst, req.IP)
			} else {
				dst = appendEscaped(dst, req.User)
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
				dst = appendEscaped(dst, req.Headers.Peek(p.Header))
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
