//go:build e2e

package e2e

import (
	"testing"
)

// uriFailureMap is the failure policy docs/nginx.md and
// rategate-upstream.conf suggest for a path that must never pass
// unlimited: "map $uri $rategate_on_failure { default open; ~^/login
// closed; }", written over the shipped map.
var uriFailureMap = map[string]string{
	"map $host $rategate_on_failure {": "map $uri $rategate_on_failure { ~^/login closed;",
}

// TestFailureMapOnURI: with every rategate instance down, a path the
// failure map names closed gets 503, in every variant, whichever spelling
// of it the client sends; other paths pass (open).
//
// In the auth_request variants (plain, quiet, behind an auth layer) the
// map was never evaluated in the client's request: its first reader is
// @rategate_unavailable, inside the subrequest to /_rategate_auth, where
// $uri is "/_rategate_auth". So "~^/login closed" never matched and /login
// passed unlimited (200, X-RateLimit-Status: bypassed) whenever rategate
// was down or slower than 250 ms: the documented fail-closed setting
// failed open. (The Lua variant reads the map in the client's request and
// was right.)
func TestFailureMapOnURI(t *testing.T) {
	m := startMini(t)
	needLuaModule(t)
	auth := startAuthLayer(t)
	dead := deadAddr(t)
	for _, v := range []struct {
		name, conf string
		auth       bool
	}{
		{"plain", "nginx.conf", false},
		{"quiet", "nginx-quiet.conf", false},
		{"lua", "openresty.conf", false},
		{"auth", "nginx-auth.conf", true},
		{"auth-lua", "openresty-auth.conf", true},
	} {
		t.Run(v.name, func(t *testing.T) {
			rw := rewrite{rategates: []string{dead}, app: m.app.addr, extra: uriFailureMap}
			if v.auth {
				rw.auth = auth.addr
			}
			nx := startNginx(t, v.name, v.conf, rw)
			session := []string{"Cookie: session=u-alice"}
			for _, c := range []struct {
				path string
				want int
			}{
				{"/login", 503},
				{"/%6Cogin", 503}, // NGINX's $uri is /login
				{"//login?next=/", 503},
				{"/x", 200},
			} {
				r := nx.do(t, request{Path: c.path, Header: session})
				if r.Status != c.want {
					detail := ""
					if r.Status == 200 {
						detail = " (passed unlimited, X-RateLimit-Status: " + echo(t, r).XRateLimitStatus + ")"
					}
					t.Errorf("%s with rategate down and %q closed: %d%s, want %d", c.path, "~^/login", r.Status, detail, c.want)
				}
			}
		})
	}
}
