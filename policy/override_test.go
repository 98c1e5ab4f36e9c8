package policy

import (
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// TestApplyArithmetic: factors are exact on the decimal written, the burst
// keeps its ratio to the limit unless given, window algorithms keep burst
// equal to limit.
func TestApplyArithmetic(t *testing.T) {
	g := &limits.Rule{Name: "g", Algorithm: limits.GCRA, Limit: 100, Period: time.Minute, Burst: 50, Cost: 1}
	w := &limits.Rule{Name: "w", Algorithm: limits.FixedWindow, Limit: 100, Period: time.Minute, Burst: 100, Cost: 1}
	for _, c := range []struct {
		r            *limits.Rule
		o            Override
		limit, burst int64
		period       time.Duration
	}{
		{g, Override{Factor: 0.29}, 29, 14, time.Minute},
		{g, Override{Factor: 1.5}, 150, 75, time.Minute},
		{g, Override{Limit: 200}, 200, 100, time.Minute},
		{g, Override{Limit: 200, Burst: 7}, 200, 7, time.Minute},
		{g, Override{Limit: 200, Factor: 0.5}, 100, 50, time.Minute},
		{g, Override{Period: Duration(time.Hour)}, 100, 50, time.Hour},
		{g, Override{Factor: 0.001}, 1, 1, time.Minute},
		{w, Override{Factor: 0.29}, 29, 29, time.Minute},
		{w, Override{Limit: 7}, 7, 7, time.Minute},
	} {
		e, err := Apply(c.r, &c.o)
		if err != nil {
			t.Errorf("%s %+v: %v", c.r.Name, c.o, err)
			continue
		}
		if e.Limit != c.limit || e.Burst != c.burst || e.Period != c.period {
			t.Errorf("%s %+v: limit %d burst %d period %v, want %d %d %v", c.r.Name, c.o, e.Limit, e.Burst, e.Period, c.limit, c.burst, c.period)
		}
		if c.r.Limit != 100 {
			t.Fatal("Apply modified the file's rule")
		}
	}
}
