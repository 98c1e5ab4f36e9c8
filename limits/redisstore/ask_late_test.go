package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"
)

// TestAskLateReplyIsRefunded: a decision whose caller gave up before Redis
// answered is still waited for (the late grace), and what a late reply
// committed is given back: the caller was answered without it (the local
// fallback), so it must not count (docs/failure.md). A decision that
// follows an ASK redirect (a slot being migrated, a normal part of
// resharding) was sent on the caller's own context: a reply after the
// caller's deadline was thrown away and its unit stayed consumed. And the
// refund itself, two keys in a slot being migrated, was refused with
// TRYAGAIN until the migration ended, and lost.
//
// Here a slot is mid-migration and the key lives on the target (ASK); the
// target stalls just as a decision is sent, whose caller times out after
// 100 ms; the target then runs it and commits; the migration ends. After
// the late grace the key holds the first decision's unit alone.
func TestAskLateReplyIsRefunded(t *testing.T) {
	c := testredis.StartCluster(t)
	rs := openClusterStore(t, c)
	ctx := testredis.Ctx(t)
	if err := rs.Warm(ctx); err != nil {
		t.Fatal(err)
	}
	fw := limits.Check{Key: "rg:{asklate:a}:fw", Algorithm: limits.FixedWindow, Limit: 10, PeriodUS: storetest.SteadyPeriod(), Burst: 10, Cost: 1}
	slot := KeySlot(fw.Key)
	decide := func(timeout time.Duration) (bool, limits.Result, error) {
		var res [1]limits.Result
		dctx, cancel := context.WithTimeout(ctx, timeout)
		defer cancel()
		a, err := rs.Decide(dctx, &limits.Batch{Checks: []limits.Check{fw}}, res[:])
		return a, res[0], err
	}
	m := migrateSlot(t, c, slot)
	nodes, dst, do := m.nodes, m.dst, m.do

	// A new key in a migrating slot: ASK to the target, which creates it.
	if a, r, err := decide(time.Second); err != nil || !a || r.Remaining != 9 {
		t.Fatalf("first decision (ASK): %v %+v %v", a, r, err)
	}

	// The target stalls; the next decision (ASK again: the source lacks
	// the key) is sent into the stall and its caller gives up.
	target := c.Node(dst.Addr)
	if err := target.Freeze(); err != nil {
		t.Fatal(err)
	}
	stalled := make(chan error, 1)
	go func() {
		time.Sleep(400 * time.Millisecond)
		stalled <- target.Thaw()
	}()
	start := time.Now()
	a, r, err := decide(100 * time.Millisecond)
	t.Logf("decision during the target's stall: admitted %v %+v err %v after %v", a, r, err, time.Since(start).Round(time.Millisecond))
	if err == nil {
		t.Fatal("the decision was answered within its deadline: the stall did not catch it")
	}
	if err := <-stalled; err != nil {
		t.Fatal(err)
	}
	// The migration ends: the slot is the target's (its one key is there).
	for _, n := range nodes {
		if n.Primary {
			do(n.Addr, "CLUSTER", "SETSLOT", slot, "NODE", dst.ID)
		}
	}
	// Past the late grace (2 s) and a background refund.
	time.Sleep(DefaultLateGrace + time.Second)
	if a, r, err := decide(time.Second); err != nil {
		t.Fatalf("look after the stall: %v %+v %v", a, r, err)
	} else {
		// This decision itself takes one unit: 10 - 1 (first) - 1 (this) = 8
		// when the late commit was given back, 7 when it was not.
		t.Logf("after the stall: remaining %d (8 if the late commit was refunded), late counts %+v, refunds %+v", r.Remaining, rs.Late(), rs.Refunds())
		if r.Remaining != 8 {
			// A failover of the stalled target (a machine too busy to let
			// it answer for twice the node timeout) loses its writes:
			// say whether one happened.
			owner, oerr := c.PrimaryForSlot(slot)
			t.Errorf("remaining %d after the late grace, want 8: the commit of a decision whose caller gave up (ASK path) was never given back"+
				" (or given back twice); the slot's primary is now %s (%v), the stalled target was %s", r.Remaining, owner, oerr, dst.Addr)
		}
	}
}
