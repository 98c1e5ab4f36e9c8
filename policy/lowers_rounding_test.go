package policy

import (
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// TestStrictFitNeverRaisesTheRate: lowers judged an override's numbers
// before Apply rounded them, and Apply makes a scaled limit at least 1. On
// a rule of 3 an hour, an identity override of a fifth of it per 15
// minutes (0.6 per 15m, "2.4 an hour") passed, and strictFit kept it as 1
// per 15 minutes: 4 an hour, above the rule's 3, where the override no
// longer fitted the rule and was meant to be dropped for the rule's own
// numbers; factor 0.0001 per 1s on 1 an hour kept 1 a second. The numbers
// are judged again as they come out.
func TestStrictFitNeverRaisesTheRate(t *testing.T) {
	for _, c := range []struct {
		base *limits.Rule
		n    numbers
	}{
		{&limits.Rule{Name: "reset", Algorithm: limits.FixedWindow, Limit: 3, Period: time.Hour, Burst: 3, Cost: 1},
			numbers{period: 15 * time.Minute, factor: 0.2, burst: 1}},
		{&limits.Rule{Name: "reset", Algorithm: limits.FixedWindow, Limit: 1, Period: time.Hour, Burst: 1, Cost: 1},
			numbers{period: time.Second, factor: 0.0001, burst: 1}},
	} {
		ri := &ruleIdentities{base: c.base}
		got, ok := strictFit(ri.base, c.n)
		if !ok {
			continue
		}
		baseRate := float64(c.base.Limit) / c.base.Period.Hours()
		rate := float64(got.Limit) / got.Period.Hours()
		if got.Limit > c.base.Limit || rate > baseRate {
			t.Errorf("%s %d per %s: strict fit of %+v is %d per %s (%.0f an hour, the rule's %.0f): a raise kept as a lower limit",
				c.base.Algorithm, c.base.Limit, c.base.Period, c.n, got.Limit, got.Period, rate, baseRate)
		}
	}
}
