//go:build e2e

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/procs"
	"github.com/rategate/rategate/internal/testredis"
)

// These tests check what NGINX and rategate agree on: which route a
// request is, who the user is behind an auth layer, what the logs say about
// a denial, and how a request NGINX let through without a decision is
// marked. Each starts its own redis-server, rategate(s) and nginx.

// ---- helpers ----------------------------------------------------------------

// mini is one redis-server and the app, for rategates started on demand.
type mini struct {
	dir   string
	redis *testredis.Server
	app   *app
}

func startMini(t *testing.T) *mini {
	t.Helper()
	needBinary(t, "curl", "curl")
	needBinary(t, "nginx", "nginx")
	needBinary(t, "redis-server", "redis-server")
	m := &mini{dir: filepath.Join(workDir, safeName(t.Name()))}
	if err := os.MkdirAll(m.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	m.redis = testredis.Start(t)
	m.app = startApp(t)
	return m
}

// rategate starts a rategate named name with the policy yaml on m's Redis.
func (m *mini) rategate(t *testing.T, name, yaml string) *rategate {
	t.Helper()
	path := filepath.Join(m.dir, name+".yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	r := newRategate(t, name, m.dir, path, "redis://"+m.redis.Addr+"/0")
	r.start(t)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("%s log:\n%s", name, procs.FileTail(r.proc.logPath, 15))
		}
	})
	return r
}

// policy is a rategate config: Redis given time to answer on a busy
// machine, keys under prefix, then identity settings (YAML lines under
// "identity:", indented by two spaces; "" for the defaults) and rules (list
// items, indented by four).
func policy(denyStatus int, prefix, identity, rules string) string {
	if identity != "" {
		identity = "identity:\n" + identity
	}
	return fmt.Sprintf("redis:\n  timeout: 200ms\n  key_prefix: %s\nfailure_mode: allow\ndeny_status: %d\n%srules:\n%s",
		prefix, denyStatus, identity, rules)
}

// deadAddr is a loopback address nothing listens on: a rategate that is down.
func deadAddr(t *testing.T) string {
	return "127.0.0.1:" + strconv.Itoa(testredis.FreePort(t))
}

// accessLine is one line of the "rategate" access-log format.
type accessLine struct {
	raw                                 string
	status                              int
	requestID, ratelimit, rule, remains string
	upstream                            string
}

var accessRE = regexp.MustCompile(`" (\d{3}) \d+ "[^"]*" "[^"]*" request_id=(\S+) ratelimit=(\S*) rule=(\S*) remaining=(\S*) rategate="([^"]*)"$`)

// accessLog reads n's access log in the "rategate" format.
func (n *nginxServer) accessLog(t *testing.T) []accessLine {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(n.prefix, "logs", "access.log"))
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	var out []accessLine
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l == "" {
			continue
		}
		if strings.Contains(l, "/nginx-health") { // startNginx's readiness probes
			continue
		}
		m := accessRE.FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("access log line not in the rategate format: %s", l)
		}
		st, _ := strconv.Atoi(m[1])
		out = append(out, accessLine{raw: l, status: st, requestID: m[2], ratelimit: m[3], rule: m[4], remains: m[5], upstream: m[6]})
	}
	return out
}

