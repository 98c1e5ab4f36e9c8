package handler

import "bytes"

// Route normalization (docs/decision-endpoint.md). The route is what rules match on and what
// the `route` key dimension counts, so every spelling of one path must give
// one route: otherwise "/a/../admin", "//admin" or "/%61dmin" would each get
// a fresh quota.

// pathClass says what NormalizeRoute does with a raw byte of the path.
const (
	encode   = iota // percent-encode: not allowed literally in a path
	keep            // keep literally: unreserved, sub-delims, ':' and '@'
	unreserv        // keep literally, and decode it when it arrives escaped
)

var pathClass = func() (t [256]uint8) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = unreserv
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = unreserv
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = unreserv
	}
	for _, c := range "-._~" {
		t[c] = unreserv
	}
	for _, c := range "!$&'()*+,;=:@" {
		t[c] = keep
	}
	return t
}()

const upperHex = "0123456789ABCDEF"

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// NormalizeRoute appends the route of uri to dst and returns the extended
// slice. uri is a request target as NGINX's $request_uri holds it.
//
// The route is the path only: the query and fragment are dropped, and an
// absolute-form target ("http://host/p") contributes its path. Escapes of
// unreserved characters (ALPHA DIGIT - . _ ~) are decoded, so "%2e%2e" is a
// ".." segment and "%7euser" is "~user"; every other escape is kept with
// upper-case hex ("%2f" becomes "%2F" and never separates segments). Bytes
// that may not appear literally in a path (space, controls, non-ASCII, '"',
// '\\', ...) and a '%' that starts no valid escape are percent-encoded, so
// "/a b" and "/a%20b" are one route and the result is plain ASCII. Empty
// segments ("//") are dropped and "." and ".." are resolved, never above the
// root; a trailing slash is kept, as RFC 3986 remove_dot_segments keeps it.
//
// The result always starts with "/", holds no "//", "." or ".." segment, and
// normalizing it again changes nothing.
//
//	/a/../admin     -> /admin
//	/%2e%2e/admin   -> /admin
//	/a/./b/?x=1     -> /a/b/
//	/a%2fb          -> /a%2Fb
//	http://h/x//y   -> /x/y
func NormalizeRoute(dst, uri []byte) []byte {
	path := uri
	if len(path) > 0 && path[0] != '/' {
		path = absolutePath(path)
	}
	for i, c := range path {
		if c == '?' || c == '#' {
			path = path[:i]
			break
		}
	}

	base := len(dst)
	out := dst
	// trailing is true when the last segment seen leaves the route ending in
	// "/": an empty segment, ".", "..", or a path that ends with "/".
	trailing := false
	for {
		seg := path
		i := bytes.IndexByte(path, '/')
		if i >= 0 {
			seg = path[:i]
		}

		mark := len(out)
		out = append(out, '/')
		out = appendSegment(out, seg)
		switch s := out[mark+1:]; {
		case len(s) == 0, len(s) == 1 && s[0] == '.':
			out = out[:mark]
			trailing = true
		case len(s) == 2 && s[0] == '.' && s[1] == '.':
			// Drop this segment and the one before it; at the root there
			// is nothing to drop.
			out = out[:mark]
			if j := bytes.LastIndexByte(out[base:], '/'); j >= 0 {
				out = out[:base+j]
			}
			trailing = true
		default:
			trailing = false
		}

		if i < 0 {
			break
		}
		path = path[i+1:]
	}
	if len(out) == base || trailing {
		out = append(out, '/')
	}
	return out
}

// appendSegment appends one raw path segment with escapes normalized as
// NormalizeRoute describes. The result never contains '/'.
func appendSegment(dst, seg []byte) []byte {
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if c == '%' {
			if i+2 < len(seg) {
				hi, ok1 := unhex(seg[i+1])
				lo, ok2 := unhex(seg[i+2])
				if ok1 && ok2 {
					d := hi<<4 | lo
					if pathClass[d] == unreserv {
						dst = append(dst, d)
					} else {
						dst = append(dst, '%', upperHex[hi], upperHex[lo])
					}
					i += 2
					continue
				}
			}
			dst = append(dst, '%', '2', '5') // a lone '%' is itself escaped
			continue
		}
		if pathClass[c] == encode {
			dst = append(dst, '%', upperHex[c>>4], upperHex[c&15])
			continue
		}
		dst = append(dst, c)
	}
	return dst
}

// absolutePath returns the path, query and fragment of an absolute-form
// target ("http://host:80/p?q" gives "/p?q"). A target that is not
// absolute-form is returned unchanged and NormalizeRoute roots it.
func absolutePath(uri []byte) []byte {
	i := 0
	for i < len(uri) && (isAlpha(uri[i]) || i > 0 && (isDigit(uri[i]) || uri[i] == '+' || uri[i] == '-' || uri[i] == '.')) {
		i++
	}
	if i == 0 || len(uri) < i+3 || uri[i] != ':' || uri[i+1] != '/' || uri[i+2] != '/' {
		return uri
	}
	rest := uri[i+3:]
	for j, c := range rest {
		if c == '/' || c == '?' || c == '#' {
			return rest[j:]
		}
	}
	return nil
}

func isAlpha(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
func isDigit(c byte) bool { return '0' <= c && c <= '9' }
