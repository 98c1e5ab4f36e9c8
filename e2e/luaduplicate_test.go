//go:build e2e

package e2e

import (
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// headerApp is an application that records the first copy of one request
// header, as Go's net/http (Header.Get), Node's http and most frameworks
// read a header sent twice, per X-Client.
type headerApp struct {
	addr string
	name string
	mu   sync.Mutex
	seen map[string][]string // X-Client to the first copy of name of each request
}

func startHeaderApp(t *testing.T, name string) *headerApp {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	a := &headerApp{addr: ln.Addr().String(), name: name, seen: map[string][]string{}}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		c := r.Header.Get("X-Client")
		a.seen[c] = append(a.seen[c], r.Header.Get(a.name))
		a.mu.Unlock()
		w.WriteHeader(http.StatusOK)
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return a
}

func (a *headerApp) of(client string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]string(nil), a.seen[client]...)
}

// TestLuaDuplicateRuleHeaderReachesRategateOnce: a header a rule reads must
// come once (docs/configuration.md): NGINX passes every copy to the
// application, which may read another copy than the one rategate counted,
// so rategate refuses a request that sends it twice (400; auth_request
// makes it a 500), and it finds repeats of User-Agent and Content-Type in
// the raw header lines for that (handler.singleValued).
//
// In the Lua variant rategate never sees the repeat: lua-nginx-module's
// ngx.location.capture copies the client's headers into the subrequest one
// by one through its header setter, which keeps only the last copy of the
// headers NGINX itself knows as single-valued (User-Agent, Content-Type,
// Referer, Accept-Encoding, Via, Range, Date, ...), while the application
// gets every copy and reads the first. So a client whose User-Agent is
// over its limit sends it again with a fresh copy after it: rategate counts
// the fresh one, the application serves the spent one. The same with a
// rule on Content-Type: application/json and a text/plain copy after it.
func TestLuaDuplicateRuleHeaderReachesRategateOnce(t *testing.T) {
	m := startMini(t)
	needLuaModule(t)
	rg := m.rategate(t, "rategate", policy(429, "luadup", "", `    - name: per-agent
      match: {path: /agent/}
      key: ["header:User-Agent"]
      algorithm: fixed_window
      limit: 2
      period: 24h
    - name: json
      match: {path: /json/, header: {Content-Type: application/json}}
      key: ["header:X-Client"]
      algorithm: fixed_window
      limit: 2
      period: 24h
`))
	needWindow(t, window, 30*time.Second)
	for _, v := range []struct{ conf, header, path, counted, fresh string }{
		{"nginx.conf", "User-Agent", "/agent/x", "BadBot-plain", "fresh"},
		{"openresty.conf", "User-Agent", "/agent/x", "BadBot-lua", "fresh"},
		{"nginx.conf", "Content-Type", "/json/x", "application/json", "text/plain"},
		{"openresty.conf", "Content-Type", "/json/x", "application/json", "text/plain"},
	} {
		t.Run(v.conf+"/"+v.header, func(t *testing.T) {
			a := startHeaderApp(t, v.header)
			nx := startNginx(t, safeName(v.conf+v.header), v.conf, rewrite{rategates: []string{rg.addr()}, app: a.addr})
			client := "c-" + safeName(v.conf)
			req := func(values ...string) string {
				var b strings.Builder
				fmt.Fprintf(&b, "GET %s HTTP/1.1\r\nHost: app.example\r\nX-Client: %s\r\n", v.path, client)
				for _, val := range values {
					fmt.Fprintf(&b, "%s: %s\r\n", v.header, val)
				}
				b.WriteString("Connection: close\r\n\r\n")
				return b.String()
			}
			for i, want := range []string{"200", "200", "429"} {
				if line := rawStatusLine(t, nx.base(), req(v.counted)); !strings.Contains(line, " "+want+" ") {
					t.Fatalf("%s: %s request %d: %q, want %s", v.header, v.counted, i+1, line, want)
				}
			}
			const tries = 5
			var lines []string
			for i := range tries {
				lines = append(lines, rawStatusLine(t, nx.base(), req(v.counted, fmt.Sprintf("%s%d", v.fresh, i))))
			}
			served := a.of(client)
			if extra := len(served) - 2; extra > 0 {
				t.Errorf("%s: %s %q over its limit of 2, sent again with a second %s line after it (%s0..%s%d): %d of %d reached the application, which read %s %q;"+
					" want none (rategate must see the repeat and refuse it, as it does through auth_request); statuses: %q",
					v.conf, v.header, v.counted, v.header, v.fresh, v.fresh, tries-1, extra, tries, v.header, served[len(served)-1], lines)
			}
		})
	}
}
