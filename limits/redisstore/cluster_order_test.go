package redisstore

import (
	"context"
	"fmt"
	"testing"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"
)

// TestClusterBurstAfterAGlobalDenialAdmitsTheLimit: docs/scaling.md claims
// that deciding the most restrictive slot first admits exactly the limit
// in a burst (TestClusterBurstAdmitsTheLimit: 100 users with a limit of 1
// each, a global limit of 100, every user asking three times at once).
// A slot with a key this store saw denied goes first. With a flat 2 s
// note, once the global rule denied one request (its window was full) it
// went first for every request for 2 s, also once it had room again (a new
// window; here an admin reset): a user's second and third asks took a
// global unit, were denied by their own slot and held that unit until the
// refund, while other users' first asks found the global rule full (98,
// 72, 69 of 100 admitted, the review's test). A key is noted now until
// its denial's retry time (at least 20 ms), and a reset forgets it.
func TestClusterBurstAfterAGlobalDenialAdmitsTheLimit(t *testing.T) {
	c := sharedCluster.Get(t)
	if err := c.FlushAll(); err != nil {
		t.Fatal(err)
	}
	rs := openClusterStore(t, c)
	ctx := context.Background()
	for _, algo := range []limits.Algorithm{limits.FixedWindow, limits.GCRA, limits.SlidingWindow} {
		t.Run(string(algo), func(t *testing.T) {
			tag := fmt.Sprintf("rburst-%s", algo)
			global := limits.Check{Key: "rg:{" + tag + ":}:" + algo.Suffix(), Algorithm: algo,
				Limit: 100, PeriodUS: limits.PeriodUS(storetest.ConcurrencyPeriod), Burst: 100, Cost: 1}
			user := func(name string) limits.Check {
				return limits.Check{Key: fmt.Sprintf("rg:{%s:%s}:%s", tag, name, algo.Suffix()), Algorithm: algo,
					Limit: 1, PeriodUS: limits.PeriodUS(storetest.ConcurrencyPeriod), Burst: 1, Cost: 1}
			}
			// the global window fills; the 101st request is denied by it
			for i := 0; i <= 100; i++ {
				res := make([]limits.Result, 2)
				a, err := rs.Decide(ctx, &limits.Batch{Checks: []limits.Check{global, user(fmt.Sprintf("early%d", i))}}, res)
				if err != nil {
					t.Fatal(err)
				}
				if a != (i < 100) {
					t.Fatalf("early request %d: admitted %v", i, a)
				}
			}
			// a new window (the operator's reset does the same at once)
			if err := rs.Reset(ctx, global); err != nil {
				t.Fatal(err)
			}
			before := rs.Refunds()
			const users, each = 100, 3
			admitted := hammer(t, rs, users*each, func(i int) []limits.Check {
				return []limits.Check{global, user(fmt.Sprintf("u%d", i%users))}
			})
			after := rs.Refunds()
			t.Logf("%d users x %d requests right after the global rule denied once: %d admitted, want %d; %d refunds",
				users, each, admitted, users, after.Refunded-before.Refunded)
			if admitted != users {
				t.Errorf("admitted %d, want exactly %d (each user's one, all within the global limit): the global slot, denied 2 s ago, went first", admitted, users)
			}
		})
	}
}

// TestClusterOverLimitIdentityNeedsNoRefund: while the global rule is
// noted as denying, its slot goes first; a request of an identity already
// at its own limit was then admitted by the global slot, denied by the
// per-user one, and paid a refund (a third script and a PUBLISH to the
// fleet) after holding a global unit for a round trip (50 refunds for 50
// denials, the review's test). Its own key is noted too now, and among
// noted slots the smaller limit goes first: 2 scripts, no refund. Rules in
// the batch as the repository's burst test orders them (global, then
// per-user), one identity at its limit asking 50 times; and per-user
// first, 50 identities at their limit asking once each.
func TestClusterOverLimitIdentityNeedsNoRefund(t *testing.T) {
	c := sharedCluster.Get(t)
	if err := c.FlushAll(); err != nil {
		t.Fatal(err)
	}
	rs := openClusterStore(t, c)
	ctx := context.Background()
	algo := limits.SlidingWindow
	for _, userFirst := range []bool{false, true} {
		t.Run(fmt.Sprintf("userFirst=%v", userFirst), func(t *testing.T) {
			tag := fmt.Sprintf("rover-%v", userFirst)
			global := limits.Check{Key: "rg:{" + tag + ":}:" + algo.Suffix(), Algorithm: algo,
				Limit: 100, PeriodUS: limits.PeriodUS(storetest.ConcurrencyPeriod), Burst: 100, Cost: 1}
			user := func(name string) limits.Check {
				return limits.Check{Key: fmt.Sprintf("rg:{%s:%s}:%s", tag, name, algo.Suffix()), Algorithm: algo,
					Limit: 1, PeriodUS: limits.PeriodUS(storetest.ConcurrencyPeriod), Burst: 1, Cost: 1}
			}
			batch := func(u limits.Check) []limits.Check {
				if userFirst {
					return []limits.Check{u, global}
				}
				return []limits.Check{global, u}
			}
			decide := func(u limits.Check) bool {
				res := make([]limits.Result, 2)
				a, err := rs.Decide(ctx, &limits.Batch{Checks: batch(u)}, res)
				if err != nil {
					t.Fatal(err)
				}
				return a
			}
			// 50 identities use their one request
			for i := 0; i < 50; i++ {
				if !decide(user(fmt.Sprintf("att%d", i))) {
					t.Fatal("an identity's first request denied")
				}
			}
			// the global window fills; one request is denied by it
			for i := 0; i < 51; i++ {
				decide(user(fmt.Sprintf("fill%d", i)))
			}
			if err := rs.Reset(ctx, global); err != nil { // a new window
				t.Fatal(err)
			}
			before := rs.Refunds()
			denied := 0
			for i := 0; i < 50; i++ {
				name := "att0"
				if userFirst {
					name = fmt.Sprintf("att%d", i)
				}
				if !decide(user(name)) {
					denied++
				}
			}
			refunds := rs.Refunds().Refunded - before.Refunded
			t.Logf("%d requests over their identity's limit denied; %d refunds", denied, refunds)
			if refunds > 0 {
				t.Errorf("%d of %d denials of identities at their own limit paid a refund (and its announcement): the global slot, denied lately, went first", refunds, denied)
			}
		})
	}
}
