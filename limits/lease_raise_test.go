package limits_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// TestLeaseRaiseWhileSlicesOut: a leased bucket rule's burst is raised
// from 10 to 100 (a reload, or `PUT /v1/rules/global/override
// {"burst":100}`; the rate stays 10 per 1000 s) on every instance at once
// while instance A holds a slice taken under the old numbers. SetRules ends
// A's slice and queues its return, which runs at A's next sweep under the
// old numbers, after instance B spent the bucket under the new ones. The
// return converted the record back to the old numbers, where the part used
// (about 100) did not fit a burst of 10 and was clamped; the next take
// converted it forward as if only 10 had been used, and the fleet admitted
// 190 against a burst of 100 ("a change never hands an identity a fresh
// quota", docs/algorithms.md). A return now gives its units back in the
// numbers the record is written under. Refill over the test is under one
// unit.
func TestLeaseRaiseWhileSlicesOut(t *testing.T) {
	ctx := context.Background()
	for _, s := range []lmStore{memoryLMStore(t), redisLMStore(t)} {
		for _, sc := range []struct {
			name           string
			algo           limits.Algorithm
			limit, raiseTo int64
		}{
			{"token_bucket/burst", limits.TokenBucket, 10, 10},
			{"gcra/burst", limits.GCRA, 10, 10},
		} {
			algo := sc.algo
			t.Run(s.name+"/"+sc.name, func(t *testing.T) {
				old := leasedRule("global", algo, sc.limit, 1000*time.Second)
				old.Burst = 10
				raised := *old
				raised.Limit, raised.Burst = sc.raiseTo, 100
				prefix := fmt.Sprintf("pbu%d", time.Now().UnixNano()%1_000_000)
				mk := func(id string) *limits.Limiter {
					return limits.New(limits.Options{Store: s.store, Prefix: prefix, Rules: []*limits.Rule{old}, Leaser: s.leaser,
						Lease: limits.LeaseOptions{SyncPrefetch: true, Instance: id}})
				}
				a, b := mk("a"), mk("b")
				keys := map[string]bool{}
				now := time.Now().UnixMicro()
				admitted := int64(0)
				var d limits.Decision
				decide := func(l *limits.Limiter) bool {
					now += 10
					if err := l.DecideAt(ctx, &limits.Request{Cost: 1}, &d, now); err != nil {
						t.Fatal(err)
					}
					keys[d.Verdicts[0].Key] = true
					if d.Admitted {
						admitted++
					}
					return d.Admitted
				}
				// A spends a few under the old numbers and holds a slice
				for i := 0; i < 3; i++ {
					decide(a)
				}
				_, held := a.LeasesHeld()
				t.Logf("before the raise: %d admitted, A holds %d", admitted, held)
				if held == 0 {
					t.Fatal("setup: A holds nothing")
				}
				if s.settle != nil {
					s.settle(t, keys)
				}
				// the raise, on every instance at once
				a.SetRules([]*limits.Rule{&raised})
				b.SetRules([]*limits.Rule{&raised})
				// B spends under the new numbers until denied
				for i := 0; i < 300 && decide(b); i++ {
				}
				first := admitted
				// A's sweep runs its queued return, under the old numbers
				a.SweepLeasesAt(ctx, now)
				if s.settle != nil {
					s.settle(t, keys)
				}
				// past B's recheck time (refill meanwhile: 0.03 units at most)
				for k := 0; k < 3; k++ {
					now += limits.PeriodUS(limits.DefaultLeaseRecheck) + 1000
					for i := 0; i < 300 && decide(b); i++ {
					}
				}
				t.Logf("admitted %d before A's return ran, %d in all", first, admitted)
				// refill over the test: well under one unit
				if admitted > raised.Burst+1 {
					t.Fatalf("%s: %d admitted in all (refill under 1 unit), want at most the new burst %d", algo, admitted, raised.Burst)
				}
			})
		}
	}
}

// TestLeaseMixedBursts: a fleet mid-reload, leased. Instance A decides a
// global bucket rule with one set of numbers, instance B with another (not
// reloaded yet), a client alternating between them every 60 ms for 2 s.
// The fleet admits no more than the larger burst at the faster rate (and
// one more for the sweep's slack): for the same rate, the looser rule
// alone.
func TestLeaseMixedBursts(t *testing.T) {
	ctx := context.Background()
	for _, s := range []lmStore{memoryLMStore(t), redisLMStore(t)} {
		for _, algo := range []limits.Algorithm{limits.TokenBucket, limits.GCRA} {
			for _, tc := range []struct {
				name string
				a, b [2]int64 // limit per second, burst
			}{
				{"bursts", [2]int64{1, 10}, [2]int64{1, 1}},
				{"rates", [2]int64{1, 10}, [2]int64{3, 4}},
			} {
				t.Run(s.name+"/"+string(algo)+"/"+tc.name, func(t *testing.T) {
					rule := func(n [2]int64) *limits.Rule {
						r := leasedRule("global", algo, n[0], time.Second)
						r.Burst = n[1]
						return r
					}
					prefix := fmt.Sprintf("pmb%d", time.Now().UnixNano()%1_000_000)
					mk := func(id string, r *limits.Rule) *limits.Limiter {
						return limits.New(limits.Options{Store: s.store, Prefix: prefix, Rules: []*limits.Rule{r}, Leaser: s.leaser,
							Lease: limits.LeaseOptions{SyncPrefetch: true, Instance: id}})
					}
					a, b := mk("a", rule(tc.a)), mk("b", rule(tc.b))
					now := time.Now().UnixMicro()
					admitted, sent := 0, 0
					var d limits.Decision
					for at := int64(0); at <= 2_000_000; at += 60_000 {
						l := a
						if sent%2 == 1 {
							l = b
						}
						sent++
						if err := l.DecideAt(ctx, &limits.Request{Cost: 1}, &d, now+at); err != nil {
							t.Fatal(err)
						}
						if d.Admitted {
							admitted++
						}
					}
					bound := int(max(tc.a[1], tc.b[1])+2*max(tc.a[0], tc.b[0])) + 1
					t.Logf("%d of %d admitted", admitted, sent)
					if admitted > bound {
						t.Fatalf("%d of %d admitted in 2 s between %v and %v, want at most %d (the larger burst at the faster rate, and one)", admitted, sent, tc.a, tc.b, bound)
					}
				})
			}
		}
	}
}
