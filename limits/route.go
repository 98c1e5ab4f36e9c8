package limits

import (
	"bytes"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Route normalization (docs/decision-endpoint.md). The route is what rules
// match on and what the `route` key dimension counts, so it must be the path
// NGINX itself routes by ($uri): otherwise "/%2Fadmin", "/x/..%2Fadmin" or
// "//admin", which NGINX serves from /admin, would each get a fresh quota.
//
// NGINX (ngx_http_parse_complex_uri) decodes every escape once, and a decoded
// '/' or '.' takes part in segment splitting, slash merging and dot
// resolution like a literal one; a decoded '%' never starts another escape.
// NormalizeRoute does the same, then writes the decoded path canonically, so
// that the route is printable ASCII and two different decoded paths never
// give one route.

// routeLiteral says which bytes of a decoded path the route writes as
// themselves: unreserved characters, sub-delims, ':' and '@' (RFC 3986
// pchar). Every other byte, '%' included, is written %XX. Since '%' is never
// literal, reading the route back is unambiguous.
var routeLiteral = func() (t [256]bool) {
	for c := 'a'; c <= 'z'; c++ {
		t[c] = true
	}
	for c := 'A'; c <= 'Z'; c++ {
		t[c] = true
	}
	for c := '0'; c <= '9'; c++ {
		t[c] = true
	}
	for _, c := range "-._~!$&'()*+,;=:@" {
		t[c] = true
	}
	return t
}()

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
// The route is NGINX's $uri for that target, written canonically:
//
//   - the query and fragment are dropped (at the first literal '?' or '#');
//     an absolute-form target ("http://host/p") contributes its path;
//   - every escape %XX is decoded, once: "%2F" is a '/', "%2e%2e" a "..",
//     "%252F" the three bytes "%2F" and nothing more;
//   - empty segments ("//", also "/%2F") are dropped, "." and ".." resolved,
//     never above the root (where NGINX answers 400 itself); a trailing
//     slash stays, as NGINX keeps it;
//   - case, ';', '\\' and trailing dots are bytes like any other: NGINX on
//     Linux routes "/ADMIN", "/admin;x" and "/admin." apart from "/admin";
//   - the decoded bytes are written back as themselves when they are
//     unreserved, sub-delims, ':' or '@', and as %XX (upper-case hex)
//     otherwise, '%' included. A '%' that starts no valid escape (NGINX
//     answers 400 to those) is a literal '%', "%25".
//
// The result always starts with "/", holds no "//", "." or ".." segment, is
// printable ASCII, and normalizing it again changes nothing. Two targets get
// one route exactly when NGINX decodes them to one $uri.
//
//	/a/../admin     -> /admin
//	/x/..%2Fadmin   -> /admin
//	/%2e%2e/admin   -> /admin
//	/%252Fadmin     -> /%252Fadmin
//	/a/./b/?x=1     -> /a/b/
//	/caf%c3%a9      -> /caf%C3%A9
//	http://h/x//y   -> /x/y
func NormalizeRoute(dst, uri []byte) []byte {
	return KeepPathParams.Normalize(dst, uri)
}

// PathParams says what a route makes of path parameters: a ';' and what
// follows it in its segment (identity.path_parameters).
type PathParams uint8

const (
	// KeepPathParams keeps them as bytes of the path, as NGINX routes it
	// (NormalizeRoute).
	KeepPathParams PathParams = iota
	// StripPathParams drops each one, as Tomcat, Jetty and Spring MVC do
	// before they resolve a path: they serve "/admin;jsessionid=1",
	// "/;x/admin" and "/x/..;/admin" as "/admin", and so this counts them.
	// An escaped ";" ("%3B") starts one too: those servers see it decoded
	// where NGINX decodes the path it sends (proxy_pass with a URI part, a
	// rewrite); where they get it escaped, a route counted without it is
	// only stricter. A route stripped so holds no ';'.
	StripPathParams
)

// ParamSlash reports whether a path parameter of uri (from a ';', literal
// or %3B, to the next literal '/') holds an escaped '/' (%2F). Stripping
// cannot say where such a parameter ends: Tomcat and Jetty strip to the
// next literal '/' before decoding (they serve "/admin;x%2F..%2Fpublic"
// as "/admin"), while NGINX, where it decodes the path it proxies, ends
// it at the decoded one ("/public"). Under StripPathParams the handler
// refuses such a request; no client needs one.
func ParamSlash(uri []byte) bool {
	path := uri
	if len(path) > 0 && path[0] != '/' {
		path = absolutePath(path)
	}
	if i := bytes.IndexAny(path, "?#"); i >= 0 {
		path = path[:i]
	}
	in := false // inside a parameter
	for i := 0; i < len(path); {
		c, n := decodeAt(path, i)
		switch {
		case n == 1 && c == '/':
			in = false
		case c == ';':
			in = true
		case n == 3 && c == '/' && in:
			return true
		}
		i += n
	}
	return false
}

// ParsePathParams reads keep or strip.
func ParsePathParams(s string) (PathParams, bool) {
	switch s {
	case "keep":
		return KeepPathParams, true
	case "strip":
		return StripPathParams, true
	}
	return KeepPathParams, false
}

// String returns keep or strip.
func (p PathParams) String() string {
	if p == StripPathParams {
		return "strip"
	}
	return "keep"
}

// Normalize appends the route of uri to dst as NormalizeRoute does, with
// path parameters kept or stripped as p says.
func (p PathParams) Normalize(dst, uri []byte) []byte {
	strip := p == StripPathParams
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
	i := 0
	for {
		mark := len(out)
		out = append(out, '/')
		more := false  // a separator ended this segment
		param := false // stripping: inside a parameter, to the segment's end
		for i < len(path) {
			c, n := decodeAt(path, i)
			i += n
			if c == '/' {
				more = true
				break
			}
			if strip && (param || c == ';') {
				// the parameter runs to the next '/', which ends the
				// segment as usual ("..;x" is ".."). A decoded ';' starts
				// one too, and a decoded '/' ends it: NGINX sends the
				// application the decoded path where proxy_pass has a
				// URI part or a rewrite ran ("/%3Bx/admin" arrives as
				// "/;x/admin").
				param = true
				continue
			}
			if routeLiteral[c] {
				out = append(out, c)
			} else {
				out = append(out, '%', hexDigits[c>>4], hexDigits[c&15])
			}
		}
		// '.' is always written literally, so the segment's written form
		// tells "." and ".." apart whatever their spelling.
		switch s := out[mark+1:]; {
		case len(s) == 0, len(s) == 1 && s[0] == '.':
			out = out[:mark]
			trailing = true
		case len(s) == 2 && s[0] == '.' && s[1] == '.':
			// Drop this segment and the one before it; at the root there
			// is nothing to drop.
			out = out[:mark]
			for j := len(out) - 1; j >= base; j-- {
				if out[j] == '/' {
					out = out[:j]
					break
				}
			}
			trailing = true
		default:
			trailing = false
		}
		if !more {
			break
		}
	}
	if len(out) == base || trailing {
		out = append(out, '/')
	}
	return out
}

// decodeAt returns the byte of path at i, decoding an escape %XX, and how
// many bytes of path it took (3 for an escape, else 1). A '%' not followed
// by two hex digits is itself.
func decodeAt(path []byte, i int) (byte, int) {
	c := path[i]
	if c != '%' || i+2 >= len(path) {
		return c, 1
	}
	hi, ok1 := unhex(path[i+1])
	lo, ok2 := unhex(path[i+2])
	if !ok1 || !ok2 {
		return c, 1
	}
	return hi<<4 | lo, 3
}

// absolutePath returns the path, query and fragment of an absolute-form
// target ("http://host:80/p?q" gives "/p?q"). A target that is not
// absolute-form is returned unchanged and NormalizeRoute roots it.
//
// The path starts at the first '/' after "scheme://", even where a '?' or
// '#' comes before it (the handler refuses such a URL: AmbiguousURL).
func absolutePath(uri []byte) []byte {
	n := schemeLen(uri)
	if n == 0 {
		return uri
	}
	rest := uri[n:]
	if j := bytes.IndexByte(rest, '/'); j >= 0 {
		return rest[j:]
	}
	return nil
}

// AmbiguousURL reports an absolute URL in which a '?' or '#' comes before
// the first '/' after "scheme://". Its path cannot be told: in
// ingress-nginx's $scheme://$http_host$request_uri the host is the
// client's Host header, which may hold '?' and '#', and $request_uri
// starts with '?' for an absolute-form target without a path ("GET
// http://a?x HTTP/1.1"), so "http://a?x/1" is Host "a?x" and /1, or Host
// "a" and / with the query x/1. The handler refuses it.
func AmbiguousURL(b []byte) bool {
	n := schemeLen(b)
	if n == 0 {
		return false
	}
	j := bytes.IndexAny(b[n:], "/?#")
	return j >= 0 && b[n+j] != '/'
}

// schemeLen is the length of the "scheme://" b starts with, or 0.
func schemeLen(b []byte) int {
	i := 0
	for i < len(b) && (isAlpha(b[i]) || i > 0 && (isDigit(b[i]) || b[i] == '+' || b[i] == '-' || b[i] == '.')) {
		i++
	}
	if i == 0 || len(b) < i+3 || b[i] != ':' || b[i+1] != '/' || b[i+2] != '/' {
		return 0
	}
	return i + 3
}

// IsAbsoluteURL reports whether b starts with a scheme and "://" (an
// absolute-form target, or X-Original-URL).
func IsAbsoluteURL(b []byte) bool { return schemeLen(b) > 0 }

// URLHost returns the host an absolute URL names, as NGINX makes $host of
// the same Host header: the authority up to its port (outside an IPv6
// literal's brackets), less its trailing dots; the caller lowercases it.
// ok is false when b is not an absolute URL. (ingress-nginx's
// X-Original-URL carries the client's Host header there, while the client
// may send any X-Original-Host of its own.)
func URLHost(b []byte) (host []byte, ok bool) {
	n := schemeLen(b)
	if n == 0 {
		return nil, false
	}
	a := b[n:]
	if j := bytes.IndexAny(a, "/?#"); j >= 0 {
		a = a[:j]
	}
	return hostOnly(a), true
}

// hostOnly returns the host of an authority or Host header value: without
// a port (a colon outside an IPv6 literal's brackets ends the host) and
// without a trailing dot, as NGINX's $host has it. NGINX refuses a host
// ending in two dots; a proxy that passes one on must not make it a host
// of its own, so every trailing dot goes. It returns a subslice of a.
func hostOnly(a []byte) []byte {
	if len(a) > 0 && a[0] == '[' {
		// an IPv6 literal ends at its bracket, whatever follows, as NGINX
		// ends it ("[a]b:80" is "[a]"); without one the value is kept
		// whole, as NGINX keeps it ("[::1:80")
		if i := bytes.IndexByte(a, ']'); i >= 0 {
			return a[:i+1]
		}
		return a
	}
	if i := bytes.IndexByte(a, ':'); i >= 0 {
		a = a[:i]
	}
	for len(a) > 0 && a[len(a)-1] == '.' {
		a = a[:len(a)-1]
	}
	return a
}

// AppendHost appends the host of b as /auth counts it: hostOnly, in lower
// case (host names are case-insensitive). NGINX lower-cases $host in ASCII
// only; a host with other bytes (raw UTF-8, which no browser sends: they
// send punycode) is lower-cased in Unicode as well, so that "bÜcher" and
// "bücher" are one host to a rule keyed on it, as they are to match.host
// (strings.EqualFold), and an exception written in either case names it.
func AppendHost(dst, b []byte) []byte {
	h := hostOnly(b)
	n := len(dst)
	for _, c := range h {
		if c >= utf8.RuneSelf {
			return appendLowerUnicode(dst[:n], h)
		}
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		dst = append(dst, c)
	}
	return dst
}

// appendLowerUnicode appends h lower-cased rune by rune, except where a
// rune would become ASCII (the Kelvin sign's k, İ's i): a host spelled with
// one of those must not become the ASCII host an exception or a limit was
// written for, as NGINX serves it from another server block. Bytes that are
// not UTF-8 are kept as they are.
//
// A letter is written as the lower case of its upper case: some capitals
// have two lower-case forms (Σ: σ and the final ς; Β: β and ϐ; Μ: μ and the
// micro sign µ), which strings.EqualFold, and so match.host, holds one
// letter. Lowered alone, "ΣΑΣ" would be "σασ" and "σας" another host.
func appendLowerUnicode(dst, h []byte) []byte {
	for len(h) > 0 {
		r, size := utf8.DecodeRune(h)
		if r == utf8.RuneError && size <= 1 {
			dst = append(dst, h[0])
			h = h[1:]
			continue
		}
		l := unicode.ToLower(r)
		if f := unicode.ToLower(unicode.ToUpper(r)); f >= utf8.RuneSelf {
			l = f
		}
		if r < utf8.RuneSelf || l >= utf8.RuneSelf {
			r = l
		}
		dst = utf8.AppendRune(dst, r)
		h = h[size:]
	}
	return dst
}

// HostProblem says how a configured host differs from every host /auth
// counts ("" when it does not): "write api.example.com" for
// "API.example.com:443." and the like. The case of letters beyond ASCII is
// not a problem (the callers lower-case v first, and AppendHost folds
// what lower-casing leaves: "σας" is the host "σασ").
func HostProblem(v string) string {
	if len(hostOnly([]byte(v))) != len(v) || strings.ContainsFunc(v, func(c rune) bool { return 'A' <= c && c <= 'Z' }) {
		return fmt.Sprintf("is not a host as /auth counts it (no port, no trailing dot, lower case); write %q", AppendHost(nil, []byte(v)))
	}
	return ""
}

func isAlpha(c byte) bool { return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' }
func isDigit(c byte) bool { return '0' <= c && c <= '9' }
