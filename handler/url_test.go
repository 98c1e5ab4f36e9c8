package handler

import (
	"fmt"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// ingress are the headers ingress-nginx's auth-url subrequest sets
// (rootfs/etc/nginx/template/nginx.tmpl): no X-Original-URI unless an
// auth-method is configured, the full URL instead.
func ingress(url, ip string, more ...string) []string {
	return append([]string{
		"X-Original-URL", url,
		"X-Original-Method", "GET",
		"X-Sent-From", "nginx-ingress-controller",
		"X-Real-IP", ip,
		"X-Forwarded-For", ip,
		"X-Auth-Request-Redirect", "/ignored",
		"Host", "auth.example", // the auth service's host
	}, more...)
}

// TestOriginalURL: without X-Original-URI the route comes from
// X-Original-URL, normalized as any URI.
func TestOriginalURL(t *testing.T) {
	rec := &recorder{got: make(chan string, 1)}
	ts := serve(t, New(rec, nil, Options{}))
	for _, tt := range []struct{ url, route, host string }{
		{"https://shop.example.com/x/..%2Fadmin?q=1", "/admin", "shop.example.com"},
		{"http://Shop.Example.com.:8080//admin/./list", "/admin/list", "shop.example.com"},
		{"https://shop.example.com", "/", "shop.example.com"},
		{"https://h/?next=x", "/", "h"},
		{"/admin?q", "/admin", "auth.example"}, // a path alone is fine too (no host in it)
	} {
		equal(t, 204, ts.auth(t, ingress(tt.url, "192.0.2.1")...).status, "%s", tt.url)
		equal(t, "method=GET route="+tt.route+" host="+tt.host+" ip=192.0.2.1 user= cost=0", recv(t, rec.got), "%s", tt.url)
	}
	// X-Original-URI, when present, wins.
	ts.auth(t, ingress("https://h/from-url", "192.0.2.1", "X-Original-URI", "/from-uri")...)
	equal(t, "method=GET route=/from-uri host=auth.example ip=192.0.2.1 user= cost=0", recv(t, rec.got))
	// ingress-nginx passes the client's own headers on: an X-Original-Host
	// of the client's cannot name another host than the URL's.
	ts.auth(t, ingress("https://shop.example.com/a", "192.0.2.1", "X-Original-Host", "other.example")...)
	equal(t, "method=GET route=/a host=shop.example.com ip=192.0.2.1 user= cost=0", recv(t, rec.got))
}

// TestOriginalURLHostRule: a rule matched on a host applies to ingress
// requests for that host (X-Original-URL's), whatever X-Original-Host the
// client sends along.
func TestOriginalURLHostRule(t *testing.T) {
	r := rule("shop", 2, time.Minute, limits.KeyIP)
	r.Match.Host = "shop.example.com"
	ts := pinned(t, Options{}, r)
	for i, want := range []int{204, 204, 429} {
		equal(t, want, ts.auth(t, ingress("https://shop.example.com/api", "192.0.2.1", "X-Original-Host", fmt.Sprint("spoof", i, ".example"))...).status,
			"request %d", i+1)
	}
	equal(t, 204, ts.auth(t, ingress("https://other.example/api", "192.0.2.1")...).status, "another host: no rule")
}

// recv is what the recorder saw, or "" when nothing was decided.
func recv(t *testing.T, got chan string) string {
	t.Helper()
	select {
	case s := <-got:
		return s
	case <-time.After(100 * time.Millisecond):
		return ""
	}
}

// TestOriginalURLDecisions: a rule keyed on route and ip decides ingress
// requests by the URL's path.
func TestOriginalURLDecisions(t *testing.T) {
	ts := pinned(t, Options{}, rule("r", 2, time.Minute, limits.KeyRoute, limits.KeyIP))
	equal(t, "1", ts.auth(t, ingress("https://h/api/items?page=1", "192.0.2.1")...).headers["x-ratelimit-remaining"])
	equal(t, "0", ts.auth(t, ingress("https://h/api//items?page=2", "192.0.2.1")...).headers["x-ratelimit-remaining"])
	equal(t, 429, ts.auth(t, ingress("https://other.example/api/x/../items", "192.0.2.1")...).status)
	equal(t, "1", ts.auth(t, ingress("https://h/api/items", "192.0.2.2")...).headers["x-ratelimit-remaining"], "another ip")
	equal(t, "1", ts.auth(t, ingress("https://h/api/other", "192.0.2.1")...).headers["x-ratelimit-remaining"], "another route")
}

func TestOriginalURLBadRequests(t *testing.T) {
	ts := pinned(t, Options{}, rule("r", 5, time.Minute, limits.KeyIP))
	const neither = "missing X-Original-URI and X-Original-URL headers: add \"proxy_set_header X-Original-URI $request_uri;\" to the auth location" +
		" (ingress-nginx's auth-url sets \"X-Original-URL $scheme://$http_host$request_uri\")\n"
	const bad = "invalid X-Original-URL header: want an absolute URL such as https://host/path?query," +
		" as \"proxy_set_header X-Original-URL $scheme://$http_host$request_uri;\" sets it\n"
	const ambiguous = "ambiguous absolute URL: a '?' or '#' comes before the first '/' after the host," +
		" so the path cannot be told from the Host header the client sent\n"
	for _, tt := range []struct {
		name string
		kv   []string
		body string
	}{
		{"neither", []string{"X-Real-IP", "192.0.2.1"}, neither},
		{"both empty", []string{"X-Original-URI", "", "X-Original-URL", "", "X-Real-IP", "192.0.2.1"}, neither},
		{"not a URL", []string{"X-Original-URL", "shop.example.com/admin", "X-Real-IP", "192.0.2.1"}, bad},
		{"no scheme", []string{"X-Original-URL", "://h/admin", "X-Real-IP", "192.0.2.1"}, bad},
		// Host "a?x" and /1, or Host "a" and / with the query x/1 (an
		// absolute-form target without a path): refused either way.
		{"'?' before the path", []string{"X-Original-URL", "http://a?x/1", "X-Real-IP", "192.0.2.1"}, ambiguous},
		{"'#' before the path", []string{"X-Original-URL", "https://a#b/admin?q", "X-Real-IP", "192.0.2.1"}, ambiguous},
		{"a query and no path", []string{"X-Original-URL", "https://shop.example.com?next=/admin", "X-Real-IP", "192.0.2.1"}, ambiguous},
		{"in X-Original-URI", []string{"X-Original-URI", "HTTP://a:80?x/2", "X-Real-IP", "192.0.2.1"}, ambiguous},
	} {
		equal(t, reply{status: 400, body: tt.body, headers: map[string]string{}}, ts.auth(t, tt.kv...), tt.name)
	}

	// Custom names appear in the messages.
	ts = pinned(t, Options{URIHeader: "X-Uri", URLHeader: "X-Url"}, rule("r", 5, time.Minute, limits.KeyIP))
	equal(t, "missing X-Uri and X-Url headers: add \"proxy_set_header X-Uri $request_uri;\" to the auth location"+
		" (or \"proxy_set_header X-Url $scheme://$http_host$request_uri;\")\n", ts.auth(t, "X-Real-IP", "192.0.2.1").body)
	equal(t, 204, ts.auth(t, "X-Url", "https://h/x", "X-Real-IP", "192.0.2.1").status)

	// One header for both: ingress-nginx setups that read only the URL.
	ts = pinned(t, Options{URIHeader: "X-Original-URL", URLHeader: "X-Original-URL"}, rule("r", 5, time.Minute, limits.KeyIP))
	equal(t, "missing X-Original-URL header: add \"proxy_set_header X-Original-URL $scheme://$http_host$request_uri;\" to the auth location\n",
		ts.auth(t, "X-Real-IP", "192.0.2.1").body)
	equal(t, 204, ts.auth(t, "X-Original-URL", "https://h/x", "X-Real-IP", "192.0.2.1").status)
}
