package limits_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/race"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"
	"github.com/rategate/rategate/limits/storetest"
)

// countingLeaser counts the store calls of leases, and can fail them.
type countingLeaser struct {
	limits.Leaser
	takes, returns atomic.Int64
	fail           atomic.Bool
	mu             sync.Mutex
	wants          []int64
}

var errLeaseDown = errors.New("lease store down (test)")

func (c *countingLeaser) TakeLease(ctx context.Context, t *limits.LeaseTake) (limits.LeaseGrant, error) {
	c.takes.Add(1)
	if c.fail.Load() {
		return limits.LeaseGrant{}, errLeaseDown
	}
	c.mu.Lock()
	c.wants = append(c.wants, t.Want)
	c.mu.Unlock()
	return c.Leaser.TakeLease(ctx, t)
}

func (c *countingLeaser) ReturnLease(ctx context.Context, r *limits.LeaseReturn) (int64, error) {
	c.returns.Add(1)
	if c.fail.Load() {
		return 0, errLeaseDown
	}
	return c.Leaser.ReturnLease(ctx, r)
}

// failingStore fails every decision (Redis down) while fail is set.
type failingStore struct {
	limits.Store
	fail atomic.Bool
}

func (f *failingStore) Decide(ctx context.Context, b *limits.Batch, res []limits.Result) (bool, error) {
	if f.fail.Load() {
		return false, errLeaseDown
	}
	return f.Store.Decide(ctx, b, res)
}

func leasedRule(name string, algo limits.Algorithm, limit int64, period time.Duration, key ...limits.KeyPart) *limits.Rule {
	return &limits.Rule{Name: name, Key: key, Algorithm: algo, Limit: limit, Period: period, Burst: limit, Cost: 1, Lease: true}
}

// leaseRig is one or more instances over one memory store, on a driven clock.
type leaseRig struct {
	t     *testing.T
	mem   *memstore.Store
	store *failingStore
	cl    *countingLeaser
	lims  []*limits.Limiter
	now   int64
}

func newLeaseRig(t *testing.T, instances int, opt limits.LeaseOptions, rules ...*limits.Rule) *leaseRig {
	mem := memstore.NewSweeping(time.Hour)
	t.Cleanup(func() { mem.Close() })
	g := &leaseRig{t: t, mem: mem, store: &failingStore{Store: mem}, cl: &countingLeaser{Leaser: mem},
		now: (time.Now().UnixMicro()/60_000_000 + 1) * 60_000_000}
	opt.SyncPrefetch = true
	for i := 0; i < instances; i++ {
		o := opt
		o.Instance = fmt.Sprintf("i%d", i)
		g.lims = append(g.lims, limits.New(limits.Options{Store: g.store, Prefix: "lt", Rules: rules, Leaser: g.cl, Lease: o,
			DenyCache: limits.NewDenyCache(64), Fallback: memstore.NewSweeping(time.Hour), LocalShare: instances, FailureMode: limits.FailAllow}))
	}
	return g
}

func (g *leaseRig) decide(i int, user string, cost int64) *limits.Decision {
	g.t.Helper()
	var d limits.Decision
	req := limits.Request{User: []byte(user), Cost: cost}
	_ = g.lims[i].DecideAt(context.Background(), &req, &d, g.now)
	return &d
}

// TestLeaseBusyInstanceAsksRarely: a busy instance spending on one global
// key at a steady rate takes a slice about every Horizon/2 and serves the
// rest from memory; every request within the limit is admitted.
func TestLeaseBusyInstanceAsksRarely(t *testing.T) {
	r := leasedRule("global", limits.FixedWindow, 1_000_000_000, time.Minute)
	g := newLeaseRig(t, 1, limits.LeaseOptions{}, r)
	const n = 20_000
	for i := 0; i < n; i++ {
		g.now += 100 // 10,000 requests/s
		if d := g.decide(0, "", 0); !d.Admitted {
			t.Fatalf("request %d denied: %+v", i, d.Verdicts)
		}
	}
	takes := g.cl.takes.Load()
	st := g.lims[0].LeaseStats()[0]
	t.Logf("%d decisions, %d takes (%.4f per decision), stats %+v, last wants %v", n, takes, float64(takes)/n, st, g.cl.wants[len(g.cl.wants)-3:])
	if float64(takes)/n > 0.01 {
		t.Fatalf("%d takes for %d decisions, want at most 1%%", takes, n)
	}
	if st.ServedLocal < n*98/100 {
		t.Fatalf("only %d of %d served from slices", st.ServedLocal, n)
	}
	// A slice is what this rate spends in a Horizon: 10,000/s × 50 ms.
	if w := g.cl.wants[len(g.cl.wants)-1]; w < 400 || w > 600 {
		t.Fatalf("slice asked for %d units, want about 500 (10,000/s × 50 ms)", w)
	}
}

