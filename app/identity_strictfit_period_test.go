package app

import (
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/policy"
)

// TestReloadDropsAFasterIdentityLimit: ruleInForce keeps an override that
// stops fitting after a reload when it "lowers the rule" (strictFit), on
// the claim that keeping it is the strict side. strictFit's test is a limit
// no higher than the rule's (or a factor under 1), which ignores the
// period: {"limit":50,"period":"1s"} on a rule of 100 per hour is a limit
// lower but a rate 1,800 times higher. Before strictFit such an override
// was dropped (the rule's 100 per hour applied, the strict side, as for
// bigco in TestReloadKeepsALowerIdentityLimit); now it is kept, as 50 per
// second, and the identity gets far more than the rule allows anyone.
func TestReloadDropsAFasterIdentityLimit(t *testing.T) {
	const gcra = `
rules:
  - name: api
    key: [user]
    algorithm: gcra
    limit: 100
    period: 1h
    burst: 100
`
	a, write := fileApp(t, gcra, zerolog.Nop())
	s := &stack{t: t, app: a, rules: a.Rules(), limiter: a.Limiter(), auth: serveOn(t, a.Handler()), admin: serveOn(t, a.AdminHandler())}
	admitted := func(user string, n int) int {
		k := 0
		for range n {
			if s.ask("X-Original-URI", "/x", "X-Real-IP", "192.0.2.1", "X-User-Id", user) == 204 {
				k++
			}
		}
		return k
	}
	// A limit "no higher than the rule's", in a period 3,600 times shorter
	// (the burst given explicitly, as bigco's).
	s.api("PUT", "/v1/rules/api/identities?user=fastco", `{"limit":50,"period":"1s","burst":50,"reason":"plan"}`, 200, nil)

	// The rule becomes a fixed window: fastco's burst does not fit.
	write(strings.Replace(strings.Replace(gcra, "gcra", "fixed_window", 1), "    burst: 100\n", "", 1))
	if _, err := a.Reload("test"); err != nil {
		t.Fatal(err)
	}
	var v policy.IdentityView
	s.api("GET", "/v1/rules/api/identities?user=fastco", "", 200, &v)

	// Three 1 s windows: the rule in force allows 100 an hour.
	n := admitted("fastco", 60)
	time.Sleep(1100 * time.Millisecond)
	n += admitted("fastco", 60)
	time.Sleep(1100 * time.Millisecond)
	n += admitted("fastco", 60)
	if n > 100 {
		t.Errorf("fixed_window 100 per hour after the reload: fastco (override limit 50 per 1s, which no longer fits) got %d of 180 admitted in ~2 s, want <= 100 (dropped, the rule's numbers, as before strictFit); identity view: error %q effective %+v",
			n, v.Error, v.Effective)
	}
}

// TestReloadDropsAScaledUpIdentityLimit: the same criterion ignores a
// factor given with the limit: {"limit":50,"factor":3} is 150 an hour on a
// rule of 100, "a limit no higher than the rule's" to strictFit, and kept
// after a reload it no longer fits.
func TestReloadDropsAScaledUpIdentityLimit(t *testing.T) {
	const gcra = `
rules:
  - name: api
    key: [user]
    algorithm: gcra
    limit: 100
    period: 1h
    burst: 100
`
	a, write := fileApp(t, gcra, zerolog.Nop())
	s := &stack{t: t, app: a, rules: a.Rules(), limiter: a.Limiter(), auth: serveOn(t, a.Handler()), admin: serveOn(t, a.AdminHandler())}
	s.api("PUT", "/v1/rules/api/identities?user=bigco", `{"limit":50,"burst":50,"factor":3,"reason":"plan"}`, 200, nil)
	write(strings.Replace(strings.Replace(gcra, "gcra", "fixed_window", 1), "    burst: 100\n", "", 1))
	if _, err := a.Reload("test"); err != nil {
		t.Fatal(err)
	}
	var v policy.IdentityView
	s.api("GET", "/v1/rules/api/identities?user=bigco", "", 200, &v)
	n := 0
	for range 200 {
		if s.ask("X-Original-URI", "/x", "X-Real-IP", "192.0.2.1", "X-User-Id", "bigco") == 204 {
			n++
		}
	}
	if n > 100 {
		t.Errorf("fixed_window 100 per hour after the reload: bigco (override limit 50 x factor 3 = 150, which no longer fits) got %d of 200 admitted, want <= 100; identity view: error %q effective %+v",
			n, v.Error, v.Effective)
	}
}
