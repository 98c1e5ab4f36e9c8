//go:build e2e

package e2e

import (
	"testing"
	"time"
)

// TestSignInRedirectKeepsItsRateLimitAnswer: nginx-auth.conf's commented
// sign-in redirect (error_page 401 = /oauth2/sign_in), switched on with the
// recursive_error_pages line beside it: the sign-in page is rate limited
// per IP, and once that is spent the client gets rategate's 429 with
// Retry-After. The denial is the request's second error page; without
// recursive_error_pages NGINX answered it with its plain 403 page.
func TestSignInRedirectKeepsItsRateLimitAnswer(t *testing.T) {
	m := startMini(t)
	auth := startAuthLayer(t)
	rg := m.rategate(t, "rategate", policy(429, "signin", "", `    - name: per-ip
      key: [ip]
      algorithm: fixed_window
      limit: 2
      period: 24h
`))
	for _, recursive := range []bool{true, false} {
		// the commented lines, as written there (the rewrite leaves
		// comment lines alone: they go in after the line above them)
		const at = "auth_request_set $auth_user $upstream_http_x_auth_request_user;"
		lines := at + " error_page 401 = /oauth2/sign_in;"
		name, from := "signin-plain", "127.0.0.61"
		if recursive {
			lines += " recursive_error_pages on;"
			name, from = "signin-recursive", "127.0.0.60"
		}
		extra := map[string]string{at: lines}
		nx := startNginx(t, name, "nginx-auth.conf", rewrite{rategates: []string{rg.addr()}, app: m.app.addr, auth: auth.addr, extra: extra})
		needWindow(t, window, 30*time.Second)
		req := request{Path: "/user/feed", From: from} // no session: the auth layer's 401, then the sign-in page
		for i := range 2 {
			if r := nx.do(t, req); r.Status != 401 {
				t.Fatalf("%s: request %d: %v, want the sign-in page (the fake auth layer answers it 401)", name, i+1, r)
			}
		}
		r := nx.do(t, req)
		switch {
		case recursive && (r.Status != 429 || r.Header.Get("Retry-After") == ""):
			t.Errorf("%s: the third request: %v, want 429 with Retry-After (per-ip spent on the sign-in page)", name, r)
		case !recursive && r.Status == 200:
			t.Errorf("%s: the third request reached the application: %v", name, r)
		}
		t.Logf("%s: third request %d (Retry-After %q)", name, r.Status, r.Header.Get("Retry-After"))
	}
}
