package app

import (
	"strings"
	"testing"
)

// TestProbeAAdminMethodNoRequestCarries (probe A, failing test): the admin
// API refuses, with a 400 that says why, a user, host or header value no
// request can carry (white space at either end, a control byte, docs/
// identities.md), since such an override would never apply. The method
// dimension gets no such check: ?method=GET%20, ?method=%20GET,
// ?method=GET%00 and an empty ?method= are stored (200) under identities
// ("192.0.2.1|GET%20", ...) that /auth never makes: it reads the method
// from a trimmed header, and an empty one falls back to the request's own
// method. The config file refuses the same values (exceptions: match method
// must be an HTTP method token). An operator who blocks an abuser's method
// with a stray space believes it blocked while every request is admitted.
func TestProbeAAdminMethodNoRequestCarries(t *testing.T) {
	s := newStack(t, `
rules:
  - name: bym
    key: [ip, method]
    algorithm: fixed_window
    limit: 100
    period: 1h
`, "")
	for _, m := range []string{"GET%20", "%20GET", "GET%00", ""} {
		uri := "/v1/rules/bym/identities?ip=192.0.2.1&method=" + m
		code, out := call(t, s.admin, "PUT", uri, `{"block":true}`)
		if code != 400 {
			id := out
			if i := strings.Index(out, `"id"`); i >= 0 {
				id = out[i:min(len(out), i+40)]
			}
			t.Errorf("PUT %s: %d (stored, %s), want 400: no request has this method", uri, code, id)
		}
	}
	// What the stored blocks do: nothing. Every spelling a client or NGINX
	// can send is admitted (a 400 above would have told the operator).
	for _, m := range []string{"GET ", " GET", ""} {
		if c := s.ask("X-Original-URI", "/x", "X-Real-IP", "192.0.2.1", "X-Original-Method", m); c != 204 {
			t.Logf("method %q: %d", m, c)
		} else {
			t.Errorf("request with X-Original-Method %q from 192.0.2.1: 204, admitted despite the 'block' stored for that spelling", m)
		}
	}
}
