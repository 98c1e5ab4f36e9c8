package app

import (
	"testing"

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
	s := newStack(t, `
rules:
  - name: api
    key: [user]
    algorithm: gcra
    limit: 100
    period: 1h
    burst: 100
`, "")
	hdr := []string{"X-Original-URI", "/x", "X-Real-IP", "192.0.2.1", "X-User-Id", "mallory"}
	s.api("PUT", "/v1/rules/api/identities?user=mallory", `{"limit":1,"period":"30d","reason":"abuse"}`, 200, nil)
	s.api("PUT", "/v1/rules/api/override", `{"burst":20000,"reason":"sale"}`, 200, nil)
	// Held to 1 per 30 days, mallory gets one request, then 429s.
	admitted := 0
	for i := 0; i < 50; i++ {
		if s.ask(hdr...) == 204 {
			admitted++
		}
	}
	var v policy.IdentityView
	s.api("GET", "/v1/rules/api/identities?user=mallory", "", 200, &v)
	if admitted != 13 || v.Error != "" {
		t.Errorf("after a rule override of the burst: mallory (identity override limit 1 per 30d) got %d of 50 admitted, want 13 (the burst that refills in 400 days); identity view: action %q error %q",
			admitted, v.Action, v.Error)
	}
	// An explicit burst is the operator's: the rule override leaves it.
	s.api("PUT", "/v1/rules/api/identities?user=eve", `{"limit":1,"period":"30d","burst":1}`, 200, nil)
	hdr[len(hdr)-1] = "eve"
	admitted = 0
	for i := 0; i < 5; i++ {
		if s.ask(hdr...) == 204 {
			admitted++
		}
	}
	if admitted != 1 {
		t.Errorf("eve, 1 per 30d with burst 1: %d of 5 admitted, want 1", admitted)
	}
}