// TestLeaseQuietInstanceHoldsNothing: requests a second apart take exactly
// what each needs: nothing is held between them.
func TestLeaseQuietInstanceHoldsNothing(t *testing.T) {
	r := leasedRule("global", limits.FixedWindow, 1000, time.Hour)
	g := newLeaseRig(t, 1, limits.LeaseOptions{}, r)
	for i := 0; i < 20; i++ {
		g.now += 1_000_000
		if d := g.decide(0, "", 0); !d.Admitted {
			t.Fatalf("request %d denied", i)
		}
		if _, units := g.lims[0].LeasesHeld(); units != 0 {
			t.Fatalf("request %d: %d units held by a quiet instance", i, units)
		}
	}
	for _, w := range g.cl.wants {
		if w != 1 {
			t.Fatalf("a quiet instance asked for %v", g.cl.wants)
		}
	}
}

// TestLeaseManyIdentitiesBounded (attacker): a flood of identities on a
// leased per-user rule makes the instance lease what each request needs
// and nothing more, and the entries stay within MaxKeys.
func TestLeaseManyIdentitiesBounded(t *testing.T) {
	r := leasedRule("per-user", limits.TokenBucket, 100, time.Second, limits.KeyPart{Kind: limits.KeyUser})
	g := newLeaseRig(t, 1, limits.LeaseOptions{MaxKeys: 64}, r)
	for i := 0; i < 5000; i++ {
		g.now += 10
		if d := g.decide(0, fmt.Sprintf("user-%d", i), 0); !d.Admitted {
			t.Fatalf("user %d denied", i)
		}
		if keys, units := g.lims[0].LeasesHeld(); keys > 64 || units != 0 {
			t.Fatalf("after %d identities: %d keys, %d units held", i+1, keys, units)
		}
	}
	st := g.lims[0].LeaseStats()[0]
	if st.Units != 5000 {
		t.Fatalf("leased %d units for 5000 one-request identities, want 5000", st.Units)
	}
}

// TestLeaseSliceGrowsOnlyWithSpending (attacker): requests another rule
// denies give their unit back, so they do not make the slice grow; what
// the instance takes follows what it admits.
func TestLeaseSliceGrowsOnlyWithSpending(t *testing.T) {
	global := leasedRule("global", limits.FixedWindow, 1_000_000_000, time.Hour)
	perUser := &limits.Rule{Name: "per-user", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.FixedWindow, Limit: 1, Period: time.Hour, Burst: 1, Cost: 1}
	g := newLeaseRig(t, 1, limits.LeaseOptions{}, global, perUser)
	g.lims[0].NoDenyCache() // every denial reaches the lease (no deny cache in front)
	admitted := 0
	for i := 0; i < 20_000; i++ {
		g.now += 100
		// One user hammering: denied by per-user after its first request.
		if g.decide(0, "attacker", 0).Admitted {
			admitted++
		}
	}
	st := g.lims[0].LeaseStats()[0]
	t.Logf("admitted %d; lease stats %+v; wants %v", admitted, st, g.cl.wants)
	if admitted != 1 {
		t.Fatalf("admitted %d, want 1", admitted)
	}
	// The one admission, spent 100 µs after the first take, sizes the
	// second (1 + up to 2×1+1); the 19,998 denied ones gave their unit
	// back and make nothing grow.
	var units int64
	for _, w := range g.cl.wants {
		units += w
	}
	if len(g.cl.wants) > 2 || units > 5 {
		t.Fatalf("denied requests made the instance lease more: asked for %v", g.cl.wants)
	}
	// The global count holds the one admission and what is held, nothing more.
	g.lims[0].ReturnLeases(context.Background(), g.now)
	res, _ := g.mem.PeekAt(global.Check("lt:{global:}:fw2", 0), g.now)
	if used := global.Limit - res.Remaining; used != 1 {
		t.Fatalf("the global count holds %d after the returns, want 1", used)
	}
}

// TestLeaseMultiRuleAllOrNothing: a request another rule denies consumes
// nothing of the leased rule; one the leased rule denies consumes nothing
// of the other (it is not even asked).
func TestLeaseMultiRuleAllOrNothing(t *testing.T) {
	global := leasedRule("global", limits.FixedWindow, 5, time.Hour)
	perUser := &limits.Rule{Name: "per-user", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.FixedWindow, Limit: 2, Period: time.Hour, Burst: 2, Cost: 1}
	g := newLeaseRig(t, 1, limits.LeaseOptions{}, global, perUser)
	ctx := context.Background()
	for i, want := range []bool{true, true, false, false} {
		g.now += 10
		if d := g.decide(0, "alice", 0); d.Admitted != want {
			t.Fatalf("alice %d: admitted %v, want %v", i, d.Admitted, want)
		}
	}
	for i, want := range []bool{true, true, true, false} {
		g.now += 10
		d := g.decide(0, fmt.Sprintf("u%d", i/2), 0)
		if d.Admitted != want {
			t.Fatalf("request %d: admitted %v, want %v: %+v", i, d.Admitted, want, d.Verdicts)
		}
		if !want {
			if d.Verdicts[d.Denier].Rule != global {
				t.Fatalf("denied by %q, want the leased rule", d.Verdicts[d.Denier].Rule.Name)
			}
			if !d.Verdicts[1].Result.Allowed || d.Verdicts[1].Result.Remaining != 2 {
				t.Fatalf("per-user was asked on a leased denial: %+v", d.Verdicts[1])
			}
			dc := g.lims[0].DenyCache()
			if dc.Holds("lt:{global:}:fw2", global, 1, g.now) {
				t.Fatal("a leased denial was cached")
			}
		}
	}
	// u1's denied request took nothing from its per-user quota.
	res, _ := g.mem.PeekAt(perUser.Check("lt:{per-user:u1}:fw2", 0), g.now)
	if res.Remaining != 1 {
		t.Fatalf("u1 has %d of per-user left, want 1", res.Remaining)
	}
	// 5 admitted of 5: nothing is held, nothing lost.
	g.lims[0].ReturnLeases(ctx, g.now)
	res, _ = g.mem.PeekAt(global.Check("lt:{global:}:fw2", 0), g.now)
	if res.Remaining != 0 {
		t.Fatalf("global has %d left after 5 admissions, want 0", res.Remaining)
	}
}

