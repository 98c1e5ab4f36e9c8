package limits_test

import (
	"github.com/redis/go-redis/v9"

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
	g := newSettleRig(t)
	ctx := context.Background()
	// warm C's rate so that its slices grow
	for i := 0; i < 4; i++ {
		g.decide(g.lc, 1)
	}
	g.show("warm")
	h := g.lc.LeaseEntry(g.key, g.r, g.now)
	// the requests in flight: every unit C holds now, spent, their other
	// rule still to decide
	var eps []uint64
	for h.Avail() > 0 {
		ep, ok := h.TrySpend(1, g.now)
		if !ok {
			t.Fatal("cannot spend what C holds")
		}
		eps = append(eps, ep)
	}
	k := len(eps)
	// C goes on: a new slice, the spent one dropped (sweep) and settled
	// with the next take (a prefetch): stop as soon as its field is gone
	inFlight := g.client.HKeys(ctx, limits.LeaseKey(g.key)).Val()
	settled := func() bool {
		for _, f := range g.client.HKeys(ctx, limits.LeaseKey(g.key)).Val() {
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
	for i := 0; i < settleLimit && !settled(); i++ {
		g.now += 100_000
		g.decide(g.lc, 1)
		g.lc.SweepLeasesAt(ctx, g.now)
		g.show("C goes on")
	}
	if !settled() {
		t.Fatal("the spent slices were never settled")
	}
	before := g.admitted
	// the operator's unban through A
	if _, _, err := g.la.ResetKey(ctx, g.r, &limits.Request{}); err != nil {
		t.Fatal(err)
	}
	g.show("after the reset")
	// the k requests are denied by their other rule: their units come back
	for _, ep := range eps {
		h.GiveBack(1, ep, g.now)
	}
	g.show("after the give backs")
	g.admitted = 0
	for i := 0; i < 3*settleLimit; i++ {
		g.decide(g.lc, 1)
		g.decide(g.la, 1)
	}
	t.Logf("%d units in flight across the reset; %d admitted before it; after it, in the same hour: %d, limit %d", k, before, g.admitted, settleLimit)
	if g.admitted > settleLimit {
		t.Fatalf("after the admin reset the hour admitted %d at a limit of %d (%d units given back from a slice settled before the reset)", g.admitted, settleLimit, k)
	}
}

// settleRig is two leased instances, C and A, on one real Redis, deciding
// a global fixed_window rule of settleLimit an hour on a driven clock from
// just after an hour's start: the setting of the lease settle tests.
type settleRig struct {
	t        *testing.T
	client   *redis.Client
	r        *limits.Rule
	lc, la   *limits.Limiter
	key      string
	now      int64
	admitted int
}

const settleLimit = 100

func newSettleRig(t *testing.T) *settleRig {
	client, rs := realRedisStore(t)
	prefix := fmt.Sprintf("rs%d", time.Now().UnixNano()%1_000_000)
	g := &settleRig{t: t, client: client, r: leasedRule("global", limits.FixedWindow, settleLimit, time.Hour),
		key: prefix + ":{global:}:" + limits.FixedWindow.Suffix(),
		now: (time.Now().UnixMicro()/3_600_000_000+1)*3_600_000_000 + 1_000_000}
	mk := func(inst string) *limits.Limiter {
		l := limits.New(limits.Options{Store: rs, Prefix: prefix, Rules: []*limits.Rule{g.r}, Leaser: rs,
			Lease: limits.LeaseOptions{SyncPrefetch: true, Instance: inst}})
		l.NoDenyCache()
		return l
	}
	g.lc, g.la = mk("c"), mk("a")
	return g
}

// decide has l decide one request of cost, 1 ms after the last, counting
// the units admitted.
func (g *settleRig) decide(l *limits.Limiter, cost int64) bool {
	g.t.Helper()
	g.now += 1000
	var d limits.Decision
	if err := l.DecideAt(context.Background(), &limits.Request{Cost: cost}, &d, g.now); err != nil {
		g.t.Fatal(err)
	}
	if d.Admitted {
		g.admitted += int(cost)
	}
	return d.Admitted
}

// show logs what C holds and what Redis has.
func (g *settleRig) show(what string) {
	g.t.Helper()
	ctx := context.Background()
	w, avail := g.lc.LeaseSlices(g.key, g.r, g.now)
	cnt, _ := g.client.Get(ctx, g.key).Result()
	g.t.Logf("%s: C holds %d slices, avail %d; record %v; count %q", what, len(w), avail,
		g.client.HGetAll(ctx, limits.LeaseKey(g.key)).Val(), cnt)
}