// lastAccess waits for the count-th access-log line (health probes left
// out) and returns it: NGINX writes a line once the response is out.
func (n *nginxServer) lastAccess(t *testing.T, count int) accessLine {
	t.Helper()
	var lines []accessLine
	err := waitFor(3*time.Second, func() error {
		if lines = n.accessLog(t); len(lines) < count {
			return fmt.Errorf("%d access-log lines, want %d", len(lines), count)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return lines[count-1]
}

// logLines returns rategate's JSON log lines whose message contains substr.
func (r *rategate) logLines(t *testing.T, substr string) []map[string]any {
	t.Helper()
	f, err := os.Open(r.proc.logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []map[string]any
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		if msg, _ := m["message"].(string); strings.Contains(msg, substr) {
			out = append(out, m)
		}
	}
	return out
}

// authLayer stands in for oauth2-proxy: /oauth2/auth answers 202 and
// X-Auth-Request-User: <name> for the cookie session=u-<name>, 401 to
// anything else.
type authLayer struct {
	addr string
	mu   sync.Mutex
	seen int
	// forwarded is what the last check said the request was: its
	// X-Original-URL, X-Forwarded-* and X-Real-IP headers.
	forwarded map[string]string
}

// forwardedHeaders are the headers an auth layer may read the request from.
var forwardedHeaders = []string{"X-Original-URI", "X-Original-URL", "X-Original-Method", "X-Forwarded-Method", "X-Forwarded-Proto",
	"X-Forwarded-Host", "X-Forwarded-Uri", "X-Forwarded-For", "X-Real-IP"}

// lastForwarded returns what the last check said the request was.
func (a *authLayer) lastForwarded() map[string]string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.forwarded
}

func startAuthLayer(t *testing.T) *authLayer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &authLayer{addr: ln.Addr().String()}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fw := map[string]string{}
		for _, h := range forwardedHeaders {
			fw[h] = strings.Join(r.Header.Values(h), " | ")
		}
		a.mu.Lock()
		a.seen++
		a.forwarded = fw
		a.mu.Unlock()
		c, err := r.Cookie("session")
		if r.URL.Path != "/oauth2/auth" || err != nil || !strings.HasPrefix(c.Value, "u-") {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-Auth-Request-User", strings.TrimPrefix(c.Value, "u-"))
		w.Header().Set("X-Auth-Request-Email", strings.TrimPrefix(c.Value, "u-")+"@example.org")
		w.Header().Set("X-Auth-Request-Groups", "readers")
		w.WriteHeader(http.StatusAccepted)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return a
}

// confHead opens the test configs: one worker, logs and temporary files
// under the prefix, an http{} block left open.
const confHead = `worker_processes 1;
pid logs/nginx.pid;
error_log logs/error.log warn;
events { worker_connections 256; }
http {
    client_body_temp_path temp/client_body;
    proxy_temp_path       temp/proxy;
    fastcgi_temp_path     temp/fastcgi;
    uwsgi_temp_path       temp/uwsgi;
    scgi_temp_path        temp/scgi;
`

// adminRule is a policy's rules entry: /admin, 2 a day per client address.
const adminRule = `    - name: admin
      match: {path: /admin}
      key: [ip]
      algorithm: fixed_window
      limit: 2
      period: 24h
`

// ---- 1. the route NGINX routes ------------------------------------------------

// routesConf is a test config around the shipped snippets: one server per
// way of proxying (Host: slash -> proxy_pass with a URI part, Host: raw ->
// without), each with a location /admin, and the location tells the app
// which one proxied.
const routesConf = confHead + `    include rategate-upstream.conf;
    include rategate-identity-demo.conf;
    access_log logs/access.log rategate;
    upstream app { server 127.0.0.1:8001; }
    server {
        listen 8000;
        server_name slash;
        include rategate.conf;
        location / { proxy_pass http://app/; proxy_set_header X-Location root; }
        location /admin { proxy_pass http://app/admin; proxy_set_header X-Location admin; }
        location = /nginx-health { auth_request off; return 200 "ok\n"; }
    }
    server {
        listen 8000;
        server_name raw;
        include rategate.conf;
        location / { proxy_pass http://app; proxy_set_header X-Location root; }
        location /admin { proxy_pass http://app; proxy_set_header X-Location admin; }
    }
}
`

// spellings of a request for /admin and what NGINX 1.22 makes of them: uri
// is $uri ("" when NGINX answers 400 itself), upstream what proxy_pass with
// a URI part sends the app (NGINX's $uri, escaped again). Without a URI part
// NGINX sends the client's own spelling. Target, when set, is sent as an
// absolute-form request target; HOST in it is the server's name.
var spellings = []struct {
	path, target, uri, upstream string
}{
	{path: "/admin", uri: "/admin", upstream: "/admin"},
	{path: "/%2Fadmin", uri: "/admin", upstream: "/admin"},
	{path: "/%2fadmin", uri: "/admin", upstream: "/admin"},
	{path: "/x/..%2Fadmin", uri: "/admin", upstream: "/admin"},
	{path: "/x%2F..%2Fadmin", uri: "/admin", upstream: "/admin"},
	{path: "/x/%2e%2e/admin", uri: "/admin", upstream: "/admin"},
	{path: "/x/.%2E/admin", uri: "/admin", upstream: "/admin"},
	{path: "/%61dm%69n", uri: "/admin", upstream: "/admin"},
	{path: "//admin", uri: "/admin", upstream: "/admin"},
	{path: "/./admin", uri: "/admin", upstream: "/admin"},
	{path: "/admin?next=%2F..%2F", uri: "/admin", upstream: "/admin?next=%2F..%2F"},
	{path: "/", target: "http://HOST/%2Fadmin", uri: "/admin", upstream: "/admin"},
	{path: "/", target: "http://HOST//admin?x", uri: "/admin", upstream: "/admin?x"},
	// Routed by location /admin, but a path of their own.
	{path: "/admin/", uri: "/admin/", upstream: "/admin/"},
	{path: "/admin/.", uri: "/admin/", upstream: "/admin/"},
	{path: "/admin%2F", uri: "/admin/", upstream: "/admin/"},
	{path: "/admin;x", uri: "/admin;x", upstream: "/admin;x"},
	{path: "/admin%3b", uri: "/admin;", upstream: "/admin;"},
	{path: "/admin.", uri: "/admin.", upstream: "/admin."},
	{path: "/admin%20", uri: "/admin ", upstream: "/admin%20"},
	// Routed elsewhere.
	{path: "/%252Fadmin", uri: "/%2Fadmin", upstream: "/%252Fadmin"},
	{path: "/ADMIN", uri: "/ADMIN", upstream: "/ADMIN"},
	{path: "/Admin", uri: "/Admin", upstream: "/Admin"},
	{path: "/admin/..", uri: "/", upstream: "/"},
	{path: "/x/..%5cadmin", uri: "/x/..\\admin", upstream: "/x/..%5Cadmin"},
	// NGINX answers 400 and never asks rategate.
	{path: "/../admin"},
	{path: "/x/../../admin"},
	{path: "/%00admin"},
	{path: "/%zzadmin"},
	{path: "/admin/..%2F.."},
}

// TestRouteIsWhatNginxRoutes runs every spelling against a rule
// "path: /admin" keyed on route and ip, limit 3: whatever NGINX routes to
// /admin (location /admin, the app receives /admin) shares /admin's quota,
// anything else does not. Each spelling gets a client address of its own:
// two requests for /admin, the spelling, then /admin again.
func TestRouteIsWhatNginxRoutes(t *testing.T) {
	m := startMini(t)
	rg := m.rategate(t, "rategate", policy(429, "rg", "", `    - name: admin
      match: {path: /admin}
      key: [route, ip]
      algorithm: fixed_window
      limit: 3
      period: 24h
`))
	nx := startNginx(t, "routes", "routes.conf", rewrite{
		rategates: []string{rg.addr()}, app: m.app.addr, files: map[string]string{"routes.conf": routesConf},
	})
	needWindow(t, window, 30*time.Second)

	for h, host := range []string{"slash", "raw"} {
		for i, sp := range spellings {
			name := host + " " + sp.path
			if sp.target != "" {
				name = host + " " + sp.target
			}
			from := fmt.Sprintf("127.0.%d.%d", 10+h, 10+i)
			admin := request{Path: "/admin", From: from, Header: []string{"Host: " + host}}
			for want := 2; want >= 1; want-- {
				r := nx.do(t, admin)
				if r.Status != 200 || r.Header.Get("X-RateLimit-Remaining") != strconv.Itoa(want) {
					t.Fatalf("%s: /admin before: %v", name, r)
				}
			}

			// An absolute-form target names the server itself.
			target := strings.ReplaceAll(sp.target, "HOST", host)
			r := nx.do(t, request{Path: sp.path, Target: target, From: from, Header: []string{"Host: " + host}})
			after := 0 // what /admin has left after the spelling
			switch {
			case sp.uri == "":
				if r.Status != 400 || r.decided() {
					t.Errorf("%s: NGINX answers 400 itself; got %v", name, r)
				}
			case sp.uri == "/admin":
				// NGINX routes it to /admin: /admin's quota.
				e := echo(t, r)
				if r.Status != 200 || r.Header.Get("X-RateLimit-Remaining") != "0" || e.XLocation != "admin" {
					t.Errorf("%s: routed to /admin (location %s), want /admin's last request (remaining 0): %v", name, e.XLocation, r)
				}
				after = -1
			default:
				e := echo(t, r)
				wantLoc := "root"
				if strings.HasPrefix(sp.uri, "/admin") {
					wantLoc = "admin"
					// The rule matches, the route is another: its own counter.
					if r.Header.Get("X-RateLimit-Remaining") != "2" {
						t.Errorf("%s: NGINX's path %q is not /admin; want a counter of its own (remaining 2): %v", name, sp.uri, r)
					}
				} else if r.decided() {
					t.Errorf("%s: NGINX's path %q does not start with /admin; the rule must not match: %v", name, sp.uri, r)
				}
				if r.Status != 200 || e.XLocation != wantLoc {
					t.Errorf("%s: status %d, location %q; want 200 from location %s", name, r.Status, e.XLocation, wantLoc)
				}
			}
			if sp.uri != "" {
				e := echo(t, r)
				want := sp.upstream
				if host == "raw" {
					// proxy_pass without a URI part: the client's spelling.
					want = sp.path
					if target != "" {
						want = target[strings.Index(target[len("http://"):], "/")+len("http://"):]
					}
				}
				if e.URI != want && r.Status == 200 {
					t.Errorf("%s: the app received %q, want %q", name, e.URI, want)
				}
			}

			r = nx.do(t, admin)
			if after == -1 {
				if r.Status != 429 {
					t.Errorf("%s: /admin after a spelling NGINX routes to /admin: %v, want 429 (one quota)", name, r)
				}
			} else if r.Status != 200 || r.Header.Get("X-RateLimit-Remaining") != "0" {
				t.Errorf("%s: /admin after a spelling NGINX routes elsewhere: %v, want 200 with remaining 0 (its quota untouched)", name, r)
			}
		}
	}
}

// ---- 2. ingress-nginx's auth-url ---------------------------------------------------

// ingressConf reproduces the auth location ingress-nginx writes for an
// auth-url annotation (rootfs/etc/nginx/template/nginx.tmpl): the client's
// headers go along (proxy_pass_request_headers on), then X-Original-URL,
// X-Original-Method, X-Sent-From, X-Real-IP, X-Forwarded-For and
// X-Auth-Request-Redirect; no X-Original-URI. Host "default" asks a rategate
// with the default identity settings, Host "hardened" one that reads only
// X-Original-URL (identity.uri_header: X-Original-URL).
const ingressConf = confHead + `    upstream app { server 127.0.0.1:8001; }
    map $host $auth_target { default http://DEFAULT/auth; hardened http://HARDENED/auth; }
    server {
        listen 8000;
        location = /_external-auth {
            internal;
            proxy_pass_request_body     off;
            proxy_set_header            Content-Length "";
            proxy_set_header            Host                    rategate.svc;
            proxy_set_header            X-Original-URL          $scheme://$http_host$request_uri;
            proxy_set_header            X-Original-Method       $request_method;
            proxy_set_header            X-Sent-From             "nginx-ingress-controller";
            proxy_set_header            X-Real-IP               $remote_addr;
            proxy_set_header            X-Forwarded-For         $remote_addr;
            proxy_set_header            X-Auth-Request-Redirect $request_uri;
            proxy_http_version          1.1;
            proxy_pass_request_headers  on;
            proxy_pass $auth_target;
        }
        location / {
            auth_request /_external-auth;
            proxy_pass http://app;
        }
        location = /nginx-health { return 200 "ok\n"; }
    }
}
`

// TestIngressAuthURL: rategate as ingress-nginx's auth-url decides by the
// path and query of X-Original-URL, on a rule keyed by route and ip.
// ingress-nginx turns the auth service's 403 into the client's 403, so
// rategate runs with deny_status: 403 (a 429 would be a 500).
func TestIngressAuthURL(t *testing.T) {
	m := startMini(t)
	rules := `    - name: api
      match: {path: /api/}
      key: [route, ip]
      algorithm: fixed_window
      limit: 2
      period: 24h
`
	def := m.rategate(t, "default", policy(403, "rg", "", rules))
	hard := m.rategate(t, "hardened", policy(403, "hard", "  uri_header: X-Original-URL\n", rules))
	conf := strings.NewReplacer("DEFAULT", def.addr(), "HARDENED", hard.addr()).Replace(ingressConf)
	nx := startNginx(t, "ingress", "ingress.conf", rewrite{app: m.app.addr, files: map[string]string{"ingress.conf": conf}})
	needWindow(t, window, 30*time.Second)

	for _, host := range []string{"default", "hardened"} {
		get := func(path, from string, extra ...string) int {
			t.Helper()
			return nx.do(t, request{Path: path, From: from, Header: append([]string{"Host: " + host}, extra...)}).Status
		}
		steps := []struct {
			name, path, from string
			want             int
		}{
			{"first", "/api/items?page=1", "127.0.3.1", 200},
			{"another spelling, another query", "/api//items?page=2", "127.0.3.1", 200},
			{"over the limit", "/x/..%2Fapi/items", "127.0.3.1", 403},
			{"another client", "/api/items", "127.0.3.2", 200},
			{"another route", "/api/orders", "127.0.3.1", 200},
			{"no rule", "/health", "127.0.3.1", 200},
		}
		for _, s := range steps {
			if got := get(s.path, s.from); got != s.want {
				t.Errorf("%s: %s %s from %s: %d, want %d", host, s.name, s.path, s.from, got, s.want)
			}
		}
		// The client's Host header is X-Original-URL's authority, and NGINX
		// lets it hold '?' or '#' (never '/'); with an absolute-form target
		// NGINX picks the server from the target, whatever Host says. And
		// an absolute-form target without a path has a $request_uri that
		// starts with '?'. Either way X-Original-URL has a '?' or '#'
		// before its path, which cannot be told apart: rategate refuses it
		// (400, a 500 at the client), so neither spelling gets through.
		for _, tc := range []struct{ target, hostHeader string }{
			{"http://" + host + "/api/items", "a?1"}, {"http://" + host + "/api/items", "a#1"}, {"http://" + host + "/api/items", "x?"},
			{"http://" + host + "?x/1", host}, {"http://" + host + ":8000?x/2", host},
		} {
			r := nx.do(t, request{Target: tc.target, From: "127.0.3.1", Header: []string{"Host: " + tc.hostHeader}})
			if r.Status != 500 {
				t.Errorf("%s: %s with Host %q: %d, want 500 (rategate's 400: an ambiguous URL)", host, tc.target, tc.hostHeader, r.Status)
			}
		}
		if host == "hardened" {
			// The client's own headers reach the auth service too; reading
			// only X-Original-URL, rategate cannot be told another route.
			if got := get("/api/items", "127.0.3.1", "X-Original-URI: /api/elsewhere"); got != 403 {
				t.Errorf("hardened: a client-sent X-Original-URI changed the route: %d, want 403", got)
			}
		}
	}
}

// ---- 3. behind an auth layer ------------------------------------------------

// authVariants are the shipped configs that put rategate behind an auth
// layer (oauth2-proxy style), and how to run them.
var authVariants = []struct {
	name, conf string
	denyStatus int
	extra      map[string]string
	lua        bool
}{
	{name: "plain", conf: "nginx-auth.conf", denyStatus: 429},
	{name: "quiet", conf: "nginx-auth.conf", denyStatus: 403, extra: map[string]string{
		// the server{} line of nginx-auth.conf, not rategate-quiet.conf's own include
		"        include rategate.conf;": "        include rategate-quiet.conf;"}},
	{name: "lua", conf: "openresty-auth.conf", denyStatus: 429, lua: true},
}

// TestAuthLayer: two users behind one IP, named by the auth layer, each get
// their own full limit, in every variant that claims an auth layer.
func TestAuthLayer(t *testing.T) {
	m := startMini(t)
	needLuaModule(t)
	auth := startAuthLayer(t)
	rules := `    - name: per-user
      match: {path: /user/}
      key: [user]
      algorithm: fixed_window
      limit: 10
      period: 24h
`
	rgs := map[int]*rategate{
		429: m.rategate(t, "rategate429", policy(429, "rg", "", rules)),
		403: m.rategate(t, "rategate403", policy(403, "rg", "", rules)),
	}
	needWindow(t, window, 60*time.Second)
	for _, v := range authVariants {
		t.Run(v.name, func(t *testing.T) {
			nx := startNginx(t, v.name, v.conf, rewrite{
				rategates: []string{rgs[v.denyStatus].addr()}, app: m.app.addr, auth: auth.addr, extra: v.extra,
			})
			for _, user := range []string{"alice-" + v.name, "bob-" + v.name} {
				// The client's own user headers are ignored: the auth
				// layer says who, to rategate and to the application.
				req := request{Path: "/user/feed", Header: []string{"Cookie: session=u-" + user, "X-User-Id: mallory"}}
				for _, h := range identityHeaders {
					req.Header = append(req.Header, h+": mallory")
				}
				rs := nx.doMany(t, repeat(req, 10), 4)
				for i, r := range rs {
					if r.Status != 200 {
						t.Fatalf("%s: request %d of 10: %v (behind one IP, each user has a full limit)", user, i+1, r)
					}
					e := echo(t, r)
					if e.XUserID != user {
						t.Errorf("%s: the app saw X-User-Id %q", user, e.XUserID)
					}
					for _, h := range identityHeaders {
						want := user
						switch {
						case strings.HasSuffix(h, "Email"):
							want = user + "@example.org"
						case strings.HasSuffix(h, "Groups"):
							want = "readers"
						case strings.HasSuffix(h, "Name"), strings.HasSuffix(h, "Username"):
							want = "" // not the auth layer's: removed
						}
						if e.Users[h] != want {
							t.Errorf("%s: the app saw %s %q, want the auth layer's %q (the client sent mallory)", user, h, e.Users[h], want)
						}
					}
				}
				r := nx.do(t, req)
				if r.Status != 429 || r.Header.Get("X-RateLimit-Rule") != "per-user" {
					t.Errorf("%s: the 11th request: %v, want 429 by per-user", user, r)
				}
			}
			// The auth layer is told the request NGINX serves, whatever
			// the client says it is (an auth layer that reads these
			// headers would otherwise authorize another page).
			forged := request{Path: "/user/feed?x=1", Header: []string{"Cookie: session=u-carol-" + v.name,
				"X-Original-URL: http://evil.example/public", "X-Forwarded-Uri: /public", "X-Forwarded-Host: evil.example",
				"X-Forwarded-Proto: https", "X-Forwarded-Method: GET", "X-Original-Method: GET", "X-Forwarded-For: 203.0.113.9",
				"X-Real-IP: 203.0.113.9"}}
			forged.Method = "POST"
			nx.do(t, forged)
			fw := auth.lastForwarded()
			for h, want := range map[string]string{"X-Original-URI": "/user/feed?x=1", "X-Forwarded-Uri": "/user/feed?x=1",
				"X-Forwarded-Host": "127.0.0.1", "X-Forwarded-Proto": "http", "X-Forwarded-Method": "POST", "X-Original-Method": "POST",
				"X-Original-URL": "http://127.0.0.1/user/feed?x=1", "X-Forwarded-For": "127.0.0.1", "X-Real-IP": "127.0.0.1"} {
				if fw[h] != want {
					t.Errorf("the auth layer got %s %q, want NGINX's %q (the client sent its own)", h, fw[h], want)
				}
			}
			// No session: the auth layer's 401, rategate never asked.
			r := nx.do(t, request{Path: "/user/feed", Header: []string{"X-User: alice-" + v.name}})
			if r.Status != 401 || r.decided() {
				t.Errorf("no session: %v, want the auth layer's 401", r)
			}
		})
	}
}

// planRule counts requests under /user/ by their X-Plan header, 2 a day.
const planRule = `    - name: plan
      match: {path: /user/}
      key: ["header:X-Plan"]
      algorithm: fixed_window
      limit: 2
      period: 24h
`

// TestDuplicateRuleHeaderThroughNginx: NGINX passes every copy of a
// client's header to the auth subrequest and to the application, which may
// take another copy than the first. A header a rule reads, sent twice, is
// refused (400, which auth_request makes a 500): a fresh copy in front of
// one over its limit gets nothing through.
func TestDuplicateRuleHeaderThroughNginx(t *testing.T) {
	m := startMini(t)
	rg := m.rategate(t, "rategate", policy(429, "dup", "", planRule))
	nx := startNginx(t, "dup", "nginx.conf", rewrite{rategates: []string{rg.addr()}, app: m.app.addr})
	needWindow(t, window, 30*time.Second)
	gold := request{Path: "/user/feed", Header: []string{"X-User: dave", "X-Plan: gold"}}
	wantStatus(t, nx.do(t, gold), 200)
	wantStatus(t, nx.do(t, gold), 200)
	wantStatus(t, nx.do(t, gold), 429)
	for i := range 3 {
		r := nx.do(t, request{Path: "/user/feed", Header: []string{"X-User: dave", fmt.Sprintf("X-Plan: fresh%d", i), "X-Plan: gold"}})
		if r.Status != 500 {
			t.Errorf("X-Plan twice (fresh%d, gold): %d, want 500 (rategate's 400 through auth_request)", i, r.Status)
		}
	}
}

// TestPaddedHeaderThroughNginx: NGINX trims only spaces and tabs from a
// header value; an application commonly trims more (Python's str.strip
// takes NBSP and NEL, read as Latin-1 or UTF-8; JavaScript's trim takes
// U+3000 and the BOM). A value a rule reads, padded with such white space,
// is the value it pads: a padded copy of a key over its limit gets nothing
// through. A control byte is refused: by rategate's HTTP server (a 400,
// which auth_request makes a 500), or, under Lua, by rategate_access.lua
// itself (400): lua-nginx-module would hand rategate "gold%0B", a fresh
// quota, while the application gets the byte and may trim it.
func TestPaddedHeaderThroughNginx(t *testing.T) {
	m := startMini(t)
	needLuaModule(t)
	rg := m.rategate(t, "rategate", policy(429, "pad", "", planRule))
	needWindow(t, window, 60*time.Second)
	for i, v := range []struct {
		conf    string
		control int
	}{{"nginx.conf", 500}, {"openresty.conf", 400}} {
		t.Run(v.conf, func(t *testing.T) {
			nx := startNginx(t, fmt.Sprintf("pad%d", i), v.conf, rewrite{rategates: []string{rg.addr()}, app: m.app.addr})
			plan := fmt.Sprintf("gold%d", i)
			req := func(value string) request {
				return request{Path: "/user/feed", Header: []string{"X-User: dave", "X-Plan: " + value}}
			}
			for _, want := range []int{200, 200, 429} {
				wantStatus(t, nx.do(t, req(plan)), want)
			}
			for _, pad := range []string{"\xa0", "\x85", "\xc2\xa0", "\xc2\x85", "\xe3\x80\x80", "\xef\xbb\xbf", "\xe2\x80\x8b"} {
				for _, value := range []string{plan + pad, pad + plan, pad + plan + pad + pad} {
					if r := nx.do(t, req(value)); r.Status != 429 {
						t.Errorf("X-Plan %q: %d, want 429 (the quota of %q)", value, r.Status, plan)
					}
				}
			}
			for _, value := range []string{plan + "\x0b", plan + "\x1f", "\x1c" + plan} {
				if r := nx.do(t, req(value)); r.Status != v.control {
					t.Errorf("X-Plan %q: %d, want %d", value, r.Status, v.control)
				}
			}
		})
	}
}

// TestManyRulesThroughNginx: a client chooses how many rules its request
// matches (here by sending X-Tier), and NGINX reads rategate's answer head
// into 4 KiB. Forty matching rules of 64-character names once made the
// head too big: NGINX answered itself 502, which the shipped config lets
// through as rategate unavailable, so every denial became an admission.
// The rate-limit headers are bounded: the limit holds.
func TestManyRulesThroughNginx(t *testing.T) {
	m := startMini(t)
	var rules strings.Builder
	for i := range 40 {
		limit := 1_000_000
		if i == 0 {
			limit = 2
		}
		fmt.Fprintf(&rules, "    - name: r%02d-%s\n      match: {path: /user/, header: {X-Tier: gold}}\n      key: [ip]\n"+
			"      algorithm: fixed_window\n      limit: %d\n      period: 24h\n", i, strings.Repeat("x", 60), limit)
	}
	rg := m.rategate(t, "rategate", policy(429, "many", "", rules.String()))
	nx := startNginx(t, "many", "nginx.conf", rewrite{rategates: []string{rg.addr()}, app: m.app.addr})
	needWindow(t, window, 30*time.Second)
	gold := request{Path: "/user/feed", Header: []string{"X-User: erin", "X-Tier: gold"}}
	for i, want := range []int{200, 200, 429, 429, 429} {
		if r := nx.do(t, gold); r.Status != want {
			t.Errorf("request %d: %d, want %d", i+1, r.Status, want)
		}
	}
}

// ---- 4. a denial in the logs --------------------------------------------------

// TestDenialLogs: rategate's line for a denial carries the rule, every
// identity dimension, the key, the numbers and NGINX's request id, which is
// the one NGINX's access log writes for that request; the sampling says how
// many lines it suppressed; the access log says limited, the rule and the
// quota left.
func TestDenialLogs(t *testing.T) {
	m := startMini(t)
	needLuaModule(t)
	rules := `    - name: plan
      match: {path: /user/}
      key: [ip, user, route, method, host, "header:X-Plan"]
      algorithm: fixed_window
      limit: 2
      period: 24h
`
	rgs := map[int]*rategate{
		429: m.rategate(t, "rategate429", policy(429, "rg", "", rules)),
		403: m.rategate(t, "rategate403", policy(403, "rg", "", rules)),
	}
	needWindow(t, window, 60*time.Second)
	for i, v := range []variant{{conf: "nginx.conf", denyStatus: 429}, {conf: "nginx-quiet.conf", denyStatus: 403}, {conf: "openresty.conf", denyStatus: 429, lua: true}} {
		t.Run(v.conf, func(t *testing.T) {
			rg := rgs[v.denyStatus]
			before := len(rg.logLines(t, "request limited"))
			nx := startNginx(t, "logs", v.conf, rewrite{rategates: []string{rg.addr()}, app: m.app.addr})
			user := fmt.Sprintf("carol%d", i)
			req := request{Path: "/user/feed?page=3", Header: []string{"X-User: " + user, "X-Plan: gold"}}
			for want := 1; want >= 0; want-- {
				r := nx.do(t, req)
				wantStatus(t, r, 200)
				if e := echo(t, r); e.XRequestID == "" {
					t.Errorf("the app got no X-Request-Id")
				}
			}
			allowed := nx.lastAccess(t, 2)
			if allowed.ratelimit != "allowed" || allowed.remains != "0" || allowed.rule != "" || allowed.status != 200 {
				t.Errorf("access log of an allowed request: %s", allowed.raw)
			}
			r := nx.do(t, req)
			wantStatus(t, r, 429)
			denied := nx.lastAccess(t, 3)
			if denied.ratelimit != "limited" || denied.rule != "plan" || denied.remains != "0" || denied.status != 429 || len(denied.requestID) != 32 {
				t.Errorf("access log of the denial: %s", denied.raw)
			}

			var line map[string]any
			err := waitFor(3*time.Second, func() error {
				for _, l := range rg.logLines(t, "request limited")[before:] {
					if l["request_id"] == denied.requestID {
						line = l
						return nil
					}
				}
				return fmt.Errorf("no denial line with request_id %s (the access log's)", denied.requestID)
			})
			if err != nil {
				t.Fatal(err)
			}
			want := map[string]any{
				"rule": "plan", "ip": "127.0.0.1", "user": user, "route": "/user/feed", "method": "GET", "host": "127.0.0.1",
				"headers": map[string]any{"X-Plan": "gold"},
				"key":     "rg:{plan:127.0.0.1|" + user + "|/user/feed|GET|127.0.0.1|gold}:fw2",
				"limit":   float64(2), "remaining": float64(0), "cost": float64(1), "period_ms": float64(86_400_000),
			}
			for k, w := range want {
				if got := line[k]; fmt.Sprint(got) != fmt.Sprint(w) {
					t.Errorf("denial line %s: %v, want %v\nline: %v", k, got, w, line)
				}
			}
			retry, _ := line["retry_after_ms"].(float64)
			if left := float64(untilWindowEnd(time.Now(), window).Milliseconds()); math.Abs(retry-left) > 3000 {
				t.Errorf("denial line retry_after_ms %v, want about %v (the window's end)", line["retry_after_ms"], left)
			}
		})
	}

	t.Run("suppressed lines are counted", func(t *testing.T) {
		rg := rgs[429]
		before := len(rg.logLines(t, "request limited"))
		suppressedBefore := 0
		for _, l := range rg.logLines(t, "denial lines suppressed") {
			suppressedBefore += int(l["suppressed"].(float64))
		}
		nx := startNginx(t, "flood", "nginx.conf", rewrite{rategates: []string{rg.addr()}, app: m.app.addr})
		req := request{Path: "/user/feed", Header: []string{"X-User: flood", "X-Plan: gold"}}
		nx.doMany(t, repeat(req, 2), 1)
		const denials = 54
		rs := nx.doMany(t, repeat(req, denials), 6)
		got := 0
		for _, r := range rs {
			if r.Status == 429 {
				got++
			}
		}
		if got != denials {
			t.Fatalf("%d of %d requests denied", got, denials)
		}
		// Every denial is a line or counted in a summary (the summary of
		// a second comes at its end).
		var lines, suppressed int
		err := waitFor(3*time.Second, func() error {
			lines = len(rg.logLines(t, "request limited")) - before
			suppressed = -suppressedBefore
			for _, l := range rg.logLines(t, "denial lines suppressed") {
				suppressed += int(l["suppressed"].(float64))
			}
			if lines+suppressed != denials {
				return fmt.Errorf("%d denial lines + %d suppressed, want %d", lines, suppressed, denials)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if lines > 20 || suppressed == 0 {
			t.Errorf("%d denial lines and %d suppressed for %d denials, want at most 10 a second", lines, suppressed, denials)
		}
		t.Logf("%d denials: %d lines, %d suppressed", denials, lines, suppressed)
	})
}

// ---- 5. fail-open is marked -------------------------------------------------

// TestFailOpenIsMarked: when NGINX cannot reach rategate and lets the
// request through, the app gets X-RateLimit-Status: bypassed whatever the
// client sent, and the access log says bypassed (refused when it fails
// closed); with rategate up, the client cannot send the header itself.
func TestFailOpenIsMarked(t *testing.T) {
	m := startMini(t)
	needLuaModule(t)
	auth := startAuthLayer(t)
	rg := m.rategate(t, "rategate", policy(429, "rg", "", `    - name: per-user
      match: {path: /user/}
      key: [user]
      algorithm: fixed_window
      limit: 1000
      period: 24h
`))
	dead := deadAddr(t)
	for _, conf := range []string{"nginx.conf", "nginx-quiet.conf", "openresty.conf", "nginx-auth.conf", "openresty-auth.conf"} {
		t.Run(conf, func(t *testing.T) {
			req := request{Path: "/user/feed", Header: []string{"X-User: dave", "Cookie: session=u-dave", "X-RateLimit-Status: allowed"}}
			rw := rewrite{rategates: []string{dead}, app: m.app.addr, auth: auth.addr}
			if !strings.Contains(conf, "auth") {
				rw.auth = ""
			}
			down := startNginx(t, "down", conf, rw)
			r := down.do(t, req)
			wantStatus(t, r, 200)
			if e := echo(t, r); e.XRateLimitStatus != "bypassed" {
				t.Errorf("rategate down, request let through: the app saw X-RateLimit-Status %q, want \"bypassed\"", e.XRateLimitStatus)
			}
			if l := down.lastAccess(t, 1); l.ratelimit != "bypassed" || !strings.HasSuffix(l.upstream, "502") {
				t.Errorf("access log: %s; want ratelimit=bypassed and rategate=\"...502\"", l.raw)
			}

			rw.closed = true
			closed := startNginx(t, "closed", conf, rw)
			wantStatus(t, closed.do(t, req), 503)
			if l := closed.lastAccess(t, 1); l.ratelimit != "refused" || l.status != 503 {
				t.Errorf("access log, failing closed: %s; want ratelimit=refused", l.raw)
			}

			rw.closed, rw.rategates = false, []string{rg.addr()}
			up := startNginx(t, "up", conf, rw)
			req.Header[2] = "X-RateLimit-Status: bypassed"
			r = up.do(t, req)
			wantStatus(t, r, 200)
			if e := echo(t, r); e.HasXRateLimitStatus {
				t.Errorf("rategate up: the app saw the client's X-RateLimit-Status %q; NGINX must remove it", e.XRateLimitStatus)
			}
			if l := up.lastAccess(t, 1); l.ratelimit != "allowed" || l.upstream != "204" {
				t.Errorf("access log, rategate up: %s; want ratelimit=allowed rategate=\"204\"", l.raw)
			}
		})
	}
}

// TestPathParametersThroughNginx: NGINX passes "/;x/admin" and
// "/x/..;/admin" to the application as sent, and a Tomcat-style
// application serves both as /admin. Under identity.path_parameters:
// strip they spend /admin's quota, whatever parameters a client adds.
func TestPathParametersThroughNginx(t *testing.T) {
	m := startMini(t)
	rg := m.rategate(t, "rategate", policy(429, "pp", "  path_parameters: strip\n", adminRule))
	nx := startNginx(t, "pp", "nginx.conf", rewrite{rategates: []string{rg.addr()}, app: m.app.addr})
	needWindow(t, window, 30*time.Second)
	for i, c := range []struct {
		path string
		want int
	}{
		{"/admin", 200},
		{"/;x/admin", 200},
		{"/x/..;/admin", 429},
		{"/admin;jsessionid=1/users", 429},
		{"/static/..;/admin", 429},
		{"/%3Bx/admin", 429},  // NGINX decodes it where proxy_pass has a URI part
		{"/admin/..;/x", 429}, // NGINX sends it to the /admin/ location
	} {
		if r := nx.do(t, request{Path: c.path}); r.Status != c.want {
			t.Errorf("request %d, %s: %d, want %d", i+1, c.path, r.Status, c.want)
		}
	}
}
