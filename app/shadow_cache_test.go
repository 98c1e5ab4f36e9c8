package app

import (
	"fmt"
	"testing"
)

// Shadow rules "are evaluated on every matching request" and show up as
// shadow_limited (docs/operations.md, "Shadow rules"). A request the deny
// cache answered counted every other matching rule as allowed, so a shadow
// rule that would deny (its 1 an hour long spent) was counted allowed: the
// same traffic gave other shadow numbers with the deny cache on (single
// Redis, Sentinel) than off (Cluster, deny_cache.enabled: false). A cached
// answer now reports a shadow rule as the store last saw it, until its
// retry time.
const shadowBesideCachedDenial = `
deny_cache: {enabled: %v}
rules:
  - name: strict
    key: [ip]
    algorithm: fixed_window
    limit: 1
    period: 1h
  - name: candidate
    key: [ip]
    algorithm: fixed_window
    limit: 1
    period: 1h
    shadow: true
`

func TestShadowVerdictsDoNotDependOnTheDenyCache(t *testing.T) {
	got := map[bool][2]float64{}
	for _, cache := range []bool{false, true} {
		s := newStack(t, fmt.Sprintf(shadowBesideCachedDenial, cache), "redis")
		for i, want := range []int{204, 429, 429, 429, 429} {
			if code := s.ask("X-Original-URI", "/x", "X-Real-IP", "192.0.2.9"); code != want {
				t.Fatalf("deny cache %v: request %d: %d, want %d", cache, i, code, want)
			}
		}
		got[cache] = [2]float64{
			counterValue(s.app, `rategate_decisions_total{rule="candidate",decision="allowed"}`),
			counterValue(s.app, `rategate_decisions_total{rule="candidate",decision="shadow_limited"}`),
		}
	}
	if got[true] != got[false] || got[false] != [2]float64{1, 4} {
		t.Errorf("shadow rule candidate (allowed, shadow_limited): deny cache off %v, on %v; want {1, 4} both ways:"+
			" a cached denial counts the shadow rule that would deny as allowed", got[false], got[true])
	}
}
