package storetest

import (
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// slowRateKeepsUnits: a rule of 1,000 a second (burst 1,000) is changed
// to 1 a day (burst 1) and back, both valid numbers, within 2 ms (an
// override set and deleted, or two instances mid-reload). The 1,000 units
// used stay used: back under 1,000 a second, 998 of them still wait (2 ms
// drained 2), so a request of cost 500 must be denied. Under 1 a day the
// 1,000 units are 1,000 days, beyond the 2^45 µs (407 days) within which
// the conversion reads a backlog (or a debt); written there, they were 407
// units, and back at 1,000 a second the identity got 592 (gcra) or 593
// (token_bucket) units of fresh quota (the third review). Such a backlog
// is left as written now.
func slowRateKeepsUnits(t *testing.T, s Store) {
	for _, algo := range []limits.Algorithm{limits.GCRA, limits.TokenBucket} {
		t.Run(string(algo), func(t *testing.T) {
			key := "rg:{slow-rate:" + string(algo) + "}:" + algo.Suffix()
			fast := limits.Check{Key: key, Algorithm: algo, Limit: 1000, PeriodUS: limits.PeriodUS(time.Second), Burst: 1000}
			slow := limits.Check{Key: key, Algorithm: algo, Limit: 1, PeriodUS: limits.PeriodUS(24 * time.Hour), Burst: 1}
			start := ruleChangeEpoch() + limits.PeriodUS(10*time.Second)
			c := fast
			c.Cost = 1000
			if r := DecideOne(t, s.Store, c, start); !r.Allowed {
				t.Fatalf("the first 1000 denied: %+v", r)
			}
			c = slow
			c.Cost = 1
			if r := DecideOne(t, s.Store, c, start+1000); r.Allowed {
				t.Fatalf("admitted under 1 a day right after 1000 used: %+v", r)
			}
			c = fast
			c.Cost = 500
			if r := DecideOne(t, s.Store, c, start+2000); r.Allowed {
				t.Fatalf("2 ms after 1000 of 1000 used at 1000/s (and one look under 1/day), a request of 500 was admitted: %+v", r)
			}
		})
	}
}

// mixedRatesFarApart: two instances on one key, one at 1,000 a second
// (burst 1,000), the other at 1 a day (burst 1), a client alternating
// every ms with cost 500 on the fast side and 1 on the slow one. The
// loosest numbers of both allow 1,000 + 1,000 a second: 2,000 units in
// 1 s. Each slow-side denial wrote the backlog held at 2^45 µs, which the
// fast side read as 407 units: it admitted 500 on every request (250,000
// units in 1 s).
func mixedRatesFarApart(t *testing.T, s Store) {
	for _, algo := range []limits.Algorithm{limits.GCRA, limits.TokenBucket} {
		t.Run(string(algo), func(t *testing.T) {
			key := "rg:{far-rates:" + string(algo) + "}:" + algo.Suffix()
			fast := limits.Check{Key: key, Algorithm: algo, Limit: 1000, PeriodUS: limits.PeriodUS(time.Second), Burst: 1000, Cost: 500}
			slow := limits.Check{Key: key, Algorithm: algo, Limit: 1, PeriodUS: limits.PeriodUS(24 * time.Hour), Burst: 1, Cost: 1}
			start := ruleChangeEpoch() + limits.PeriodUS(10*time.Second)
			units := int64(0)
			for i := int64(0); i < 1000; i++ {
				c := fast
				if i%2 == 1 {
					c = slow
				}
				if DecideOne(t, s.Store, c, start+i*1000).Allowed {
					units += c.Cost
				}
			}
			if units > 2000 {
				t.Fatalf("%d units admitted in 1 s between 1000/s burst 1000 and 1/day burst 1, want at most 2000 (the larger burst, then the faster rate)", units)
			}
		})
	}
}
