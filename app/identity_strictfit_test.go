package app

import (
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/policy"
)

// TestReloadDropsALooserIdentityOverride: an override that stops fitting
// after a reload is kept on the strict side only when it lowers the rule
// (TestReloadKeepsALowerIdentityLimit). A limit no higher than the rule's
// is not enough: 50 a second is a lower limit than 100 an hour at a rate
// 1,800 times higher, and 50 with a factor of 3 is 150. Such overrides are
// dropped, as before (the rule's numbers, the strict side), and say why; a
// first version of the strict fit kept them (150 admitted where the rule
// allows 100).
func TestReloadDropsALooserIdentityOverride(t *testing.T) {
	for _, c := range []struct{ name, body string }{
		{"a faster rate", `{"limit":50,"period":"1s","burst":50}`},
		{"a factor above 1", `{"limit":50,"burst":50,"factor":3}`},
		{"a factor under 1 of a higher limit", `{"limit":300,"burst":300,"factor":0.5}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			a, write := fileApp(t, gcraPerUser, zerolog.Nop())
			s := &stack{t: t, app: a, rules: a.Rules(), limiter: a.Limiter(), auth: serveOn(t, a.Handler()), admin: serveOn(t, a.AdminHandler())}
			s.api("PUT", "/v1/rules/api/identities?user=bigco", c.body, 200, nil)
			// The rule becomes a fixed window: the override's burst does
			// not fit it.
			write(strings.Replace(strings.Replace(gcraPerUser, "gcra", "fixed_window", 1), "    burst: 100\n", "", 1))
			if _, err := a.Reload("test"); err != nil {
				t.Fatal(err)
			}
			var v policy.IdentityView
			s.api("GET", "/v1/rules/api/identities?user=bigco", "", 200, &v)
			if !strings.Contains(v.Error, "does not fit") {
				t.Errorf("the override after the reload: error %q, want it flagged", v.Error)
			}
			n := s.admittedOf("bigco", 80)
			if c.name == "a faster rate" {
				// past one of its 1 s windows
				time.Sleep(1100 * time.Millisecond)
				n += s.admittedOf("bigco", 80)
			}
			if n > 100 {
				t.Errorf("fixed_window 100 an hour after the reload: %d admitted, want at most 100 (the rule's numbers)", n)
			}
		})
	}
}
