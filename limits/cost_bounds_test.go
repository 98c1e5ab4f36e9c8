package limits_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/redisstore"
)

// TestCostBoundsNeverFail: a client sets the cost (cost header, up to
// max_cost 1e6): no cost at a boundary (the limit, the burst, one more, the
// largest the header allows) makes any algorithm's script fail, leased or
// not, alone or with other rules, at the extremes of the numbers the
// config allows. A failure would be answered by failure_mode (allow: a
// bypass).
func TestCostBoundsNeverFail(t *testing.T) {
	srv := testredis.Start(t)
	rs, err := redisstore.New(srv.Client(t), "redis "+srv.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rs.Close() })
	user := []limits.KeyPart{{Kind: limits.KeyUser}}
	var rules []*limits.Rule
	shapes := []struct {
		limit, burst int64
		period       time.Duration
	}{{1, 1, time.Millisecond}, {3, 7, time.Second}, {10000, 10000, 400 * 24 * time.Hour}, {1_000_000_000, 1_000_000_000, time.Millisecond}, {1_000_000_000, 1, 400 * 24 * time.Hour}}
	for i, sh := range shapes {
		for _, a := range limits.Algorithms {
			if a == limits.SlidingLog && sh.limit > 10000 {
				continue
			}
			if !a.UsesBurst() && sh.burst != sh.limit {
				continue
			}
			for _, lease := range []bool{false, true} {
				if lease && a == limits.SlidingLog {
					continue
				}
				rules = append(rules, &limits.Rule{Name: fmt.Sprintf("%s-%d-%t", a, i, lease), Key: user, Algorithm: a,
					Limit: sh.limit, Period: sh.period, Burst: sh.burst, Cost: 1, Lease: lease})
			}
		}
	}
	ctx := context.Background()
	prefix := fmt.Sprintf("pcb%d", time.Now().UnixNano()%1_000_000)
	costs := []int64{1, 2, 3, 7, 8, 9999, 10000, 10001, 999_999, 1_000_000}
	decided := 0
	defer func() { t.Logf("%d rules, %d decisions", len(rules), decided) }()
	for _, r := range rules {
		for _, together := range []bool{false, true} {
			rs2 := []*limits.Rule{r}
			if together {
				rs2 = rules
			}
			l := limits.New(limits.Options{Store: rs, Prefix: prefix, Rules: rs2, Leaser: rs, Lease: limits.LeaseOptions{SyncPrefetch: true}})
			for _, c := range costs {
				for rep := 0; rep < 2; rep++ {
					var d limits.Decision
					if err := l.Decide(ctx, &limits.Request{User: []byte(fmt.Sprint("u", c)), Cost: c}, &d); err != nil {
						t.Fatalf("rule %s (together %t), cost %d: %v", r.Name, together, c, err)
					}
					if d.Undecided || d.Local || d.Err != nil {
						t.Fatalf("rule %s (together %t), cost %d: not decided by Redis: undecided %t local %t err %v", r.Name, together, c, d.Undecided, d.Local, d.Err)
					}
					decided++
				}
			}
			if together {
				break
			}
		}
		if t.Failed() {
			return
		}
	}
}
