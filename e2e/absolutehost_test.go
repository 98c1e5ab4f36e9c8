//go:build e2e

package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// namedHostsConf is the configuration docs/nginx.md asks for before a rule
// may match or key on the host: a default_server that refuses every host
// it does not name, and the protected server named by server_name. SERVER
// is the rategate snippet of the variant under test.
// variantHead starts a test's own nginx.conf: the shipped upstream and
// identity snippets, the rategate log format and the application's
// upstream; variantConf makes it the plain or the Lua variant.
const variantHead = "LUA\n" + confHead + `    lua_package_path "$prefix/?.lua;;";
    include rategate-upstream.conf;
    include rategate-identity-demo.conf;
    access_log logs/access.log rategate;
    upstream app { server 127.0.0.1:8001; }
`

// variantConf returns conf (variantHead and its own servers) for the Lua
// variant (the Lua modules loaded) or the plain one (no Lua at all).
func variantConf(conf string, lua bool) string {
	if lua {
		return strings.Replace(conf, "LUA\n", "include lua-modules.conf;\n", 1)
	}
	return strings.NewReplacer("LUA\n", "", `    lua_package_path "$prefix/?.lua;;";`+"\n", "").Replace(conf)
}

const namedHostsConf = variantHead + `    server {
        listen 8000;
        server_name _;
        location = /nginx-health { return 200 "ok\n"; }
        location / { return 444; }
    }
    server {
        listen 8000;
        server_name api.example;
        include SERVER;
        location / {
            proxy_pass http://app;
            proxy_set_header Host $host;
            proxy_set_header X-Location api;
        }
    }
}
`

// TestAbsoluteFormHostIsTheServedHost: a request whose target is in
// absolute form ("GET http://api.example/x HTTP/1.1") names its host in the
// request line, and NGINX serves it from the server of that host whatever
// the Host header says: server selection, $host and the Host the
// application gets are all the request line's. rategate must count it
// under that host too. The client exhausts api.example's quota with
// ordinary requests, then sends the absolute form with another Host
// header: NGINX serves it from api.example's server, so it must be a 429.
//
// In the Lua variant it was not: the subrequest ngx.location.capture makes
// computes $host from the client's Host header, so rategate counted the
// request for whichever host the client wrote there, and a rule on
// api.example never saw it (rategate_access.lua now sets the Host header
// of such a request to the host NGINX serves before it asks).
func TestAbsoluteFormHostIsTheServedHost(t *testing.T) {
	m := startMini(t)
	rg := m.rategate(t, "rategate", policy(429, "ah", "", `    - name: api-host
      match: {host: api.example}
      key: [ip]
      algorithm: fixed_window
      limit: 2
      period: 24h
`))
	needWindow(t, window, 30*time.Second)
	for i, v := range []struct {
		name, server string
		lua          bool
	}{
		{"plain", "rategate.conf", false},
		{"lua", "rategate-lua.conf", true},
	} {
		t.Run(v.name, func(t *testing.T) {
			if v.lua {
				needLuaModule(t)
			}
			conf := variantConf(strings.Replace(namedHostsConf, "SERVER", v.server, 1), v.lua)
			nx := startNginx(t, v.name, "named-hosts.conf", rewrite{
				rategates: []string{rg.addr()}, app: m.app.addr, files: map[string]string{"named-hosts.conf": conf},
			})
			from := fmt.Sprintf("127.0.20.%d", 10+i)
			api := request{Path: "/x", From: from, Header: []string{"Host: api.example"}}
			for _, want := range []int{200, 200, 429} {
				if r := nx.do(t, api); r.Status != want {
					t.Fatalf("Host: api.example: %v, want %d", r, want)
				}
			}
			// NGINX refuses a host it does not serve.
			if r, err := curl(nx.base(), request{Path: "/x", From: from, Header: []string{"Host: other.example"}}); err == nil {
				t.Fatalf("Host: other.example reached a server: %v; want the connection closed (444)", r)
			}

			for _, host := range []string{"other.example", "api.example.evil", "x"} {
				r := nx.do(t, request{Path: "/x", Target: "http://api.example/x", From: from, Header: []string{"Host: " + host}})
				if r.Status == 200 {
					e := echo(t, r)
					t.Errorf("GET http://api.example/x with Host: %s: served by location %q after api.example's quota was spent (rate-limit headers: %v), want 429: rategate counted it for another host than the one NGINX served",
						host, e.XLocation, r.decided())
				} else if r.Status != 429 {
					t.Errorf("GET http://api.example/x with Host: %s: %v, want 429", host, r)
				}
			}
		})
	}
}
