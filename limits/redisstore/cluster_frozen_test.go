package redisstore

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
)

// TestClusterFrozenPrimary freezes one of three primaries for 1.5 s
// (SIGSTOP, as a DEBUG SLEEP would; shorter than the failover timeout)
// under load, with coalescing on:
//
//   - decisions whose keys all live on the other primaries keep being
//     decided by Redis (go-redis's cluster pipeline waits for every node it
//     touches, so they used to fail with the frozen one);
//   - decisions on the frozen primary fail, and soon fail at once (its own
//     breaker) instead of each waiting the whole budget;
//   - what the frozen primary committed for callers that had given up is
//     given back when it wakes: its key ends holding exactly the units the
//     store's answers admitted.
func TestClusterFrozenPrimary(t *testing.T) {
	c := testredis.StartCluster(t)
	rs, err := Open(Options{ClusterAddrs: c.Addrs(), Coalesce: CoalesceOptions{Budget: decisionTimeout}})
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	ctx := testredis.Ctx(t)
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	keys := keysOnEveryPrimary(t, c, "frozen", "fw")
	_, primaries := slotOwners(t, c)
	victim := primaries[0]
	frozenKey, healthyKeys := keys[0], keys[1:]
	check := func(key string) limits.Check {
		return limits.Check{Key: key, Algorithm: limits.FixedWindow, Limit: 1 << 30, PeriodUS: storetest.SteadyPeriod(), Burst: 1 << 30, Cost: 1}
	}

	type tally struct {
		ok, failed, slowFailed atomic.Int64
	}
	var healthy, frozen tally
	stop := make(chan struct{})
	var wg sync.WaitGroup
	worker := func(key string, tl *tally) {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			dctx, cancel := context.WithTimeout(ctx, decisionTimeout)
			start := time.Now()
			var r [1]limits.Result
			ok, err := rs.Decide(dctx, &limits.Batch{Checks: []limits.Check{check(key)}}, r[:])
			took := time.Since(start)
			cancel()
			switch {
			case err == nil && ok:
				tl.ok.Add(1)
			case err != nil:
				tl.failed.Add(1)
				if took >= decisionTimeout {
					tl.slowFailed.Add(1)
				}
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	for i := range 4 {
		wg.Add(2)
		go worker(healthyKeys[i%len(healthyKeys)], &healthy)
		go worker(frozenKey, &frozen)
	}
	time.Sleep(300 * time.Millisecond)
	healthyBefore := healthy.ok.Load()
	node := c.Node(victim)
	if err := node.Freeze(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1500 * time.Millisecond)
	if err := node.Thaw(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	close(stop)
	wg.Wait()

	t.Logf("healthy primaries: %d decided (%d before the freeze), %d failed; frozen primary: %d decided, %d failed, %d of them after the whole budget",
		healthy.ok.Load(), healthyBefore, healthy.failed.Load(), frozen.ok.Load(), frozen.failed.Load(), frozen.slowFailed.Load())
	if n, f := healthy.ok.Load(), healthy.failed.Load(); f > n/100 {
		t.Errorf("%d of %d decisions on healthy primaries failed while another was frozen, want at most 1%%", f, n+f)
	}
	if frozen.failed.Load() == 0 {
		t.Fatal("no decision on the frozen primary failed: the test froze nothing")
	}
	// The primary's breaker opens after a few timeouts: most failures are
	// immediate, not a whole budget each.
	if slow := frozen.slowFailed.Load(); slow > 20 {
		t.Errorf("%d decisions on the frozen primary waited the whole budget, want the breaker to answer the rest at once", slow)
	}

	// Every commit whose caller gave up is given back once the primary
	// answers again (late grace 2 s, then the refund).
	direct := c.Node(victim).Client(t)
	var stored int64
	within := time.Now().Add(10 * time.Second)
	for {
		n, err := fwCount(direct, frozenKey)
		if err != nil && !errors.Is(err, redis.Nil) {
			t.Fatal(err)
		}
		stored = int64(n)
		if stored == frozen.ok.Load() || time.Now().After(within) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	late := rs.Late()
	refunds := rs.Refunds()
	t.Logf("frozen key holds %d units for %d admitted; late replies %+v, refunds %+v", stored, frozen.ok.Load(), late, refunds)
	if stored != frozen.ok.Load() {
		t.Errorf("the frozen primary's key holds %d units, the store admitted %d: commits whose caller gave up leaked", stored, frozen.ok.Load())
	}
	if late.Refunded == 0 {
		t.Error("no late reply was refunded: the freeze caught no decision in flight")
	}
}