// TestLeaseFullUseAcrossInstances: three instances sharing a key admit
// exactly the limit between them, however the requests are spread.
func TestLeaseFullUseAcrossInstances(t *testing.T) {
	for _, algo := range leasable() {
		t.Run(string(algo), func(t *testing.T) {
			r := leasedRule("global", algo, 300, time.Hour)
			g := newLeaseRig(t, 3, limits.LeaseOptions{}, r)
			admitted := 0
			for i := 0; i < 3000; i++ {
				g.now += 3
				if g.decide(i%3, "", 0).Admitted {
					admitted++
				}
			}
			if admitted != 300 {
				t.Fatalf("admitted %d, want exactly the limit 300", admitted)
			}
		})
	}
}

// TestLeaseReturnedWhenIdle: an idle key's slices go back, and another
// instance can then spend them.
func TestLeaseReturnedWhenIdle(t *testing.T) {
	r := leasedRule("global", limits.FixedWindow, 1000, time.Hour)
	g := newLeaseRig(t, 2, limits.LeaseOptions{}, r)
	for i := 0; i < 600; i++ {
		g.now += 50
		if !g.decide(0, "", 0).Admitted {
			t.Fatalf("request %d denied", i)
		}
	}
	_, held := g.lims[0].LeasesHeld()
	if held == 0 {
		t.Fatal("a busy instance holds nothing")
	}
	// The other instance gets what is neither spent nor held...
	got := int64(0)
	for i := 0; i < 1000; i++ {
		g.now++
		if g.decide(1, "", 0).Admitted {
			got++
		}
	}
	if got != 400-held {
		t.Fatalf("instance 1 admitted %d, want 1000 - 600 spent - %d held", got, held)
	}
	// ...until instance 0, idle, gives its slices back.
	g.now += limits.PeriodUS(limits.DefaultLeaseIdle) + 1
	g.lims[0].SweepLeasesAt(context.Background(), g.now)
	if keys, units := g.lims[0].LeasesHeld(); keys != 0 || units != 0 {
		t.Fatalf("after idle: %d keys, %d units held", keys, units)
	}
	if st := g.lims[0].LeaseStats()[0]; st.Returned != held {
		t.Fatalf("returned %d units, held %d", st.Returned, held)
	}
	g.now += limits.PeriodUS(limits.DefaultLeaseRecheck)
	admitted := int64(0)
	for i := int64(0); i < held+5; i++ {
		g.now++
		if g.decide(1, "", 0).Admitted {
			admitted++
		}
	}
	if admitted != held {
		t.Fatalf("instance 1 admitted %d after the return of %d", admitted, held)
	}
}

// TestLeaseRuleChangeReturnsSlices: an override or reload that changes a
// leased rule's numbers gives back the slices taken under the old ones,
// and none of them is spent under the new ones.
func TestLeaseRuleChangeReturnsSlices(t *testing.T) {
	r := leasedRule("global", limits.TokenBucket, 100, time.Second)
	r.Burst = 100
	g := newLeaseRig(t, 1, limits.LeaseOptions{}, r)
	ctx := context.Background()
	for i := 0; i < 60; i++ {
		g.now += 100
		g.decide(0, "", 0)
	}
	if _, units := g.lims[0].LeasesHeld(); units == 0 {
		t.Fatal("nothing held")
	}
	r2 := *r
	r2.Limit = 50
	g.lims[0].SetRules([]*limits.Rule{&r2})
	if keys, units := g.lims[0].LeasesHeld(); keys != 0 || units != 0 {
		t.Fatalf("after the change %d keys, %d units held", keys, units)
	}
	g.lims[0].SweepLeasesAt(ctx, g.now)
	look, _ := g.mem.LookLease(ctx, r2.Check("lt:{global:}:tb2", 0), g.now)
	if len(look.Slices) != 0 {
		t.Fatalf("slices left in the store after the change: %+v", look)
	}
	if st := g.lims[0].LeaseStats()[0]; st.Returned == 0 {
		t.Fatalf("nothing returned: %+v", st)
	}
	// Only the numbers matter: the same rule again keeps its slices.
	g.decide(0, "", 0)
	g.now += 100
	g.decide(0, "", 0)
	keys, _ := g.lims[0].LeasesHeld()
	r3 := r2
	g.lims[0].SetRules([]*limits.Rule{&r3})
	if k, _ := g.lims[0].LeasesHeld(); k != keys || k == 0 {
		t.Fatalf("an unchanged rule lost its lease: %d keys before, %d after", keys, k)
	}
}

