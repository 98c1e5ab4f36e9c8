package redisstore

import (
	"fmt"
	"testing"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"
)

// TestClusterBurstAdmitsTheLimit: 100 users with a limit of 1 each and a
// global limit of 100, every user asking three times at once (300
// concurrent two-slot requests). Exactly 100 fit. Deciding both slots at
// once let a user's second request hold a unit of the global rule until
// its refund, so other users were denied meanwhile: 65–88 were admitted.
// Deciding the slot most likely to deny first (the smallest limit), and
// the others only once it admitted, admits exactly 100, with cost 1 and 2.
func TestClusterBurstAdmitsTheLimit(t *testing.T) {
	c := sharedCluster.Get(t)
	if err := c.FlushAll(); err != nil {
		t.Fatal(err)
	}
	rs := openClusterStore(t, c)
	for _, cost := range []int64{1, 2} {
		for _, algo := range []limits.Algorithm{limits.FixedWindow, limits.GCRA, limits.SlidingWindow} {
			t.Run(fmt.Sprintf("%s/cost=%d", algo, cost), func(t *testing.T) {
				tag := fmt.Sprintf("burst-%s-%d", algo, cost)
				global := limits.Check{Key: "rg:{" + tag + ":}:" + algo.Suffix(), Algorithm: algo,
					Limit: 100 * cost, PeriodUS: limits.PeriodUS(storetest.ConcurrencyPeriod), Burst: 100 * cost, Cost: cost}
				const users, each = 100, 3
				admitted := hammer(t, rs, users*each, func(i int) []limits.Check {
					user := limits.Check{Key: fmt.Sprintf("rg:{%s:u%d}:%s", tag, i%users, algo.Suffix()), Algorithm: algo,
						Limit: cost, PeriodUS: limits.PeriodUS(storetest.ConcurrencyPeriod), Burst: cost, Cost: cost}
					return []limits.Check{global, user}
				})
				t.Logf("%d users x %d requests: %d admitted, want %d", users, each, admitted, users)
				if admitted != users {
					t.Errorf("admitted %d, want exactly %d (each user's one, all within the global limit)", admitted, users)
				}
			})
		}
	}
}
