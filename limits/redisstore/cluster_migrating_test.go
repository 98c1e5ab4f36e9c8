package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"
)

// migratingChecks opens a cluster store and returns a per-user check (a
// limit of 2, the slot cluster.go decides first) for user u, a global
// check (limit 3, another slot), and a decide with a 300 ms deadline that
// reports how long the decision took.
func migratingChecks(t *testing.T, c *testredis.Cluster) (*Store, func(u string) limits.Check, limits.Check, func(checks ...limits.Check) (bool, []limits.Result, time.Duration)) {
	t.Helper()
	rs := openClusterStore(t, c)
	ctx := testredis.Ctx(t)
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	hour := storetest.SteadyPeriod()
	user := func(u string) limits.Check {
		return limits.Check{Key: "rg:{pu:" + u + "}:fw", Algorithm: limits.FixedWindow, Limit: 2, PeriodUS: hour, Burst: 2, Cost: 1}
	}
	glob := limits.Check{Key: "rg:{glob:}:fw", Algorithm: limits.FixedWindow, Limit: 3, PeriodUS: hour, Burst: 3, Cost: 1}
	if KeySlot(user("alice").Key) == KeySlot(glob.Key) {
		t.Fatal("alice's key and global's share a slot")
	}
	decide := func(checks ...limits.Check) (bool, []limits.Result, time.Duration) {
		t.Helper()
		res := make([]limits.Result, len(checks))
		dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		start := time.Now()
		a, err := rs.Decide(dctx, &limits.Batch{Checks: checks}, res)
		if err != nil {
			t.Fatalf("decide: %v", err)
		}
		return a, res, time.Since(start)
	}
	return rs, user, glob, decide
}

// TestClusterDenialNotHeldByAMigratingSlot: a request its first slot denies
// asks the other slots for their rules' verdicts with a dry run that added
// one key to each slot's script, a sibling key that never exists (now a
// never-fitting check on a key the slot's script has already). While a
// slot is being migrated (resharding, adding a node: an ordinary cluster
// event), a script with one key that exists on the source and one that
// does not is refused with TRYAGAIN on both sides, so the dry run is tried
// again and again: alice, denied by her own per-user slot, which is not
// moving, waits ~100 ms (the whole of a 50 ms redis.timeout by default)
// for a verdict of global that is thrown away, where the same denial took
// under a millisecond before the migration. Every denial the deny cache
// does not answer (a new identity, an entry past its retry) pays it for as
// long as the migration lasts.
func TestClusterDenialNotHeldByAMigratingSlot(t *testing.T) {
	c := testredis.StartCluster(t)
	_, user, glob, decide := migratingChecks(t, c)
	alice := user("alice")
	alice.Limit, alice.Burst = 1, 1
	if a, _, _ := decide(alice, glob); !a {
		t.Fatal("alice's first request denied")
	}
	a, _, before := decide(alice, glob)
	if a {
		t.Fatal("alice's second request admitted")
	}
	migrateSlot(t, c, KeySlot(glob.Key))
	a, res, during := decide(alice, glob)
	t.Logf("alice denied by her own slot: %v before global's slot migrates, %v while it does (global reported %+v)",
		before.Round(time.Microsecond), during.Round(time.Microsecond), res[1])
	if a || res[0].Allowed {
		t.Fatalf("alice admitted while migrating: %+v", res)
	}
	if during > 20*time.Millisecond {
		t.Errorf("a denial decided by alice's own slot took %v (%v before) while global's slot was being migrated: "+
			"the dry run's never-existing sibling key makes global's script TRYAGAIN on both sides until the retries or the deadline end; want within 20 ms",
			during.Round(time.Millisecond), before.Round(time.Microsecond))
	}
}

// TestClusterRefundInAMigratingSlot: a refund is refund.lua on the
// refunded keys plus a fresh marker key (run-at-most-once), which never
// exists before the refund runs (met with TRYAGAIN, the refund is now sent
// at once without it). While the refunded key's slot is being
// migrated, a script with one existing key and one missing key gets
// TRYAGAIN on both sides, so every refund in that slot fails until the
// migration ends. runRefund retries on the request's context: alice's
// request, admitted by her per-user slot and denied by global, is held for
// its whole deadline (300 ms here; the whole redis.timeout) although its
// answer was known after one round trip; then one background attempt (1 s)
// fails too and the refund is lost: the unit alice's denied request took
// stays consumed, so Redis denies her next request, which it would admit
// (limit 2: one spent, the denied one should have taken nothing).
func TestClusterRefundInAMigratingSlot(t *testing.T) {
	c := testredis.StartCluster(t)
	rs, user, glob, decide := migratingChecks(t, c)
	for _, u := range []string{"f1", "f2", "f3"} {
		if a, _, _ := decide(user(u), glob); !a {
			t.Fatalf("filler %s denied", u)
		}
	}
	if a, _, _ := decide(user("alice")); !a {
		t.Fatal("alice's first request denied")
	}
	migrateSlot(t, c, KeySlot(user("alice").Key))
	a, res, took := decide(user("alice"), glob)
	if a || res[1].Allowed {
		t.Fatalf("alice's request to the spent global admitted: %+v", res)
	}
	time.Sleep(backgroundRefundTimeout + 500*time.Millisecond)
	a2, res2, _ := decide(user("alice"))
	t.Logf("denied request with a refund in the migrating slot took %v; refunds %+v; alice's next request admitted=%v %+v",
		took.Round(time.Millisecond), rs.Refunds(), a2, res2[0])
	if took > 50*time.Millisecond {
		t.Errorf("alice's denied request was answered after %v (deadline 300 ms): its refund, refused with TRYAGAIN for as long as the slot migrates (the marker key never exists), was retried on the request's own time; want within 50 ms",
			took.Round(time.Millisecond))
	}
	if !a2 {
		t.Errorf("alice's next request denied (%+v, refunds %+v): the refund of her denied request was lost in the migrating slot and its unit stays consumed until the window ends",
			res2[0], rs.Refunds())
	}
}

// TestClusterResetInAMigratingSlot: an admin reset (Store.Reset) of a
// live key whose slot is being migrated. reset.lua named two keys, the
// record and its reset stamp, which does not exist before the reset: a
// script with one key present on the source and one missing is refused
// with TRYAGAIN on both sides for as long as the migration lasts, and the
// operator's unban failed with a 503 until then (the review's test). The
// stamp is no longer named; the reset deletes the key, and alice is
// admitted again.
func TestClusterResetInAMigratingSlot(t *testing.T) {
	c := testredis.StartCluster(t)
	rs, user, _, decide := migratingChecks(t, c)
	alice := user("alice")
	alice.Limit, alice.Burst = 1, 1
	if a, _, _ := decide(alice); !a {
		t.Fatal("alice's first request denied")
	}
	if a, _, _ := decide(alice); a {
		t.Fatal("alice's second request admitted")
	}
	migrateSlot(t, c, KeySlot(alice.Key))
	ctx, cancel := context.WithTimeout(testredis.Ctx(t), 2*time.Second)
	defer cancel()
	start := time.Now()
	err := rs.Reset(ctx, limits.Check{Key: alice.Key, Algorithm: alice.Algorithm, Limit: 1, PeriodUS: alice.PeriodUS, Burst: 1})
	if err != nil {
		t.Fatalf("admin reset of alice's key while its slot migrates (nothing moved yet) failed after %v: %v; "+
			"a DEL of the one key succeeded", time.Since(start).Round(time.Millisecond), err)
	}
	if a, _, _ := decide(alice); !a {
		t.Fatal("alice denied after the reset")
	}
}
