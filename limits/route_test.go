package limits

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

func TestNormalizeRoute(t *testing.T) {
	tests := []struct{ in, want string }{
		// The contract table.
		{"/a/../admin", "/admin"},
		{"//x", "/x"},
		{"/%2e%2e/admin", "/admin"},
		{"/admin?x", "/admin"},
		{"/a/./b/", "/a/b/"},
		{"/%7euser", "/~user"},
		{"/a%2fb", "/a/b"},
		{"/x/..%2Fadmin", "/admin"},
		{"/%252Fadmin", "/%252Fadmin"},

		// Empty and root.
		{"", "/"},
		{"/", "/"},
		{"?x=1", "/"},
		{"#frag", "/"},
		{"//", "/"},
		{"///", "/"},

		// Dot segments, never above the root, trailing slash as RFC 3986.
		{"/..", "/"},
		{"/../..", "/"},
		{"/../../etc/passwd", "/etc/passwd"},
		{"/.", "/"},
		{"/a/.", "/a/"},
		{"/a/..", "/"},
		{"/a/b/..", "/a/"},
		{"/a/b/../c", "/a/c"},
		{"/a/b/../../../c", "/c"},
		{"/a//b///c", "/a/b/c"},
		{"/a/b/", "/a/b/"},
		{"/a/b//", "/a/b/"},
		{"/...", "/..."},
		{"/a/.../b", "/a/.../b"},
		{"/.a/..b/b..", "/.a/..b/b.."},
		{"/%2E", "/"},
		{"/%2e%2E", "/"},
		{"/a/.%2e/b", "/b"},
		{"/a/%2e./b", "/b"},

		// Escapes: all decoded once; bytes that are not pchar written
		// back upper-case.
		{"/%41%62%63", "/Abc"},
		{"/%2D%2e%5F%7E", "/-._~"},
		{"/%21%24%3b%3D%3a%40", "/!$;=:@"},
		{"/%2f", "/"},
		{"/a%2F..%2Fadmin", "/admin"},
		{"/a%2F%2Fb%2f", "/a/b/"},
		{"/%2e%2e%2fadmin", "/admin"},
		{"/%c3%a9", "/%C3%A9"},
		{"/%3f", "/%3F"},
		{"/%25", "/%25"},
		{"/%2541", "/%2541"},
		{"/%", "/%25"},
		{"/%4", "/%254"},
		{"/%zz", "/%25zz"},
		{"/%%34%31", "/%2541"},
		{"/a%20b", "/a%20b"},
		{"/a b", "/a%20b"},
		{"/caf\xc3\xa9", "/caf%C3%A9"},
		{"/\x00\x7f", "/%00%7F"},
		{"/a\\b", "/a%5Cb"},
		{"/{x}", "/%7Bx%7D"},
		{"/a:b@c!$&'()*+,;=", "/a:b@c!$&'()*+,;="},

		// Query and fragment.
		{"/a?b/../c", "/a"},
		{"/a#b?c", "/a"},
		{"/a%3Fb?c", "/a%3Fb"},

		// Absolute form and other non-origin forms.
		{"http://example.com/a/../b?x", "/b"},
		{"https://example.com", "/"},
		{"https://example.com?x", "/"},
		{"http://a?b/login", "/login"}, // ingress-nginx: Host "a?b", $request_uri "/login"
		{"http://a#b/login?q", "/login"},
		{"http://a?b#c", "/"},
		{"HTTP://u@h:80//p", "/p"},
		{"svn+ssh://h/p", "/p"},
		{"admin", "/admin"},
		{"*", "/*"},
		{"http:/x", "/http:/x"},
		{"1http://h/p", "/1http:/h/p"},
	}
	for _, tt := range tests {
		got := NormalizeRoute(nil, []byte(tt.in))
		if string(got) != tt.want {
			t.Errorf("NormalizeRoute(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestStripPathParams: with identity.path_parameters: strip, a target is
// counted as Tomcat, Jetty and Spring MVC serve it: every ";..." up to the
// next '/' goes, so a parameter cannot carry a target out of a match.path
// prefix ("/;x/admin" is "/admin") and "..;" is "..". An escaped ';' starts
// one too (NGINX decodes it where it rewrites the path it proxies), and a
// match.path also holds on NGINX's own route: "/admin/..;/x", which NGINX
// sends to the /admin/ location, counts as /x and is still under /admin.
func TestStripPathParams(t *testing.T) {
	for in, want := range map[string]string{
		"/admin;jsessionid=1":      "/admin",
		"/admin;jsessionid=1?x=;y": "/admin",
		"/;x/admin":                "/admin",
		"/;jsessionid=1/admin":     "/admin",
		"/x/..;/admin":             "/admin",
		"/static/..;/admin/users":  "/admin/users",
		"/a;p=1/b;q=2/":            "/a/b/",
		"/a;p%2F..%2F/b":           "/b", // a decoded '/' ends a parameter, as NGINX's $uri has it
		"/a%3Bb":                   "/a", // NGINX sends "/a;b" where it decodes the path it proxies
		"/a%3bb;c":                 "/a",
		"/%3Bfoo/admin":            "/admin",
		"/x/..%3B/admin":           "/admin",
		"/%2e%2e;x/admin":          "/admin",
		"http://h/x/..;/admin;a?b": "/admin",
		"/admin":                   "/admin",
		"/x/..%2Fadmin":            "/admin",
		";":                        "/",
	} {
		if got := string(StripPathParams.Normalize(nil, []byte(in))); got != want {
			t.Errorf("StripPathParams.Normalize(%q) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[string]string{"/;x/admin": "/;x/admin", "/x/..;/admin": "/x/..;/admin", "/a%3Bb": "/a;b"} {
		if got := string(NormalizeRoute(nil, []byte(in))); got != want {
			t.Errorf("NormalizeRoute(%q) = %q, want %q (NGINX keeps parameters)", in, got, want)
		}
	}
	r := &Rule{Name: "admin", Match: Match{PathPrefix: "/admin"}}
	re := &Rule{Name: "admin-re", Match: Match{PathRegex: regexp.MustCompile(`^/admin(/|$)`)}}
	for _, in := range []string{"/;x/admin", "/x/..;/admin", "/static/..;/admin/users", "/admin;x",
		"/%3Bfoo/admin", "/x/..%3B/admin", "/admin/..;/x", "/admin/%2e%2e;/x", "/admin/x/..;/..;/y"} {
		req := &Request{Route: StripPathParams.Normalize(nil, []byte(in))}
		if kept := NormalizeRoute(nil, []byte(in)); !bytes.Equal(kept, req.Route) {
			req.NginxRoute = kept
		}
		for _, rule := range []*Rule{r, re} {
			if !rule.Matches(req) {
				t.Errorf("%q (route %q, NGINX's %q) escapes %s with parameters stripped", in, req.Route, req.NginxRoute, rule.Name)
			}
		}
	}
	for uri, want := range map[string]bool{
		"/admin;x%2F..%2Fpublic": true, "/admin;%2f..": true, "/a%3Bx%2F../b": true, "/a;b/c%2Fd": false,
		"/a%2F;b": false, "/a;b%252F": false, "/a;b/?c=%2F": false, "http://h/a;%2F": true, "/a;b": false,
	} {
		if got := ParamSlash([]byte(uri)); got != want {
			t.Errorf("ParamSlash(%q) = %v, want %v", uri, got, want)
		}
	}
	for _, s := range []string{"keep", "strip"} {
		if p, ok := ParsePathParams(s); !ok || p.String() != s {
			t.Errorf("ParsePathParams(%q) = %v, %v", s, p, ok)
		}
	}
	if _, ok := ParsePathParams("Strip"); ok {
		t.Error("ParsePathParams takes Strip")
	}
}

func TestNormalizeRouteAppendsToDst(t *testing.T) {
	dst := []byte("keep/")
	got := NormalizeRoute(dst, []byte("/../../x"))
	if string(got) != "keep//x" {
		t.Fatalf("got %q, want %q: '..' must not eat into dst", got, "keep//x")
	}
}

// checkRoute reports how r breaks NormalizeRoute's invariants, or "".
func checkRoute(r []byte) string { return checkRouteOf(r, KeepPathParams) }

// checkRouteOf reports how r breaks p.Normalize's invariants, or "":
// stripping, a route holds no literal ';' (it escapes a decoded one).
func checkRouteOf(r []byte, p PathParams) string {
	if p == StripPathParams && (bytes.IndexByte(r, ';') >= 0 || bytes.Contains(r, []byte("%3B"))) {
		return "contains a ';' with parameters stripped"
	}
	switch {
	case len(r) == 0 || r[0] != '/':
		return "does not start with /"
	case bytes.Contains(r, []byte("//")):
		return "contains //"
	case bytes.Contains(r, []byte("/./")) || bytes.HasSuffix(r, []byte("/.")):
		return "contains a . segment"
	case bytes.Contains(r, []byte("/../")) || bytes.HasSuffix(r, []byte("/..")):
		return "contains a .. segment"
	case bytes.ContainsAny(r, "?#"):
		return "contains a query or fragment"
	}
	for i, c := range r {
		if c <= ' ' || c >= 0x7f {
			return "contains a byte that is not printable ASCII"
		}
		if c != '%' {
			if !routeLiteral[c] && c != '/' {
				return "contains a byte that should be escaped"
			}
			continue
		}
		// Every escape is canonical: upper-case hex of a byte that is not
		// written literally ('/' and '.' never: they were decoded).
		if i+2 >= len(r) || !isUpperHex(r[i+1]) || !isUpperHex(r[i+2]) {
			return "contains a '%' that is not a canonical escape"
		}
		hi, _ := unhex(r[i+1])
		lo, _ := unhex(r[i+2])
		if d := hi<<4 | lo; routeLiteral[d] || d == '/' {
			return "escapes a byte that is written literally"
		}
	}
	return ""
}

func isUpperHex(c byte) bool { return '0' <= c && c <= '9' || 'A' <= c && c <= 'F' }

func FuzzNormalizeRoute(f *testing.F) {
	for _, s := range []string{
		"", "/", "//x", "/a/../admin", "/%2e%2e/admin", "/admin?x", "/a/./b/",
		"/%7euser", "/a%2fb", "/%%34%31", "http://h/a/../b", "/a/b/..", "/\xff%",
		"/.%2e/.%2E/x", "a://b", "/%25%32%65", "/x/..;/admin", "/;x/admin", "/a%3Bb;c", "/a;b%2Fc/d",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, uri []byte) {
		r := NormalizeRoute(nil, uri)
		if why := checkRoute(r); why != "" {
			t.Fatalf("NormalizeRoute(%q) = %q: %s", uri, r, why)
		}
		if again := NormalizeRoute(nil, r); !bytes.Equal(again, r) {
			t.Fatalf("not idempotent: %q -> %q -> %q", uri, r, again)
		}
		// Stripping is keeping what is left: the same route as the target
		// without its parameters, and a route of its own kind.
		s := StripPathParams.Normalize(nil, uri)
		if why := checkRouteOf(s, StripPathParams); why != "" {
			t.Fatalf("StripPathParams.Normalize(%q) = %q: %s", uri, s, why)
		}
		if again := StripPathParams.Normalize(nil, s); !bytes.Equal(again, s) {
			t.Fatalf("stripping not idempotent: %q -> %q -> %q", uri, s, again)
		}
		if bytes.IndexByte(uri, ';') < 0 && bytes.IndexByte(r, ';') < 0 && !bytes.Equal(s, r) {
			t.Fatalf("%q without parameters: stripped %q, kept %q", uri, s, r)
		}
	})
}

func TestAmbiguousURL(t *testing.T) {
	for in, want := range map[string]bool{
		"http://a?x/1": true, "https://a#b/c": true, "HTTP://a:80?x": true, "http://a?": true,
		"http://a/?x": false, "http://a": false, "http:///x": false, "/a?b/c": false, "a?b": false, "http://[::1]/x?y": false,
	} {
		if got := AmbiguousURL([]byte(in)); got != want {
			t.Errorf("AmbiguousURL(%q) = %v, want %v", in, got, want)
		}
	}
}

// TestURLHost: an absolute URL's host as NGINX makes $host of the same
// Host header (checked against nginx 1.22: "Api.Example.com.:8080" is
// api.example.com, "[::1]:8080" is [::1], "a:b:c" is a, "a@b" stays a@b).
func TestURLHost(t *testing.T) {
	for in, want := range map[string]string{
		"https://shop.example.com/x?q=1": "shop.example.com",
		"http://Api.Example.com.:8080/":  "Api.Example.com",
		"http://[::1]:8080/x":            "[::1]",
		"http://[2001:db8::1]/x":         "[2001:db8::1]",
		"http://a:b:c/x":                 "a",
		"http://a@b/x":                   "a@b",
		"https://h":                      "h",
		"https://h?x":                    "h",
		"http:///x":                      "",
		"http://./x":                     "",
		"x://":                           "",
	} {
		got, ok := URLHost([]byte(in))
		if !ok || string(got) != want {
			t.Errorf("URLHost(%q) = %q, %v; want %q, true", in, got, ok, want)
		}
	}
	for _, in := range []string{"/x", "h/x", "", "//h/x", "1http://h/"} {
		if got, ok := URLHost([]byte(in)); ok {
			t.Errorf("URLHost(%q) = %q, true; want not an absolute URL", in, got)
		}
	}
}

// TestAppendHost: a host is counted without its port and its trailing dots
// (a colon inside an IPv6 literal is no port), in lower case; a
// configured host that is not already so is named, with what to write.
func TestAppendHost(t *testing.T) {
	for in, want := range map[string]string{
		"api.example.com":        "api.example.com",
		"API.Example.COM.":       "api.example.com",
		"api.example.com:443":    "api.example.com",
		"api.example.com.:443":   "api.example.com",
		"api.example.com..":      "api.example.com", // NGINX refuses it; another proxy may not
		"api.example.com...:1":   "api.example.com",
		"[2001:DB8::1]:8080":     "[2001:db8::1]",
		"[2001:db8::1]":          "[2001:db8::1]",
		"[2001:db8::1]x:80":      "[2001:db8::1]", // NGINX's $host ends at the bracket
		"[2001:db8::1].":         "[2001:db8::1]",
		"[::1:80":                "[::1:80", // no closing bracket: NGINX's $host keeps it whole
		"192.0.2.1:80":           "192.0.2.1",
		"":                       "",
		"\u00c9vil.example":      "\u00e9vil.example", // NGINX's $host lowers ASCII only; one host in two cases is one quota
		"b\u00dccher.example":    "b\u00fccher.example",
		"b\xffX.example":         "b\xffx.example",    // a byte that is not UTF-8 is kept
		"\u212Aexample.com":      "\u212Aexample.com", // the Kelvin sign is not the k of kexample.com
		"\u0130nfo.example":      "\u0130nfo.example", // nor İ the i of info.example
		"user@api.example.com:1": "user@api.example.com",
	} {
		if got := string(AppendHost(nil, []byte(in))); got != want {
			t.Errorf("AppendHost(%q) = %q, want %q", in, got, want)
		}
	}
	if msg := HostProblem("api.example.com"); msg != "" {
		t.Errorf("HostProblem of a plain host: %q", msg)
	}
	for _, v := range []string{"api.example.com:443", "api.example.com.", "API.example.com", "api.example.com.."} {
		if msg := HostProblem(v); !strings.Contains(msg, `write "api.example.com"`) {
			t.Errorf("HostProblem(%q) = %q", v, msg)
		}
	}
}
