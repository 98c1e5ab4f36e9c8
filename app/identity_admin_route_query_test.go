package app

import "testing"

// TestAdminRouteQueryOverrideNotWholeRoute: ?route= is normalized as /auth
// normalizes a request, so an override PUT for "/status?probe=lb" lands
// on the route /status and exempts every request of it: 6 of 6 requests
// of /status?x=1 admitted at a limit of 3 per hour. No route /auth counts
// holds a query: such an identity is one "no request can carry", which
// the admin API otherwise refuses with a 400.
func TestAdminRouteQueryOverrideNotWholeRoute(t *testing.T) {
	s := newStack(t, `
rules:
  - name: byr
    key: [route]
    algorithm: fixed_window
    limit: 3
    period: 1h
`, "")
	code, out := call(t, s.admin, "PUT", "/v1/rules/byr/identities?route=%2Fstatus%3Fprobe%3Dlb", `{"exempt":true}`)
	if code == 400 {
		return
	}
	if code != 200 {
		t.Fatalf("PUT route=/status?probe=lb: %d %s", code, out)
	}
	req := []string{"X-Original-URI", "/status?x=1", "X-Real-IP", "192.0.2.1"}
	if n := s.countAdmitted(6, req...); n != 3 {
		t.Fatalf("after exempting route /status?probe=lb: %d of 6 requests of /status?x=1 admitted at limit 3, want 3: %s", n, out)
	}
}
