package limits_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// TestLeaseFarRates: leased instances at 1,000 a second (burst 1,000) and
// at 1 a day (burst 1) on one key, a client alternating every ms, 50 units
// a request on the fast side, 1 on the slow one. The loosest numbers of
// both allow 1,000 + 1,000 a second: 2,000 units in 1 s. The slow side's
// conversion held the 1,000 days the backlog means at 2^45 µs (407 days)
// and wrote it, which the fast side read back as 407 units: 3,600 in 1 s
// (the third review). Such a backlog is read at the bound and left
// unwritten now.
func TestLeaseFarRates(t *testing.T) {
	ctx := context.Background()
	for _, s := range []lmStore{memoryLMStore(t), redisLMStore(t)} {
		for _, algo := range []limits.Algorithm{limits.TokenBucket, limits.GCRA} {
			t.Run(s.name+"/"+string(algo), func(t *testing.T) {
				fast := leasedRule("global", algo, 1000, time.Second)
				slow := leasedRule("global", algo, 1, 24*time.Hour)
				slow.Burst = 1
				prefix := fmt.Sprintf("pfr%d", time.Now().UnixNano()%1_000_000)
				mk := func(id string, r *limits.Rule) *limits.Limiter {
					return limits.New(limits.Options{Store: s.store, Prefix: prefix, Rules: []*limits.Rule{r}, Leaser: s.leaser,
						Lease: limits.LeaseOptions{SyncPrefetch: true, Instance: id}})
				}
				a, b := mk("a", fast), mk("b", slow)
				now := time.Now().UnixMicro()
				units := int64(0)
				var d limits.Decision
				for i := int64(0); i < 1000; i++ {
					l, cost := a, int64(50)
					if i%2 == 1 {
						l, cost = b, 1
					}
					if err := l.DecideAt(ctx, &limits.Request{Cost: cost}, &d, now+i*1000); err != nil {
						t.Fatal(err)
					}
					if d.Admitted {
						units += cost
					}
				}
				t.Logf("%d units admitted", units)
				if units > 2001 {
					t.Fatalf("%d units admitted in 1 s between 1000/s burst 1000 and 1/day burst 1, want at most 2001 (the larger burst at the faster rate, and one)", units)
				}
			})
		}
	}
}
