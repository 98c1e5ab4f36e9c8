package limits_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// TestLeaseGiveBackNeverExceedsTheRecord: cd7b2ed keeps a
// window slice spent to the last unit (A) in the lease record for
// leaseSettleAfter (settling), so that an admin reset still counts it while
// units spent from it may come back. But a unit given back in that second
// goes into avail, where it stays after A is settled (the bump only ends
// later give backs): avail then exceeds what C's slices in the record
// hold. A take that settles A while avail is that high (a request costing
// more than avail, which the store denies: its reserved units go back)
// leaves the record without A and C's avail with A's units; an admin
// reset rebuilds the count from the record, and the hour admits more than
// the limit.
//
// fixed_window, 100 an hour, leased, real Redis. C spends every unit it
// holds (k requests in flight, their other rule still to decide); its next
// take brings slice B and the sweep moves the spent slices to settling; the
// k requests are denied by their other rule within the second: their
// units come back. 1.1 s later a request costing more than C holds (a
// cost header) is denied by the store; its take carries the settle. The
// operator resets the key through A. Then C and A spend what they can in
// the same hour (106 at a limit of 100 before avail was held to the
// slices the record still counts: heldLocked).
func TestLeaseGiveBackNeverExceedsTheRecord(t *testing.T) {
	client, rs := realRedisStore(t)
	prefix := fmt.Sprintf("rx%d", time.Now().UnixNano()%1_000_000)
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
	decide := func(l *limits.Limiter, cost int64) bool {
		t.Helper()
		now += 1000
		var d limits.Decision
		if err := l.DecideAt(ctx, &limits.Request{Cost: cost}, &d, now); err != nil {
			t.Fatal(err)
		}
		if d.Admitted {
			admitted += int(cost)
		}
		return d.Admitted
	}
	show := func(what string) {
		t.Helper()
		w, avail := lc.LeaseSlices(key, r, now)
		cnt, _ := client.Get(ctx, key).Result()
		t.Logf("%s: C holds %d slices, avail %d; record %v; count %q", what, len(w), avail,
			client.HGetAll(ctx, lkey).Val(), cnt)
	}
	for i := 0; i < 8; i++ {
		decide(lc, 1)
	}
	show("warm")
	h := lc.LeaseEntry(key, r, now)
	var eps []uint64
	for h.Avail() > 0 {
		ep, ok := h.TrySpend(1, now)
		if !ok {
			t.Fatal("cannot spend what C holds")
		}
		eps = append(eps, ep)
	}
	k := len(eps)
	if !decide(lc, 1) {
		t.Fatal("C's next take denied")
	}
	lc.SweepLeasesAt(ctx, now) // the spent slice goes to settling
	show("B taken, A spent")
	// the k requests are denied by their other rule within the second
	for _, ep := range eps {
		h.GiveBack(1, ep, now)
	}
	show("after the give backs")
	now += 1_100_000
	// a request costing more than C holds: the store cannot grant its
	// need; the take settles A and the reserved units go back
	big := int64(limit - 1)
	if decide(lc, big) {
		t.Fatalf("the request of cost %d was admitted", big)
	}
	show("after the denied take")
	before := admitted
	if _, _, err := la.ResetKey(ctx, r, &limits.Request{}); err != nil {
		t.Fatal(err)
	}
	show("after the reset")
	admitted = 0
	for i := 0; i < 3*limit; i++ {
		decide(lc, 1)
		decide(la, 1)
	}
	t.Logf("%d units given back before the settle; %d admitted before the reset; after it, in the same hour: %d, limit %d", k, before, admitted, limit)
	if admitted > limit {
		t.Fatalf("after the admin reset the hour admitted %d at a limit of %d (%d units of a slice settled before the reset were given back within its second)", admitted, limit, k)
	}
}
