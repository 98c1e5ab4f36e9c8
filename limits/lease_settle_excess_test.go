package limits_test

import (
	"context"
	"testing"

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
	g := newSettleRig(t)
	ctx := context.Background()
	for i := 0; i < 8; i++ {
		g.decide(g.lc, 1)
	}
	g.show("warm")
	h := g.lc.LeaseEntry(g.key, g.r, g.now)
	var eps []uint64
	for h.Avail() > 0 {
		ep, ok := h.TrySpend(1, g.now)
		if !ok {
			t.Fatal("cannot spend what C holds")
		}
		eps = append(eps, ep)
	}
	k := len(eps)
	if !g.decide(g.lc, 1) {
		t.Fatal("C's next take denied")
	}
	g.lc.SweepLeasesAt(ctx, g.now) // the spent slice goes to settling
	g.show("B taken, A spent")
	// the k requests are denied by their other rule within the second
	for _, ep := range eps {
		h.GiveBack(1, ep, g.now)
	}
	g.show("after the give backs")
	g.now += 1_100_000
	// a request costing more than C holds: the store cannot grant its
	// need; the take settles A and the reserved units go back
	big := int64(settleLimit - 1)
	if g.decide(g.lc, big) {
		t.Fatalf("the request of cost %d was admitted", big)
	}
	g.show("after the denied take")
	before := g.admitted
	if _, _, err := g.la.ResetKey(ctx, g.r, &limits.Request{}); err != nil {
		t.Fatal(err)
	}
	g.show("after the reset")
	g.admitted = 0
	for i := 0; i < 3*settleLimit; i++ {
		g.decide(g.lc, 1)
		g.decide(g.la, 1)
	}
	t.Logf("%d units given back before the settle; %d admitted before the reset; after it, in the same hour: %d, limit %d", k, before, g.admitted, settleLimit)
	if g.admitted > settleLimit {
		t.Fatalf("after the admin reset the hour admitted %d at a limit of %d (%d units of a slice settled before the reset were given back within its second)", g.admitted, settleLimit, k)
	}
}