// TestLeaseStoreDownSpendsThenFailureMode: when the store fails, what the
// slices hold is still spent; then failure_mode answers.
func TestLeaseStoreDownSpendsThenFailureMode(t *testing.T) {
	r := leasedRule("global", limits.FixedWindow, 1000, time.Hour)
	g := newLeaseRig(t, 1, limits.LeaseOptions{}, r)
	for i := 0; i < 400; i++ {
		g.now += 100
		g.decide(0, "", 0)
	}
	_, held := g.lims[0].LeasesHeld()
	if held == 0 {
		t.Fatal("nothing held")
	}
	g.cl.fail.Store(true)
	g.store.fail.Store(true)
	for i := int64(0); i < held; i++ {
		g.now += 100
		if d := g.decide(0, "", 0); !d.Admitted || d.Local || d.Undecided {
			t.Fatalf("spend %d of %d held: %+v", i+1, held, d)
		}
	}
	g.now += 100
	d := g.decide(0, "", 0)
	if !d.Local || d.Fallback != limits.FallbackCallFailed {
		t.Fatalf("with the slices spent and the store down: %+v, want the local fallback", d)
	}
}

// spendLateInWindow runs 50 decisions of a leased 100/s fixed_window rule
// in the last millisecond of a window, then spends one unit of its slice
// directly: the rig, its limiter, the lease entry and the spend's epoch.
func spendLateInWindow(t *testing.T) (*leaseRig, *limits.Limiter, limits.LeaseEntry, uint64) {
	t.Helper()
	r := leasedRule("global", limits.FixedWindow, 100, time.Second)
	g := newLeaseRig(t, 1, limits.LeaseOptions{}, r)
	l := g.lims[0]
	g.now = (g.now/1_000_000)*1_000_000 + 999_000
	for i := 0; i < 50; i++ {
		g.now += 10
		g.decide(0, "", 0)
	}
	e := l.LeaseEntry("lt:{global:}:fw2", r, g.now)
	ep, ok := e.TrySpend(1, g.now)
	if !ok {
		t.Fatal("nothing to spend")
	}
	return g, l, e, ep
}

// TestLeaseGiveBackAfterSliceEnded: a unit spent from a slice that has
// ended since is not given back (it would resurrect an ended slice).
func TestLeaseGiveBackAfterSliceEnded(t *testing.T) {
	g, l, e, ep := spendLateInWindow(t)
	before := e.Avail()
	// The window ends; the sweep drops the slice.
	g.now = (g.now/1_000_000 + 1) * 1_000_000
	l.SweepLeaseTable(g.now)
	e.GiveBack(1, ep, g.now)
	if a := e.Avail(); a != 0 {
		t.Fatalf("avail %d after the give back of a unit of an ended slice (was %d)", a, before)
	}
	// A give back within the slice's life does go back.
	g.now += 10
	g.decide(0, "", 0)
	ep, ok := e.TrySpend(1, g.now)
	if !ok {
		t.Fatal("nothing to spend in the new window")
	}
	a := e.Avail()
	e.GiveBack(1, ep, g.now)
	if e.Avail() != a+1 {
		t.Fatal("a live slice's unit was not given back")
	}
}

// TestLeaseGiveBackIntoALaterSlice: a unit spent from one window's slice
// and given back once the next window's slice is taken (a decision that
// took long, another rule's store call) does not go into the new slice:
// that window's units were all counted by their own take, and the unit
// would be spent twice.
func TestLeaseGiveBackIntoALaterSlice(t *testing.T) {
	g, _, e, ep := spendLateInWindow(t)
	// the next window, and a decision in it that takes a new slice
	g.now = (g.now/1_000_000+1)*1_000_000 + 10
	admitted := 0
	if g.decide(0, "", 0).Admitted {
		admitted++
	}
	a := e.Avail()
	e.GiveBack(1, ep, g.now)
	if got := e.Avail(); got != a {
		t.Errorf("avail %d after giving back a unit of the last window's slice, was %d", got, a)
	}
	for i := 0; i < 200; i++ {
		g.now += 10
		if g.decide(0, "", 0).Admitted {
			admitted++
		}
	}
	if admitted > 100 {
		t.Errorf("%d admitted in one window of a limit of 100", admitted)
	}
}

