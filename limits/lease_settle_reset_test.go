package limits_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// TestLeaseSettledSliceGivesNothingBackAfterReset: a window slice spent
// to the last unit is settled with the next take (its field leaves the
// lease record). An admin reset of a leased key rebuilds the count from
// the slices in the record (lease.lua "reset": the live slices' units).
// Units spent from a settled slice by requests still in flight (another
// rule of theirs not decided yet) were given back after the reset into
// the holder's avail, beyond what the rebuilt count holds for it: 103
// admitted in the window at a limit of 100 (the review's test). A window's
// slice is now settled a second after it was spent, and what its holder
// may spend is held to what the slices still in the record grant.
//
// fixed_window, 100 an hour, leased. Instance C spends its first slice;
// the last k units of it by requests another rule will deny (in flight);
// its next slices are taken, the spent one settled with a (prefetch)
// take; the operator resets the key through instance A; the k requests
// are denied by their other rule and give their units back at C. Then
// every instance spends what it can in the same hour.
func TestLeaseSettledSliceGivesNothingBackAfterReset(t *testing.T) {
	client, rs := realRedisStore(t)
	prefix := fmt.Sprintf("rv%d", time.Now().UnixNano()%1_000_000)
	const limit = 100
	r := leasedRule("global", limits.FixedWindow, limit, time.Hour)
	mk := func(inst string) *limits.Limiter {
		l := limits.New(limits.Options{Store: rs, Prefix: prefix, Rules: []*limits.Rule{r}, Leaser: rs,
			Lease: limits.LeaseOptions{SyncPrefetch: true, Instance: inst}})
		l.NoDenyCache()
		return l
	}
	lc, la := mk("c"), mk("a")
	ctx := context.Background()
	key := prefix + ":{global:}:" + limits.FixedWindow.Suffix()
	lkey := limits.LeaseKey(key)
	now := (time.Now().UnixMicro()/3_600_000_000+1)*3_600_000_000 + 1_000_000
	admitted := 0
	decide := func(l *limits.Limiter) bool {
		t.Helper()
		now += 1000
		var d limits.Decision
		if err := l.DecideAt(ctx, &limits.Request{}, &d, now); err != nil {
			t.Fatal(err)
		}
		if d.Admitted {
			admitted++
		}
		return d.Admitted
	}
	show := func(what string) {
		t.Helper()
		w, avail := lc.LeaseSlices(key, r, now)
		cnt, _ := client.Get(ctx, key).Result()
		t.Logf("%s: C holds %d slices, avail %d; record fields %v; count %q", what, len(w), avail,
			client.HKeys(ctx, lkey).Val(), cnt)
	}
	// warm C's rate so that its slices grow
	for i := 0; i < 4; i++ {
		decide(lc)
	}
	show("warm")
	h := lc.LeaseEntry(key, r, now)
	// the requests in flight: every unit C holds now, spent, their other
	// rule still to decide
	var eps []uint64
	for h.Avail() > 0 {
		ep, ok := h.TrySpend(1, now)
		if !ok {
			t.Fatal("cannot spend what C holds")
		}
		eps = append(eps, ep)
	}
	k := len(eps)
	// C goes on: a new slice, the spent one dropped (sweep) and settled
	// with the next take (a prefetch): stop as soon as its field is gone
	inFlight := client.HKeys(ctx, lkey).Val()
	settled := func() bool {
		for _, f := range client.HKeys(ctx, lkey).Val() {
			for _, g := range inFlight {
				if f == g {
					return false
				}
			}
		}
		return true
	}
	// (a window's spent slice is settled a second after it was spent:
	// C's clock moves 100 ms a request here)
	for i := 0; i < limit && !settled(); i++ {
		now += 100_000
		decide(lc)
		lc.SweepLeasesAt(ctx, now)
		show("C goes on")
	}
	if !settled() {
		t.Fatal("the spent slices were never settled")
	}
	before := admitted
	// the operator's unban through A
	if _, _, err := la.ResetKey(ctx, r, &limits.Request{}); err != nil {
		t.Fatal(err)
	}
	show("after the reset")
	// the k requests are denied by their other rule: their units come back
	for _, ep := range eps {
		h.GiveBack(1, ep, now)
	}
	show("after the give backs")
	admitted = 0
	for i := 0; i < 3*limit; i++ {
		decide(lc)
		decide(la)
	}
	t.Logf("%d units in flight across the reset; %d admitted before it; after it, in the same hour: %d, limit %d", k, before, admitted, limit)
	if admitted > limit {
		t.Fatalf("after the admin reset the hour admitted %d at a limit of %d (%d units given back from a slice settled before the reset)", admitted, limit, k)
	}
}
