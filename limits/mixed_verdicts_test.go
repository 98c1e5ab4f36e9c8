package limits_test

import (
	"context"
	"fmt"
	"math/rand"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
)

// mixedRules are rules of every kind matching one user in one request: a
// shadow rule's block (a verdict without a check), an exempt rule (neither),
// a leased rule, a shadow rule that comes to deny, an identity's own limit,
// and plain rules that deny (cached afterwards). Each call returns fresh
// rules with fresh identity tables.
func mixedRules(user string) []*limits.Rule {
	u := limits.KeyPart{Kind: limits.KeyUser}
	sl := func(name string, limit int64, period time.Duration) *limits.Rule {
		return &limits.Rule{Name: name, Key: []limits.KeyPart{u}, Algorithm: limits.SlidingLog, Limit: limit, Period: period, Burst: limit, Cost: 1}
	}
	watch := sl("watch", 100, time.Hour)
	watch.Shadow = true
	free := sl("free", 1, time.Hour)
	leased := leasedRule("leased", limits.FixedWindow, 6, 20*time.Second, u)
	shad := sl("shad", 2, 12*time.Second)
	shad.Shadow = true
	own := sl("own", 100, time.Hour)
	tight := sl("tight", 5, 10*time.Second)
	plain := sl("plain", 7, 15*time.Second)
	tables := map[*limits.Rule]*limits.IdentityTable{
		watch: limits.NewIdentityTable(map[string]limits.IdentityEntry{user: {Rule: watch.Derive(limits.IdentityBlock)}}, nil),
		free:  limits.NewIdentityTable(map[string]limits.IdentityEntry{user: {Rule: free.Derive(limits.IdentityExempt)}}, nil),
		own:   limits.NewIdentityTable(map[string]limits.IdentityEntry{user: {Rule: withNumbers(own, 40)}}, nil),
	}
	var out []*limits.Rule
	for _, r := range []*limits.Rule{watch, free, leased, shad, own, tight, plain} {
		if tb := tables[r]; tb != nil {
			r = r.WithIdentities(tb)
		}
		out = append(out, r)
	}
	return out
}

// TestMixedRequestVerdictsMatchRulesAlone: one request matching every kind
// of rule at once, on a timeline, decided by a limiter with a deny cache and
// leases, on the memory store and on a real Redis. Every verdict must name
// its own rule and key and carry the result that rule gives the same
// request decided alone (on a store that saw the same admitted requests):
// exactly for the rule that denies and for shadow rules (which only
// report, and whose report must not depend on the deny cache); for the
// other rules of a denied request, a denial only where the rule alone
// denies too. A leased rule's denial asks no other rule, shadow rules
// included (documented): they report their full quota then.
func TestMixedRequestVerdictsMatchRulesAlone(t *testing.T) {
	eachStore(t, func(t *testing.T, store limits.Store, leaser limits.Leaser) {
		ctx := context.Background()
		user := fmt.Sprintf("u-%d", time.Now().UnixNano())
		rules := mixedRules(user)
		l := limits.New(limits.Options{Store: store, Prefix: "rg", Rules: rules, Leaser: leaser, DenyCache: limits.NewDenyCache(1000)})
		defer l.ReturnLeases(ctx, 0)
		period := int64(time.Hour / time.Microsecond)
		base := (time.Now().UnixMicro()/period)*period + period/2 // mid hour: no fixed window of 20 s is cut by the hour
		rng := rand.New(rand.NewSource(1))
		req := func() *limits.Request { return &limits.Request{User: []byte(user)} }

		var history []int64 // the times of the admitted requests
		now := base
		for step := 0; step < 60; step++ {
			now += 200_000 + rng.Int63n(1_300_000)
			var d limits.Decision
			if err := l.DecideAt(ctx, req(), &d, now); err != nil {
				t.Fatalf("step %d: %v", step, err)
			}
			// The same request, one rule at a time.
			var want []limits.Verdict
			for i := range rules {
				alone := mixedRules(user)[i]
				m := memstore.New()
				la := limits.New(limits.Options{Store: m, Prefix: "rg", Rules: []*limits.Rule{alone}})
				for _, at := range history {
					var h limits.Decision
					if err := la.DecideAt(ctx, req(), &h, at); err != nil || !h.Admitted {
						t.Fatalf("step %d: replaying rule %s alone: %+v %v", step, alone.Name, h, err)
					}
				}
				var a limits.Decision
				if err := la.DecideAt(ctx, req(), &a, now); err != nil {
					t.Fatal(err)
				}
				want = append(want, a.Verdicts...)
				m.Close()
			}
			desc := fmt.Sprintf("step %d (t+%dms) admitted=%v cached=%v denier=%d", step, (now-base)/1000, d.Admitted, d.Cached, d.Denier)
			if len(d.Verdicts) != len(want) {
				t.Fatalf("%s: %d verdicts, want %d: %+v", desc, len(d.Verdicts), len(want), d.Verdicts)
			}
			for i := range want {
				g, w := &d.Verdicts[i], &want[i]
				if g.Rule.Name != w.Rule.Name || g.Rule.Identity != w.Rule.Identity || g.Key != w.Key || g.Cost != w.Cost {
					t.Fatalf("%s: verdict %d is rule %s/%v key %q cost %d, want rule %s/%v key %q cost %d",
						desc, i, g.Rule.Name, g.Rule.Identity, g.Key, g.Cost, w.Rule.Name, w.Rule.Identity, w.Key, w.Cost)
				}
				gr, wr := g.Result, w.Result
				switch {
				case g.Rule.Lease:
					// a lease reports its slice: only the verdict compares
					if gr.Allowed != wr.Allowed && !(!d.Admitted && i != d.Denier && gr.Allowed) {
						t.Errorf("%s: leased rule %s allowed=%v, alone %v", desc, g.Rule.Name, gr.Allowed, wr.Allowed)
					}
				case g.Rule.Shadow && g.Rule.Identity != limits.IdentityBlock && !d.Admitted && d.Verdicts[d.Denier].Rule.Lease:
					// A leased rule's denial asks no other rule, to save
					// the round trip its lease is for: a shadow rule
					// reports its full quota (docs/scaling.md).
					if !gr.Allowed {
						t.Errorf("%s: shadow rule %s reports %+v under a leased denial, want not asked", desc, g.Rule.Name, gr)
					}
				case g.Rule.Shadow:
					if gr.Allowed != wr.Allowed || (!gr.Allowed && gr.RetryUS != wr.RetryUS) {
						t.Errorf("%s: shadow rule %s reports %+v, alone %+v", desc, g.Rule.Name, gr, wr)
					}
				case d.Admitted:
					if gr != wr {
						t.Errorf("%s: rule %s %+v, alone %+v", desc, g.Rule.Name, gr, wr)
					}
				case i == d.Denier:
					if gr.Allowed || gr.RetryUS != wr.RetryUS || gr.Remaining != wr.Remaining {
						t.Errorf("%s: denier %s %+v, alone %+v", desc, g.Rule.Name, gr, wr)
					}
				default:
					if !gr.Allowed && (wr.Allowed || gr.RetryUS != wr.RetryUS) {
						t.Errorf("%s: rule %s denies %+v, alone %+v", desc, g.Rule.Name, gr, wr)
					}
				}
			}
			if d.Admitted {
				history = append(history, now)
			}
			t.Logf("%s", desc)
		}
	})
}