// TestLeaseInspectAndReset: the admin view shows what this instance holds
// and what the store says is leased; a reset keeps what live slices hold
// counted, so they cannot be spent twice.
func TestLeaseInspectAndReset(t *testing.T) {
	r := leasedRule("global", limits.FixedWindow, 1000, time.Hour)
	g := newLeaseRig(t, 2, limits.LeaseOptions{}, r)
	ctx := context.Background()
	for i := 0; i < 300; i++ {
		g.now += 100
		g.decide(i%2, "", 0)
	}
	// Inspect reads the instance's monotonic clock: give it a slice it
	// can see alive.
	st, err := g.lims[0].Inspect(ctx, r, &limits.Request{})
	if err != nil || st.Lease == nil {
		t.Fatalf("inspect: %v %+v", err, st)
	}
	if st.Lease.Held.Instance != "i0" || st.Lease.Store == nil || len(st.Lease.Store.Slices) == 0 {
		t.Fatalf("lease view %+v", st.Lease)
	}
	_, held1 := g.lims[1].LeasesHeld()
	if _, _, err := g.lims[0].ResetKey(ctx, r, &limits.Request{}); err != nil {
		t.Fatal(err)
	}
	if keys, _ := g.lims[0].LeasesHeld(); keys != 0 {
		t.Fatal("the resetting instance kept its lease")
	}
	res, _ := g.mem.PeekAt(r.Check("lt:{global:}:fw2", 0), g.now)
	if used := r.Limit - res.Remaining; used < held1 {
		t.Fatalf("after the reset the count holds %d, instance 1 still holds %d", used, held1)
	}
}

// TestLeaseConcurrentExact: three instances, eight goroutines each, on real
// clocks (background takes, no driven clock), far over a leased global
// limit: together they admit exactly the limit, on the memory store and a
// real Redis, for every leasable algorithm.
func TestLeaseConcurrentExact(t *testing.T) {
	for _, sc := range []struct {
		name string
		open func(t *testing.T) lmStore
	}{{"memory", memoryLMStore}, {"redis", redisLMStore}, {"cluster", clusterLMStore}} {
		t.Run(sc.name, func(t *testing.T) {
			s := sc.open(t)
			for ai, algo := range leasable() {
				t.Run(string(algo), func(t *testing.T) {
					const limit = 3000
					r := leasedRule("global", algo, limit, storetest.ConcurrencyPeriod)
					prefix := fmt.Sprintf("lc%d-%d", time.Now().UnixNano()%1_000_000, ai)
					var lims []*limits.Limiter
					for i := 0; i < 3; i++ {
						lims = append(lims, limits.New(limits.Options{Store: s.store, Prefix: prefix, Rules: []*limits.Rule{r}, Leaser: s.leaser,
							Lease: limits.LeaseOptions{Instance: fmt.Sprintf("c%d", i)}}))
					}
					var admitted, denied, failed atomic.Int64
					var firstErr atomic.Pointer[error]
					var wg sync.WaitGroup
					deadline := time.Now().Add(20 * time.Second)
					for i := 0; i < 24; i++ {
						wg.Add(1)
						go func(l *limits.Limiter) {
							defer wg.Done()
							var d limits.Decision
							for n := 0; n < 400 && time.Now().Before(deadline); n++ {
								ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
								err := l.Decide(ctx, &limits.Request{}, &d)
								cancel()
								switch {
								case err != nil:
									failed.Add(1)
									firstErr.CompareAndSwap(nil, &err)
								case d.Admitted:
									admitted.Add(1)
								default:
									denied.Add(1)
								}
							}
						}(lims[i%3])
					}
					wg.Wait()
					var takes int64
					for _, l := range lims {
						takes += l.LeaseStats()[0].Takes
					}
					t.Logf("admitted %d, denied %d, failed %d, takes %d", admitted.Load(), denied.Load(), failed.Load(), takes)
					if failed.Load() != 0 {
						t.Fatalf("%d decisions failed, the first with %v", failed.Load(), *firstErr.Load())
					}
					// A bucket refills 3000/h (under 1 a second) meanwhile.
					slack := int64(0)
					if algo.UsesBurst() {
						slack = 25
					}
					if got := admitted.Load(); got < limit || got > limit+slack {
						t.Fatalf("admitted %d, want exactly the limit %d (buckets: plus what refilled)", got, limit)
					}
				})
			}
		})
	}
}

// TestLeaseAllocs: a decision served from a slice allocates nothing, alone
// and with a rule the store decides.
func TestLeaseAllocs(t *testing.T) {
	if race.Enabled {
		t.Skip("allocation counts are only meaningful without -race")
	}
	mem := memstore.NewSweeping(time.Hour)
	t.Cleanup(func() { mem.Close() })
	global := leasedRule("global", limits.FixedWindow, 1_000_000_000, time.Hour)
	perUser := &limits.Rule{Name: "per-user", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.FixedWindow, Limit: 100, Period: time.Minute, Burst: 100, Cost: 1}
	for _, rules := range [][]*limits.Rule{{global}, {global, perUser}} {
		l := limits.New(limits.Options{Store: limits.NopStore{}, Prefix: "rg", Rules: rules, Leaser: mem, Lease: limits.LeaseOptions{SyncPrefetch: true}})
		req := &limits.Request{User: []byte("alice")}
		var d limits.Decision
		ctx := context.Background()
		for i := 0; i < 20_000; i++ {
			if err := l.Decide(ctx, req, &d); err != nil || !d.Admitted {
				t.Fatalf("decide: %v %+v", err, d)
			}
		}
		if n := testing.AllocsPerRun(1000, func() { _ = l.Decide(ctx, req, &d) }); n != 0 {
			t.Fatalf("%d rules: %v allocations per leased decision, want 0", len(rules), n)
		}
	}
}

