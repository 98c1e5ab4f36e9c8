//go:build e2e

package e2e

import (
	"strings"
	"testing"
	"time"
)

// TestRefusedRequestAfterIdleIsNotLetThrough: a header value with a control
// byte is one rategate's HTTP server refuses ("400 Error when parsing
// request", which auth_request makes a 500): docs/nginx.md and
// TestPaddedHeaderThroughNginx say such a request never passes. NGINX
// keeps connections to rategate open (keepalive 64) and, with two
// instances as the docs advise, asks them in turn.
//
// After a worker had sent rategate nothing for longer than rategate's
// write timeout (5 s: a quiet site, a quiet hour, one worker of many), the
// refusal was not written: fasthttp answers a request it cannot parse
// without setting a write deadline, the one left from the connection's
// last answer had passed, and it closed the connection instead (fixed by
// handler.refusal). NGINX read "upstream prematurely closed connection",
// a 502, tried the other instance on its idle connection (same result),
// found no live upstream and let the request through as rategate
// unavailable ($rategate_on_failure open). Each instance was also charged
// a failure (max_fails=2 fail_timeout=2s): a second such request marked
// both down, and for two seconds every client's request passed without a
// decision.
//
// The client spends its quota of 3 on /api/, waits, and sends requests
// for /api/ with a control byte in a header no rule reads, then plain
// ones: none may reach the application.
func TestRefusedRequestAfterIdleIsNotLetThrough(t *testing.T) {
	m := startMini(t)
	pol := policy(429, "idle", "", `    - name: api
      match: {path: /api/}
      key: [ip]
      algorithm: fixed_window
      limit: 3
      period: 24h
`)
	a := m.rategate(t, "rategate-a", pol)
	b := m.rategate(t, "rategate-b", pol)
	nx := startNginx(t, "idle", "nginx.conf", rewrite{rategates: []string{a.addr(), b.addr()}, app: m.app.addr})
	needWindow(t, window, 2*time.Minute)

	const from = "127.0.40.10"
	api := request{Path: "/api/items", From: from}
	for _, want := range []int{200, 200, 200, 429} {
		wantStatus(t, nx.do(t, api), want)
	}
	// Other clients' traffic, on a path no rule matches: every worker keeps
	// connections to both instances.
	nx.doMany(t, repeat(request{Path: "/free", From: "127.0.40.11"}, 48), 12)

	const rounds, perRound = 3, 2
	crafted, plain := 0, 0
	var seen []string
	for round := 0; round < rounds; round++ {
		// Quiet for a little longer than rategate's write timeout.
		time.Sleep(6 * time.Second)
		for i := 0; i < perRound; i++ {
			// X-Rewrite-URL: a header the shipped location / clears for
			// the application, and the auth subrequest passes on.
			r := nx.do(t, request{Path: "/api/items", From: from, Header: []string{"X-Rewrite-URL: a\x01b"}})
			if r.Status == 200 {
				crafted++
				seen = append(seen, "crafted: "+echo(t, r).XRateLimitStatus)
			} else if r.Status != 500 && r.Status != 429 {
				t.Errorf("crafted request: %v, want 500 (rategate's 400) or 429", r)
			}
		}
		for i := 0; i < 10; i++ {
			r := nx.do(t, api)
			if r.Status == 200 {
				plain++
				seen = append(seen, "plain: "+echo(t, r).XRateLimitStatus)
			}
		}
	}
	if crafted+plain > 0 {
		lines := nx.accessLog(t)
		var bypassed int
		for _, l := range lines {
			if l.ratelimit == "bypassed" {
				bypassed++
			}
		}
		t.Errorf("%d of %d crafted requests (control byte in X-Rewrite-URL) and %d of %d plain ones reached the application after the limit of 3 was spent"+
			" (X-RateLimit-Status the app saw: %s; %d access-log lines say bypassed), want 0: rategate closed idle connections instead of answering 400,"+
			" and NGINX let the requests through as rategate unavailable",
			crafted, rounds*perRound, plain, rounds*10, strings.Join(seen, ", "), bypassed)
	}
}
