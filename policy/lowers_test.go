package policy

import (
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// TestNumbersLower: an override kept on the strict side after a rule change
// (ruleInForce) must give its identity no more than the rule: a lower
// quota that refills faster (90 a second under 100 an hour) does not count.
func TestNumbersLower(t *testing.T) {
	r := &limits.Rule{Algorithm: limits.FixedWindow, Limit: 100, Period: time.Hour}
	for _, c := range []struct {
		n    numbers
		want bool
	}{
		{numbers{limit: 2}, true},
		{numbers{limit: 100}, true},
		{numbers{limit: 101}, false},
		{numbers{limit: 90, period: time.Second}, false},
		{numbers{limit: 100, period: 2 * time.Hour}, true},
		{numbers{limit: 100, period: 30 * time.Minute}, false},
		{numbers{period: 2 * time.Hour}, true},
		{numbers{factor: 0.5}, true},
		{numbers{factor: 2}, false},
		{numbers{limit: 50, factor: 3}, false},
		{numbers{burst: 5}, false},
		{numbers{limit: 300, factor: 0.5}, false},
		{numbers{limit: 50, burst: 5000}, true}, // a window rule: the burst goes
	} {
		if got := c.n.lowers(r); got != c.want {
			t.Errorf("%+v lowers 100/h: %v, want %v", c.n, got, c.want)
		}
	}
	gc := &limits.Rule{Algorithm: limits.GCRA, Limit: 100, Period: time.Hour, Burst: 100}
	if (numbers{limit: 50, burst: 5000}).lowers(gc) {
		t.Error("a burst of 5000 under a gcra rule's 100 lowers it")
	}
	if !(numbers{limit: 50, burst: 50}).lowers(gc) {
		t.Error("50 an hour, burst 50, does not lower gcra 100 an hour, burst 100")
	}
}