// clusterLMStore is the shared Redis Cluster: a lease record lives in the
// slot of its key, and a take is one script on that slot's primary.
func clusterLMStore(t *testing.T) lmStore {
	c := sharedCluster.Get(t)
	rs, err := redisstore.Open(redisstore.Options{ClusterAddrs: c.Addrs()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	return lmStore{name: "cluster", store: rs, leaser: rs}
}

// delayedLeaser runs the next take later on the store's clock than the
// instance asked (a slow network), once.
type delayedLeaser struct {
	limits.Leaser
	delay atomic.Int64
}

func (d *delayedLeaser) TakeLease(ctx context.Context, t *limits.LeaseTake) (limits.LeaseGrant, error) {
	if dl := d.delay.Swap(0); dl != 0 && t.NowUS != 0 {
		tt := *t
		tt.NowUS += dl
		return d.Leaser.TakeLease(ctx, &tt)
	}
	return d.Leaser.TakeLease(ctx, t)
}

// TestLeaseTakeInLaterWindow: a take sent just before its window ended but
// run by the store after it (the grant is the next window's) ends the
// earlier window's slices at once: nothing of two windows is spent
// together, and the earlier window's units are not spent in the next one.
func TestLeaseTakeInLaterWindow(t *testing.T) {
	mem := memstore.NewSweeping(time.Hour)
	t.Cleanup(func() { mem.Close() })
	dl := &delayedLeaser{Leaser: mem}
	r := leasedRule("global", limits.FixedWindow, 1000, time.Second)
	l := limits.New(limits.Options{Store: mem, Prefix: "lw", Rules: []*limits.Rule{r}, Leaser: dl, Lease: limits.LeaseOptions{SyncPrefetch: true}})
	ctx := context.Background()
	now := (time.Now().UnixMicro()/1_000_000 + 1) * 1_000_000
	var d limits.Decision
	decide := func(cost int64) {
		t.Helper()
		if err := l.DecideAt(ctx, &limits.Request{Cost: cost}, &d, now); err != nil {
			t.Fatal(err)
		}
	}
	for i := 0; i < 600; i++ {
		now += 1000
		decide(1)
	}
	_, held := l.LeasesHeld()
	if held == 0 {
		t.Fatal("nothing held")
	}
	// 1 ms before the window ends, a request needs more than is held; its
	// take runs 2 ms later on the store's clock: in the next window.
	now = (now/1_000_000+1)*1_000_000 - 1000
	dl.delay.Store(2000)
	decide(held + 1)
	if !d.Admitted {
		t.Fatalf("denied: %+v", d.Verdicts)
	}
	st := l.LeaseStats()[0]
	if st.Wasted < held {
		t.Fatalf("the earlier window's %d units are not all ended: stats %+v", held, st)
	}
	windows, avail := l.LeaseSlices("lw:{global:}:fw2", r, now)
	for _, w := range windows {
		if w != (now/1_000_000+1)*1_000_000+1_000_000 {
			t.Fatalf("a slice of another window is held: %v (now %d)", windows, now)
		}
	}
	// The next window's count holds the request and what is held, nothing
	// of the earlier one.
	res, _ := mem.PeekAt(r.Check("lw:{global:}:fw2", 0), now+2000)
	if used := r.Limit - res.Remaining; used != held+1+avail {
		t.Fatalf("the new window's count holds %d; the request took %d and %d are held", used, held+1, avail)
	}
}

// TestLeaseDroppedWhenStoreLosesData: when Redis lost its data (the epoch
// marker says so), what the slices held is no longer counted there: it is
// dropped, not spent, and not given back into the new counts.
func TestLeaseDroppedWhenStoreLosesData(t *testing.T) {
	r := leasedRule("global", limits.FixedWindow, 1000, time.Hour)
	g := newLeaseRig(t, 1, limits.LeaseOptions{}, r)
	for i := 0; i < 300; i++ {
		g.now += 100
		g.decide(0, "", 0)
	}
	_, held := g.lims[0].LeasesHeld()
	if held == 0 {
		t.Fatal("nothing held")
	}
	// The store loses everything (FLUSHALL), and another instance counts 5.
	g.mem.Reset(context.Background(), r.Check("lt:{global:}:fw2", 0))
	g.mem.Reset(context.Background(), r.Check(limits.LeaseKey("lt:{global:}:fw2"), 0))
	g.lims[0].DropLeases()
	if keys, units := g.lims[0].LeasesHeld(); keys != 0 || units != 0 {
		t.Fatalf("after the drop %d keys, %d units held", keys, units)
	}
	if st := g.lims[0].LeaseStats()[0]; st.Wasted != held || st.Returned != 0 {
		t.Fatalf("stats %+v, want %d wasted and nothing returned", st, held)
	}
	g.lims[0].SweepLeasesAt(context.Background(), g.now)
	if g.cl.returns.Load() != 0 {
		t.Fatal("dropped slices were given back into the new counts")
	}
}

// TestLeaseWithIdentityOverride: an identity override on a leased rule is
// leased under the identity's own numbers, exactly, on every store; when it
// ends the identity is back under the rule's numbers with what it used still
// counted (its slices under the override's numbers are not spent under the
// rule's).
func TestLeaseWithIdentityOverride(t *testing.T) {
	for _, algo := range []limits.Algorithm{limits.FixedWindow, limits.SlidingWindow, limits.GCRA, limits.TokenBucket} {
		t.Run(string(algo), func(t *testing.T) {
			eachStore(t, func(t *testing.T, store limits.Store, leaser limits.Leaser) {
				base := leasedRule("per-user", algo, 10, storetest.ConcurrencyPeriod, limits.KeyPart{Kind: limits.KeyUser})
				own := base.Derive(limits.IdentityLimit)
				own.Limit, own.Burst = 37, 37
				user := fmt.Sprintf("acme-%d", time.Now().UnixNano())
				tb := limits.NewIdentityTable(map[string]limits.IdentityEntry{user: {Rule: own}}, nil)
				l := limits.New(limits.Options{Store: store, Prefix: "lio", Rules: []*limits.Rule{base.WithIdentities(tb)}, Leaser: leaser})
				defer l.ReturnLeases(context.Background(), 0)
				burst := func(u string, n int) int64 {
					var admitted atomic.Int64
					var wg sync.WaitGroup
					for range n {
						wg.Add(1)
						go func() {
							defer wg.Done()
							var d limits.Decision
							if err := l.Decide(context.Background(), &limits.Request{User: []byte(u)}, &d); err != nil {
								t.Error(err)
							} else if d.Admitted {
								admitted.Add(1)
							}
						}()
					}
					wg.Wait()
					return admitted.Load()
				}
				if got := burst(user, 200); got != 37 {
					t.Fatalf("overridden identity: %d of 200 admitted, want its own 37", got)
				}
				if got := burst("someone-else", 50); got != 10 {
					t.Fatalf("another identity: %d of 50 admitted, want the rule's 10", got)
				}
				l.SetRules([]*limits.Rule{base})
				if got := burst(user, 50); got != 0 {
					t.Fatalf("after the override ended: %d admitted, want 0 (37 used of 10)", got)
				}
			})
		})
	}
}

// TestLeaseCostsLeaveNoUnitStranded: a leased fixed_window of 50 a minute,
// 100 concurrent requests of cost 7 on real clocks (7 fit: 49 units), then
// requests of cost 1: the 50th unit is admitted to one of them, and no
// more. Units a decision reserves from its slices while its take is out
// are still held: when the store has nothing more to lease they go back
// into the slices, even if a concurrent decision found them spent.
func TestLeaseCostsLeaveNoUnitStranded(t *testing.T) {
	for _, sc := range []struct {
		name string
		open func(t *testing.T) lmStore
	}{{"memory", memoryLMStore}, {"redis", redisLMStore}} {
		t.Run(sc.name, func(t *testing.T) {
			s := sc.open(t)
			r := leasedRule("global", limits.FixedWindow, 50, time.Minute)
			ctx := context.Background()
			for run := 0; run < 5; run++ {
				if into := time.Now().UnixMicro() % 60_000_000; into > 57_000_000 {
					// the run must not cross into the next window
					time.Sleep(time.Duration(60_000_000-into+1000) * time.Microsecond)
				}
				l := limits.New(limits.Options{Store: s.store, Prefix: fmt.Sprintf("ls%d-%d", time.Now().UnixNano()%1_000_000, run),
					Rules: []*limits.Rule{r}, Leaser: s.leaser})
				var units atomic.Int64
				start := make(chan struct{})
				var wg sync.WaitGroup
				for i := 0; i < 100; i++ {
					wg.Add(1)
					go func() {
						defer wg.Done()
						<-start
						var d limits.Decision
						if err := l.Decide(ctx, &limits.Request{Cost: 7}, &d); err != nil {
							t.Error(err)
						} else if d.Admitted {
							units.Add(7)
						}
					}()
				}
				close(start)
				wg.Wait()
				costly := units.Load()
				// then requests of cost 1, at once and once a denial's
				// recheck time has passed
				for i := 0; i < 10; i++ {
					if i == 5 {
						time.Sleep(limits.DefaultLeaseRecheck + 50*time.Millisecond)
					}
					var d limits.Decision
					if err := l.Decide(ctx, &limits.Request{Cost: 1}, &d); err != nil {
						t.Fatal(err)
					} else if d.Admitted {
						units.Add(1)
					}
				}
				if got := units.Load(); costly != 49 || got != 50 {
					_, held := l.LeasesHeld()
					t.Fatalf("run %d: cost 7 admitted %d units, then cost 1 brought it to %d; want 49 then exactly 50 (held %d, stats %+v)",
						run, costly, got, held, l.LeaseStats())
				}
				_ = l.ReturnLeases(ctx, 0)
			}
		})
	}
}

// gatedLeaser holds the next take, once armed, until release is closed.
type gatedLeaser struct {
	limits.Leaser
	armed            atomic.Bool
	entered, release chan struct{}
}

func (g *gatedLeaser) TakeLease(ctx context.Context, t *limits.LeaseTake) (limits.LeaseGrant, error) {
	if g.armed.Swap(false) {
		close(g.entered)
		<-g.release
	}
	return g.Leaser.TakeLease(ctx, t)
}

// TestLeaseReservedUnitSurvivesConcurrentDecision pins the interleaving
// behind TestLeaseCostsLeaveNoUnitStranded: a request of cost 7 finds 1
// unit held, reserves it and asks the store for 6 more; while that take is
// out, a request of cost 1 finds nothing to spend (the unit is reserved)
// and waits for the take. The store has nothing left: the reserved unit
// goes back into the slice, and the cost-1 request spends it.
func TestLeaseReservedUnitSurvivesConcurrentDecision(t *testing.T) {
	mem := memstore.NewSweeping(time.Hour)
	t.Cleanup(func() { mem.Close() })
	gl := &gatedLeaser{Leaser: mem, entered: make(chan struct{}), release: make(chan struct{})}
	r := leasedRule("global", limits.FixedWindow, 50, time.Minute)
	l := limits.New(limits.Options{Store: mem, Prefix: "lg", Rules: []*limits.Rule{r}, Leaser: gl, Lease: limits.LeaseOptions{SyncPrefetch: true}})
	ctx := context.Background()
	now := (time.Now().UnixMicro()/60_000_000+1)*60_000_000 + 1000
	decide := func(cost, at int64) bool {
		var d limits.Decision
		if err := l.DecideAt(ctx, &limits.Request{Cost: cost}, &d, at); err != nil {
			t.Error(err)
		}
		return d.Admitted
	}
	units := int64(0)
	for i := 0; i < 10; i++ {
		now += 1000
		if decide(7, now) {
			units += 7
		}
	}
	if _, held := l.LeasesHeld(); units != 49 || held != 1 {
		t.Fatalf("setup: %d units admitted, %d held; want 49 and 1", units, held)
	}
	// past the recheck time of the last denial: the next request of cost
	// 7 asks the store again
	now += limits.PeriodUS(limits.DefaultLeaseRecheck) + 1000
	gl.armed.Store(true)
	var wg sync.WaitGroup
	var costly, cheap bool
	wg.Add(2)
	go func() { defer wg.Done(); costly = decide(7, now) }()
	select {
	case <-gl.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("the request of cost 7 did not ask the store")
	}
	go func() { defer wg.Done(); cheap = decide(1, now) }()
	time.Sleep(50 * time.Millisecond) // the cost-1 request reaches the wait
	close(gl.release)
	wg.Wait()
	if costly || !cheap {
		t.Fatalf("cost 7 admitted %v, cost 1 admitted %v; want false, true (stats %+v)", costly, cheap, l.LeaseStats())
	}
	units++
	for i := 0; i < 5; i++ {
		now += 1000
		if decide(1, now) {
			units++
		}
	}
	if units != 50 {
		t.Fatalf("%d units admitted, want exactly the limit 50", units)
	}
	if st := l.LeaseStats()[0]; st.Wasted != 0 {
		t.Fatalf("%d units wasted (stats %+v)", st.Wasted, st)
	}
}

// TestLeaseGiveBackOfTheLastUnit: a request that spends the last unit of
// a leased window's slices and is then denied by another rule gives the
// unit back, even though the slices were spent to the last unit in between
// (the prefetch it set off found the store empty): the limit is admitted
// whole.
func TestLeaseGiveBackOfTheLastUnit(t *testing.T) {
	for _, algo := range []limits.Algorithm{limits.FixedWindow, limits.SlidingWindow} {
		t.Run(string(algo), func(t *testing.T) {
			global := leasedRule("global", algo, 50, time.Minute)
			perUser := &limits.Rule{Name: "per-user", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.FixedWindow, Limit: 1, Period: time.Minute, Burst: 1, Cost: 1}
			g := newLeaseRig(t, 1, limits.LeaseOptions{}, global, perUser)
			g.lims[0].NoDenyCache()
			admitted := 0
			for i := 0; i < 60; i++ {
				g.now += 1000
				if i > 0 && g.decide(0, "u0", 0).Admitted {
					t.Fatal("u0 admitted twice")
				}
				g.now += 1000
				if g.decide(0, fmt.Sprintf("u%d", i), 0).Admitted {
					admitted++
				}
			}
			if admitted != 50 {
				t.Fatalf("%d admitted, want exactly the limit 50 (stats %+v)", admitted, g.lims[0].LeaseStats())
			}
		})
	}
}
