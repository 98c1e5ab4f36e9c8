package app

import (
	"testing"
)

// countAdmitted sends n /auth requests with headers kv and counts the 204s.
func (s *stack) countAdmitted(n int, kv ...string) int {
	ok := 0
	for i := 0; i < n; i++ {
		if s.ask(kv...) == 204 {
			ok++
		}
	}
	return ok
}

// TestAdminMethodHEADOverrideDoesNotExemptGET: PUT ?method=HEAD is stored
// under the GET identity ("192.0.2.1|GET": a method key counts HEAD as
// GET), and the answer still says {"method":"HEAD"}. An operator who
// exempts a monitor's HEAD checks exempts every GET of that address: 6 of
// 6 GETs admitted at a limit of 3 per hour. The admin API refuses other
// methods no request has as such ("GET "); HEAD, which no identity has
// either, should be refused naming GET (or kept off GET's identity).
func TestAdminMethodHEADOverrideDoesNotExemptGET(t *testing.T) {
	s := newStack(t, `
rules:
  - name: bym
    key: [ip, method]
    algorithm: fixed_window
    limit: 3
    period: 1h
`, "")
	code, out := call(t, s.admin, "PUT", "/v1/rules/bym/identities?ip=192.0.2.1&method=HEAD", `{"exempt":true}`)
	if code == 400 {
		return // refused: fine
	}
	if code != 200 {
		t.Fatalf("PUT method=HEAD: %d %s", code, out)
	}
	get := []string{"X-Original-URI", "/x", "X-Real-IP", "192.0.2.1", "X-Original-Method", "GET"}
	if n := s.countAdmitted(6, get...); n != 3 {
		t.Fatalf("after exempting HEAD of 192.0.2.1: %d of 6 GETs admitted at limit 3, want 3 (the HEAD override applies to GET): %s", n, out)
	}
}
