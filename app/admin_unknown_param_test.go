package app

import "testing"

// TestKeyEndpointsRefuseAnUnknownParameter: /v1/rules/{rule}/identities
// refuses a query parameter that names no dimension of the rule, but
// /v1/keys/{rule} ignored it. On a rule keyed on user (anonymous callers
// counted by ip), DELETE /v1/keys/r?ip=192.0.2.9&User=bob (a misspelt
// user, or ?usr=) answered 200 "reset": true and reset the anonymous
// caller 192.0.2.9, not bob: bob stayed denied, and the operator was told
// the unban worked. Reset nothing; say which parameter is wrong.
func TestKeyEndpointsRefuseAnUnknownParameter(t *testing.T) {
	s := newStack(t, `rules:
  - name: r
    key: [user]
    algorithm: fixed_window
    limit: 1
    period: 1h
`, "")
	bob := []string{"X-Original-URI", "/a", "X-Real-IP", "192.0.2.9", "X-User-Id", "bob"}
	anon := []string{"X-Original-URI", "/a", "X-Real-IP", "192.0.2.9"}
	for range 2 {
		s.ask(bob...)
		s.ask(anon...)
	}
	wantKeyCallsRefused(t, s, "not a dimension", "/v1/keys/r?ip=192.0.2.9&User=bob", "/v1/keys/r?ip=192.0.2.9&usr=bob")
	if got := s.ask(anon...); got != 429 {
		t.Errorf("anonymous 192.0.2.9 after the refused resets: %d, want 429 (nothing reset)", got)
	}
}

// TestListAndTopRefuseUnknownOrRepeatedParameters: GET /v1/top took
// ?rule=a&rule=b as rule a alone, ?minutes=1&minutes=9 as 1 (9 is out of
// range), and ignored a misspelt ?minute= or ?rules= (answering for the
// default, or every rule, as if asked); the identities list took the first
// of two ?n= and ?after=. Each is a 400 that names the parameter, as the
// identity endpoints answer.
func TestListAndTopRefuseUnknownOrRepeatedParameters(t *testing.T) {
	s := newStack(t, ruleYAML("fixed_window", false), "")
	for _, uri := range []string{
		"/v1/top?rule=r&rule=r",
		"/v1/top?minutes=1&minutes=9",
		"/v1/top?n=1&n=5000",
		"/v1/top?minute=1",
		"/v1/top?rules=r",
		"/v1/rules/r/identities?n=5&n=6",
		"/v1/rules/r/identities?after=a&after=b",
	} {
		code, out := call(t, s.admin, "GET", uri, "")
		if code != 400 {
			t.Errorf("GET %s: %d %.300s, want 400", uri, code, out)
		}
	}
	if code, out := call(t, s.admin, "GET", "/v1/top?rule=r&minutes=2&n=5", ""); code != 200 {
		t.Errorf("GET /v1/top with each parameter once: %d %.300s", code, out)
	}
}
