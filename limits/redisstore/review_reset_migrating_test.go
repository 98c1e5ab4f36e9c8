package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
)

// TestReviewResetDuringSlotMigration: an admin reset (Store.Reset) of a
// live key whose slot is being migrated. It used to be one DEL (a single
// key: the source serves it while the key is still there). reset.lua
// names two keys, the record and its reset stamp, and the stamp does not
// exist before the reset: a script with one key present on the source
// and one missing is refused with TRYAGAIN on both sides for as long as
// the migration lasts (TestClusterDenialNotHeldByAMigratingSlot is the
// same effect on the dry run). The operator's unban fails with a 503.
func TestReviewResetDuringSlotMigration(t *testing.T) {
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
}
