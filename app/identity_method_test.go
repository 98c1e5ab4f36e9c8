package app

import (
	"strings"
	"testing"
)

// TestAdminMethodNoRequestCarries: the admin API refuses a method no request
// can carry, as it refuses such a user, host or header value: "GET " or an
// empty value would be stored under an identity /auth never makes (it reads
// a trimmed method, and the request's own when the header is empty), and an
// operator who blocked an abuser's method with a stray space would believe
// it blocked while every request is admitted. The block written right
// applies to every spelling NGINX can send (NGINX refuses a method in
// lower case).
func TestAdminMethodNoRequestCarries(t *testing.T) {
	s := newStack(t, `
rules:
  - name: bym
    key: [ip, method]
    algorithm: fixed_window
    limit: 100
    period: 1h
`, "")
	for _, m := range []string{"GET%20", "%20GET", "GET%00", "", "G%2FT"} {
		uri := "/v1/rules/bym/identities?ip=192.0.2.1&method=" + m
		code, out := call(t, s.admin, "PUT", uri, `{"block":true}`)
		if code != 400 || !strings.Contains(out, "is not an HTTP method") {
			t.Errorf("PUT %s: %d %s, want 400: no request has this method", uri, code, out)
		}
	}
	if code, out := call(t, s.admin, "PUT", "/v1/rules/bym/identities?ip=192.0.2.1&method=get", `{"block":true}`); code != 200 {
		t.Fatalf("PUT method=get: %d %s", code, out)
	}
	for _, m := range []string{"GET", "GET ", " GET", ""} {
		if c := s.ask("X-Original-URI", "/x", "X-Real-IP", "192.0.2.1", "X-Original-Method", m); c != 429 {
			t.Errorf("X-Original-Method %q from the blocked ip: %d, want 429", m, c)
		}
	}
	if c := s.ask("X-Original-URI", "/x", "X-Real-IP", "192.0.2.1", "X-Original-Method", "POST"); c != 204 {
		t.Errorf("POST from the ip whose GET is blocked: %d, want 204", c)
	}
}
