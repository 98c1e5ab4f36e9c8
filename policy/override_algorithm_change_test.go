package policy

import (
	"context"
	"testing"

	"github.com/rs/zerolog"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
)

// TestLoweringOverrideSurvivesAnAlgorithmChange: an operator lowers a
// token_bucket rule with an override of limit and burst (an incident);
// a reload then makes the rule a fixed_window, where a burst does not
// fit. Ignoring the whole override hands every identity the file's
// limit again, failing open in the middle of the incident. What still
// fits and still lowers the rule (the limit) stays in force, as it does
// for an identity's override; a raise whose burst no longer fits is
// still ignored.
func TestLoweringOverrideSurvivesAnAlgorithmChange(t *testing.T) {
	parse := func(yaml string) *config.Config {
		t.Helper()
		cfg, err := config.Parse("t.yaml", []byte(yaml))
		if err != nil {
			t.Fatal(err)
		}
		return cfg
	}
	bucket := parse(`rules:
  - {name: api, key: [user], algorithm: token_bucket, limit: 100, period: 1m, burst: 100}
`)
	window := parse(`rules:
  - {name: api, key: [user], algorithm: fixed_window, limit: 100, period: 1m}
`)
	for _, tc := range []struct {
		name, body string
		want       int64
	}{
		{"lowering", `{"limit":5,"burst":5}`, 5},
		{"raising", `{"limit":500,"burst":500}`, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mem := memstore.New()
			t.Cleanup(func() { mem.Close() })
			l := limits.New(limits.Options{Store: mem, Prefix: "rg", Rules: bucket.Rules})
			m := NewManager(ManagerOptions{Config: bucket, Limiter: l, Overrides: NewMemoryOverrides(), Log: zerolog.Nop()})
			if _, err := m.SetOverride(context.Background(), "api", []byte(tc.body)); err != nil {
				t.Fatal(err)
			}
			m.SetFile(window.Rules, "t.yaml")
			r := l.Rule("api")
			if r.Algorithm != limits.FixedWindow || r.Limit != tc.want {
				t.Errorf("override %s, then the rule became fixed_window 100/1m: %s limit %d in force, want fixed_window %d", tc.body, r.Algorithm, r.Limit, tc.want)
			}
			view := m.View().Rules[0]
			if view.OverrideError == "" {
				t.Errorf("the view does not say the override's burst no longer fits (override %s)", tc.body)
			}
		})
	}
}
