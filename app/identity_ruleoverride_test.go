package app

import (
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/policy"
)

// TestRuleOverrideKeepsASlowIdentityOverride: an abuser is held to 1 per
// 30 days ({"limit":1,"period":"30d"}: a burst of 1, the rule's ratio),
// then the operator raises the rule's burst for everyone (a sale). The
// identity's burst keeps the rule's ratio (200), which would take 6,000
// days to refill, past the 400 days every rule is held to: the override
// used to stop applying ("does not fit the rule as it now stands"), and
// the abuser got the rule's 100 an hour with a burst of 20,000 (50 of 50
// admitted). A burst the override does not give is now capped at what
// refills within 400 days (13 at 1 per 30 days): the override stays in
// force, and an explicit burst stays the operator's.
func TestRuleOverrideKeepsASlowIdentityOverride(t *testing.T) {
	s := newStack(t, gcraPerUser, "")
	s.api("PUT", "/v1/rules/api/identities?user=mallory", `{"limit":1,"period":"30d","reason":"abuse"}`, 200, nil)
	s.api("PUT", "/v1/rules/api/override", `{"burst":20000,"reason":"sale"}`, 200, nil)
	admitted := s.admittedOf("mallory", 50)
	var v policy.IdentityView
	s.api("GET", "/v1/rules/api/identities?user=mallory", "", 200, &v)
	if admitted != 13 || v.Error != "" {
		t.Errorf("after a rule override of the burst: mallory (identity override limit 1 per 30d) got %d of 50 admitted, want 13 (the burst that refills in 400 days); identity view: action %q error %q",
			admitted, v.Action, v.Error)
	}
	// An explicit burst is the operator's: the rule override leaves it.
	s.api("PUT", "/v1/rules/api/identities?user=eve", `{"limit":1,"period":"30d","burst":1}`, 200, nil)
	if admitted := s.admittedOf("eve", 5); admitted != 1 {
		t.Errorf("eve, 1 per 30d with burst 1: %d of 5 admitted, want 1", admitted)
	}
}

// TestReloadKeepsALowerIdentityLimit: an identity override whose numbers
// fitted the rule when it was set stops fitting when a reload changes the
// rule under it: a rule cost above the identity's burst, or an algorithm
// without a burst for an override that gives one. Dropping it handed the
// identity the rule's own numbers, a lower limit failing open; an override
// that lowers the rule now keeps applying, on the strict side (the burst
// dropped where the algorithm has none; a request costing more than the
// identity's burst never fits). One that raises it stops applying, as
// before, and says why.
func TestReloadKeepsALowerIdentityLimit(t *testing.T) {
	const gcra = gcraPerUser
	a, write := fileApp(t, gcra, zerolog.Nop())
	s := &stack{t: t, app: a, rules: a.Rules(), limiter: a.Limiter(), auth: serveOn(t, a.Handler()), admin: serveOn(t, a.AdminHandler())}
	admitted := func(user string, n int) int { return s.admittedOf(user, n) }
	s.api("PUT", "/v1/rules/api/identities?user=mallory", `{"limit":2,"burst":2,"reason":"abuse"}`, 200, nil)
	s.api("PUT", "/v1/rules/api/identities?user=bigco", `{"limit":200,"burst":400,"reason":"plan"}`, 200, nil)
	reload := func(yaml string) {
		t.Helper()
		write(yaml)
		if _, err := a.Reload("test"); err != nil {
			t.Fatal(err)
		}
	}
	view := func(user string) policy.IdentityView {
		var v policy.IdentityView
		s.api("GET", "/v1/rules/api/identities?user="+user, "", 200, &v)
		return v
	}

	// The rule's cost rises above mallory's burst.
	reload(strings.Replace(gcra, "burst: 100\n", "burst: 100\n    cost: 5\n", 1))
	if n := admitted("mallory", 5); n != 0 {
		t.Errorf("cost 5 against mallory's burst of 2: %d of 5 admitted, want 0 (before: the rule's burst of 100)", n)
	}
	if v := view("mallory"); v.Error != "" {
		t.Errorf("mallory's override after the cost rose: error %q, want it in force", v.Error)
	}

	// The rule becomes a fixed window: mallory's burst goes, its limit stays.
	reload(strings.Replace(strings.Replace(gcra, "gcra", "fixed_window", 1), "    burst: 100\n", "", 1))
	if n := admitted("mallory", 5); n != 2 {
		t.Errorf("fixed_window, mallory's limit 2: %d of 5 admitted, want 2", n)
	}
	// bigco's override raised the rule: on a window algorithm its burst
	// does not fit, and it stops applying, and says why (the rule's limit
	// of 100 is the strict side).
	if v := view("bigco"); !strings.Contains(v.Error, "burst") {
		t.Errorf("bigco's burst on a fixed_window rule: error %q, want it flagged", v.Error)
	}
	// Set now, a burst on a window rule is refused, as it always was.
	s.api("PUT", "/v1/rules/api/identities?user=eve", `{"limit":2,"burst":2}`, 400, nil)
}

// gcraPerUser is the rule of the identity tests here: 100 an hour per
// user, a burst of 100.
const gcraPerUser = `
rules:
  - name: api
    key: [user]
    algorithm: gcra
    limit: 100
    period: 1h
    burst: 100
`

// admittedOf asks n times for user and returns how many were admitted.
func (s *stack) admittedOf(user string, n int) int {
	k := 0
	for range n {
		if s.ask("X-Original-URI", "/x", "X-Real-IP", "192.0.2.1", "X-User-Id", user) == 204 {
			k++
		}
	}
	return k
}
