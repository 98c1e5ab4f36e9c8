package limits_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// TestLeaseLocalDenialRetryForLargerCost: a leased token_bucket (1 a
// second, burst 10) on a real Redis is spent; a request of cost 1 is
// denied (the store says: retry in 1 s). A request of cost 5 right after
// it is denied by the instance itself (the store had nothing to lease),
// and gets the cost-1 request's retry time: Retry-After 1 s, where the
// store's word for cost 5 is 5 s (what the same rule without lease
// answers, and what the deny cache takes care to ask the store for:
// docs/scaling.md "Retry-After is still Redis's word for that rule").
// A client that waited what it was told was denied again, four times over.
// Now a larger need asks the store, except in a fixed window (every cost
// that can fit fits when the window ends), where the local answer is the
// store's word too.
func TestLeaseLocalDenialRetryForLargerCost(t *testing.T) {
	s := redisLMStore(t)
	ctx := context.Background()
	for _, algo := range []limits.Algorithm{limits.TokenBucket, limits.GCRA, limits.SlidingWindow, limits.FixedWindow} {
		t.Run(string(algo), func(t *testing.T) {
			retryFor := func(lease bool) (int64, int64) {
				r := leasedRule("global", algo, 10, 10*time.Second)
				r.Lease = lease
				prefix := fmt.Sprintf("pbr%d-%v", time.Now().UnixNano()%1_000_000, lease)
				l := limits.New(limits.Options{Store: s.store, Prefix: prefix, Rules: []*limits.Rule{r}, Leaser: s.leaser,
					Lease: limits.LeaseOptions{SyncPrefetch: true}})
				l.NoDenyCache()
				now := (time.Now().UnixMicro()/10_000_000+1)*10_000_000 + 1000
				var d limits.Decision
				for i := 0; i < 10; i++ {
					now += 100
					if err := l.DecideAt(ctx, &limits.Request{Cost: 1}, &d, now); err != nil || !d.Admitted {
						t.Fatalf("lease %v: request %d: %v %+v", lease, i, err, d.Verdicts)
					}
				}
				now += 100
				if err := l.DecideAt(ctx, &limits.Request{Cost: 1}, &d, now); err != nil || d.Admitted {
					t.Fatalf("lease %v: cost 1 after the burst: %v admitted %v", lease, err, d.Admitted)
				}
				r1 := d.Verdicts[0].Result.RetryUS
				now += 100
				if err := l.DecideAt(ctx, &limits.Request{Cost: 5}, &d, now); err != nil || d.Admitted {
					t.Fatalf("lease %v: cost 5: %v admitted %v", lease, err, d.Admitted)
				}
				return r1, d.Verdicts[0].Result.RetryUS
			}
			u1, u5 := retryFor(false)
			l1, l5 := retryFor(true)
			t.Logf("%s: not leased: retry cost 1 %d µs, cost 5 %d µs; leased: cost 1 %d µs, cost 5 %d µs", algo, u1, u5, l1, l5)
			if l5 < u5-1000 || l5 > u5+1000 {
				t.Errorf("%s leased: a request of cost 5 is told to retry in %.3f s; the store's word (the unleased rule) is %.3f s",
					algo, float64(l5)/1e6, float64(u5)/1e6)
			}
		})
	}
}
