//go:build e2e

package e2e

import (
	"fmt"
	"testing"
	"time"
)

// TestRuleOnHeaderNginxReplacesApplies: a rule may match on any request
// header (match.header) and rategate -check accepts every name. Some
// names NGINX never passes to rategate as the client sent them: proxy_pass
// sets Host to the upstream's name ("rategate") and removes Upgrade,
// Connection, Keep-Alive, TE and Expect from every proxied request (and
// the shipped rategate-proxy.conf removes Content-Length). A rule on
// header Host: api.example (the host, written as a header) or on Upgrade:
// websocket is accepted, never matches behind the shipped nginx.conf, and
// every request it was written for passes unlimited, while the
// application gets Host: api.example (proxy_set_header Host $host).
// Either such a rule must be refused by -check (naming match.host for
// Host), or it must hold.
func TestRuleOnHeaderNginxReplacesApplies(t *testing.T) {
	m := startMini(t)
	rg := m.rategate(t, "rategate", policy(429, "hop", "", `    - name: api-host
      match: {path: /h/, header: {Host: api.example}}
      key: [ip]
      algorithm: fixed_window
      limit: 3
      period: 24h
    - name: websocket
      match: {path: /ws/, header: {Upgrade: websocket}}
      key: [ip]
      algorithm: fixed_window
      limit: 3
      period: 24h
`))
	nx := startNginx(t, "hop", "nginx.conf", rewrite{rategates: []string{rg.addr()}, app: m.app.addr})
	needWindow(t, window, 30*time.Second)
	for i, c := range []struct {
		rule   string
		req    request
		header string
	}{
		{"api-host", request{Path: "/h/x", Header: []string{"Host: api.example"}}, "Host: api.example"},
		{"websocket", request{Path: "/ws/chat", Header: []string{"Upgrade: websocket", "Connection: Upgrade"}}, "Upgrade: websocket"},
	} {
		c.req.From = fmt.Sprintf("127.0.41.%d", 10+i)
		const n = 6
		admitted, decided := 0, 0
		for range n {
			r := nx.do(t, c.req)
			if r.Status == 200 {
				admitted++
			}
			if r.decided() {
				decided++
			}
		}
		if admitted > 3 {
			t.Errorf("rule %s (match.header %s, limit 3, accepted by -check): %d of %d requests with that header admitted, %d with rate-limit headers; want 3:"+
				" NGINX never passes the client's %s to rategate, so the rule never matches",
				c.rule, c.header, admitted, n, decided, c.header)
		}
	}
}
