package limits

import (
	"bytes"
	"testing"
)

// nginxURI holds, for request targets a client may send, the $uri NGINX
// 1.22.1 routes them by (ngx_http_parse_complex_uri with merge_slashes on, the
// default), as observed with real nginx: `location / { return 200 "$uri"; }`
// and curl --path-as-is. "" means NGINX answers 400 itself and never asks
// rategate. $request_uri, which rategate receives, is the target itself for
// origin-form and its path and query for absolute-form.
var nginxURI = []struct{ target, uri string }{
	{"/admin", "/admin"},
	{"/%2Fadmin", "/admin"},
	{"/%2fadmin", "/admin"},
	{"/x/..%2Fadmin", "/admin"},
	{"/x%2F..%2Fadmin", "/admin"},
	{"/a/b/..%2f..%2fadmin", "/admin"},
	{"/x/%2e%2e/admin", "/admin"},
	{"/x/.%2E/admin", "/admin"},
	{"/adm%69n", "/admin"},
	{"//admin", "/admin"},
	{"/admin?%2F", "/admin"},
	{"/admin/.", "/admin/"},
	{"/admin/..", "/"},
	{"/admin%2F", "/admin/"},
	{"/%252Fadmin", "/%2Fadmin"}, // one decoding only: a literal "%2F", not a slash
	{"/admin;x", "/admin;x"},     // no path parameters: ';' is a byte like any other
	{"/admin%3b", "/admin;"},
	{"/ADMIN", "/ADMIN"}, // case-sensitive
	{"/admin.", "/admin."},
	{"/admin%20", "/admin "},
	{"/a%3Fb", "/a?b"},
	{"/a%23b", "/a#b"},
	{"/a\\b", "/a\\b"}, // a backslash is no separator (except on Windows)
	{"/%5Cadmin", "/\\admin"},
	{"/x/..%5cadmin", "/x/..\\admin"},
	{"/%C3%A9", "/\xc3\xa9"},
	{"/caf\xc3\xa9", "/caf\xc3\xa9"},
	{"/a%0d%0ab", "/a\r\nb"},
	{"/x/.../admin", "/x/.../admin"},
	{"/x/.%2e.", "/x/..."},
	{"/.", "/"},
	{"/%2e", "/"},
	{"/x/.", "/x/"},
	{"/x/..", "/"},
	{"/+", "/+"},
	// absolute-form: $request_uri is what follows the authority
	{"http://h/%2Fadmin", "/admin"},
	{"HTTP://h:1//admin?x", "/admin"},
	{"https://h/x/../admin", "/admin"},
	{"http://h", "/"},
	{"http://h?x=1", "/"},
	// NGINX refuses these with 400.
	{"/../admin", ""},
	{"/x/../../admin", ""},
	{"/.%2e/admin", ""},
	{"/%2E%2E", ""},
	{"/admin/..%2F..", ""},
	{"/%00admin", ""},
	{"/%zzadmin", ""},
	{"/%", ""},
	{"/%4", ""},
	{"/a%2", ""},
}

// canonical writes a decoded path the way NormalizeRoute represents it:
// unreserved characters, sub-delims, ':' and '@' as themselves, every other
// byte (including '%') as %XX with upper-case hex.
func canonical(decoded string) string {
	var b bytes.Buffer
	for i := 0; i < len(decoded); i++ {
		c := decoded[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9',
			bytes.IndexByte([]byte("-._~!$&'()*+,;=:@/"), c) >= 0:
			b.WriteByte(c)
		default:
			b.WriteByte('%')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		}
	}
	return b.String()
}

// TestNormalizeRouteIsNginxURI: the route of every request target NGINX
// accepts is NGINX's own $uri, written canonically. The route rategate
// counts is the route NGINX routes.
func TestNormalizeRouteIsNginxURI(t *testing.T) {
	for _, tt := range nginxURI {
		if tt.uri == "" {
			continue
		}
		want := canonical(tt.uri)
		if got := string(NormalizeRoute(nil, []byte(tt.target))); got != want {
			t.Errorf("NormalizeRoute(%q) = %q; NGINX routes it as $uri %q, so want %q", tt.target, got, tt.uri, want)
		}
	}
}

// TestNormalizeRouteRejectedByNginx: targets NGINX refuses never reach
// rategate from NGINX; another proxy may send them. They still get a route
// that keeps the invariants (rooted, no dot segments, printable ASCII).
func TestNormalizeRouteRejectedByNginx(t *testing.T) {
	for _, tt := range nginxURI {
		if tt.uri != "" {
			continue
		}
		r := NormalizeRoute(nil, []byte(tt.target))
		if why := checkRoute(r); why != "" {
			t.Errorf("NormalizeRoute(%q) = %q: %s", tt.target, r, why)
		}
	}
}

// TestNormalizeRouteUnambiguous: different decoded paths never share a
// route. In particular a byte that arrived as %25 stays a percent sign.
func TestNormalizeRouteUnambiguous(t *testing.T) {
	pairs := [][2]string{
		{"/%252Fadmin", "/admin"},
		{"/%252Fadmin", "/%2Fadmin"},
		{"/%2541", "/A"},
		{"/%25", "/"},
		{"/a%3Fb", "/a"},
		{"/a%23b", "/a"},
		{"/a%2Fb", "/a%252Fb"},
		{"/%2e%2e%252F", "/%2F"},
		{"/a%20b", "/a+b"},
		{"/ADMIN", "/admin"},
		{"/admin.", "/admin"},
		{"/admin;x", "/admin"},
		{"/%5Cadmin", "/admin"},
	}
	for _, p := range pairs {
		a, b := NormalizeRoute(nil, []byte(p[0])), NormalizeRoute(nil, []byte(p[1]))
		if bytes.Equal(a, b) {
			t.Errorf("%q and %q both give route %q; NGINX routes them apart", p[0], p[1], a)
		}
	}
}
