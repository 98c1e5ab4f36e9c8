package redisstore

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"
)

// TestLeaseTakeRunsOnceOnCluster: a lease take is a commit (a decision of
// cost g on the rule's key), so, like a decision, it runs at most once.
// It went through go-redis's ClusterClient, which resends a command whose
// connection died before the reply whatever MaxRetries says: a take whose
// reply was lost after Redis ran it ran again, and the key counted the
// slice twice (the same slice id overwritten in the lease record, the first
// grant held by nobody and never returned). Takes now go to the slot's
// primary as decisions do (runOnce).
//
// Here: 300 takes of want 1, each on a key of its own, while a proxy cuts
// 10% of the connections right after Redis answered. No key may count more
// than one unit.
func TestLeaseTakeRunsOnceOnCluster(t *testing.T) {
	rs, px, cc := proxiedCluster(t)
	ctx := context.Background()
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	key := func(i int) string { return "rg:{leaseonce:" + strconv.Itoa(i) + "}:fw" }
	px.dropReplies(0.10)
	const n = 300
	granted, failed := 0, 0
	for i := range n {
		chk := limits.Check{Key: key(i), Algorithm: limits.FixedWindow, Limit: 100, PeriodUS: storetest.SteadyPeriod(), Burst: 100, Cost: 1}
		tctx, cancel := context.WithTimeout(ctx, time.Second)
		g, err := rs.TakeLease(tctx, &limits.LeaseTake{Check: chk, Want: 1, ID: "probe-" + strconv.Itoa(i), TTLUS: 2_000_000})
		cancel()
		switch {
		case err != nil:
			failed++
		default:
			granted += int(g.Granted)
		}
	}
	px.dropReplies(0)
	total, twice := countUnits(t, n, key, func(k string) (int, error) { return fwCount(cc, k) })
	t.Logf("%d takes of 1: %d units granted, %d failed (%d replies dropped); %d units counted in Redis, %d keys counted twice",
		n, granted, failed, px.dropped(), total, twice)
	if px.dropped() == 0 {
		t.Fatal("the proxies dropped nothing: the test tested nothing")
	}
	if twice > 0 {
		t.Errorf("%d keys count 2 units for one take of 1: a lease take ran again after its reply was lost", twice)
	}
}
