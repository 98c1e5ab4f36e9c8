//go:build e2e

package e2e

import (
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// rewriteURLApp serves a request at the path a client-side rewrite header
// names, as Symfony's and Zend Framework's request objects did with
// X-Original-URL and X-Rewrite-URL until CVE-2018-14773 / ZF2018-01 (and
// unpatched or home-grown code, and code written for IIS's URL Rewrite
// module, still do). It records each path it served.
type rewriteURLApp struct {
	addr   string
	mu     sync.Mutex
	served []string
}

func startRewriteURLApp(t *testing.T) *rewriteURLApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &rewriteURLApp{addr: ln.Addr().String()}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path := r.URL.Path
		for _, h := range []string{"X-Original-Url", "X-Rewrite-Url"} {
			if v := r.Header.Get(h); v != "" {
				path = v
			}
		}
		a.mu.Lock()
		a.served = append(a.served, path)
		a.mu.Unlock()
		w.Write([]byte(path + "\n"))
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return a
}

func (a *rewriteURLApp) last() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.served) == 0 {
		return ""
	}
	return a.served[len(a.served)-1]
}

// TestClientRewriteURLHeaders: X-Original-URL and X-Rewrite-URL tell an
// application which path to serve in place of the request line's. The
// shipped configs passed a client's own copies to the application (they
// cleared X-Original-URL only in the subrequest to rategate). rategate
// counts the request line's path, so a client that had spent /admin's
// quota asked for /public with X-Original-URL: /admin and was served
// /admin, uncounted. NGINX must not hand the application a path other than
// the one rategate counted: the shipped configs clear both headers towards
// the application, as they clear X-RateLimit-Status.
func TestClientRewriteURLHeaders(t *testing.T) {
	m := startMini(t)
	rg := m.rategate(t, "rategate", policy(429, "ru", "", adminRule))
	app := startRewriteURLApp(t)
	needWindow(t, window, 30*time.Second)
	for i, v := range []struct{ name, conf string }{
		{"plain", "nginx.conf"},
		{"lua", "openresty.conf"},
	} {
		t.Run(v.name, func(t *testing.T) {
			if v.name == "lua" {
				needLuaModule(t)
			}
			nx := startNginx(t, v.name, v.conf, rewrite{rategates: []string{rg.addr()}, app: app.addr})
			from := []string{"127.0.30.10", "127.0.30.11"}[i]
			for _, want := range []int{200, 200, 429} {
				if r := nx.do(t, request{Path: "/admin", From: from}); r.Status != want {
					t.Fatalf("/admin: %v, want %d", r, want)
				}
			}
			for _, h := range []string{"X-Original-URL", "X-Rewrite-URL"} {
				r := nx.do(t, request{Path: "/public", From: from, Header: []string{h + ": /admin"}})
				if r.Status == 200 && app.last() == "/admin" {
					t.Errorf("GET /public with %s: /admin: the application served /admin after /admin's quota was spent, and rategate counted /public (rate-limit headers: %v)", h, r.decided())
				}
			}
		})
	}
}
