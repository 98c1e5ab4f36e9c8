package limits_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// TestLeaseReturnsOfManyKeysAreNotDropped: docs/scaling.md promises that in
// normal operation nothing is lost for good: "a slice is spent, or given
// back when the key is idle for 0.5 s, when the rule's numbers change
// (reload, override), and at SIGTERM". An instance holds up to 10,000 keys
// (MaxKeys), but the returns wait for the sweeper in a queue of 4,096 and
// a full queue drops the return (leaseTable.queue): when more than 4,096
// keys holding units go idle in one sweep, or a rule change (a reload, an
// override, an adaptive factor change) ends them all at once, the units of
// the rest stay counted in Redis, unspent, until their window ends: those
// identities are refused before their limit for the rest of the window
// (an hour here). 4,500 users of a leased per-user rule each spend 2 and
// hold 3 more; then each case ends their slices, and Redis must count
// exactly the 2 × 4,500 admitted.
func TestLeaseReturnsOfManyKeysAreNotDropped(t *testing.T) {
	const users = 4500
	for _, tc := range []string{"idle", "rule change"} {
		t.Run(tc, func(t *testing.T) {
			client, rs := realRedisStore(t)
			ctx := context.Background()
			r := leasedRule("per-user", limits.FixedWindow, 80, time.Hour, limits.KeyPart{Kind: limits.KeyUser})
			prefix := fmt.Sprintf("mk%d", time.Now().UnixNano()%1_000_000)
			l := limits.New(limits.Options{Store: rs, Prefix: prefix, Rules: []*limits.Rule{r}, Leaser: rs,
				Lease: limits.LeaseOptions{SyncPrefetch: true, Instance: "a"}})
			// a driven clock 10 minutes into an hour window, on Redis's side
			now := (time.Now().UnixMicro()/3_600_000_000)*3_600_000_000 + 600_000_000
			admitted := 0
			var d limits.Decision
			for u := 0; u < users; u++ {
				for i := 0; i < 2; i++ {
					now++
					req := limits.Request{User: []byte(fmt.Sprintf("user-%d", u))}
					if err := l.DecideAt(ctx, &req, &d, now); err != nil {
						t.Fatal(err)
					}
					if d.Admitted {
						admitted++
					}
				}
			}
			keys, held := l.LeasesHeld()
			t.Logf("%d users admitted %d; the instance holds %d units over %d keys", users, admitted, held, keys)
			if admitted != 2*users || held == 0 {
				t.Fatalf("setup: %d admitted, %d held", admitted, held)
			}
			switch tc {
			case "idle":
				now += limits.PeriodUS(limits.DefaultLeaseIdle) + 1
			case "rule change":
				raised := *r
				raised.Limit, raised.Burst = 160, 160
				l.SetRules([]*limits.Rule{&raised})
			}
			l.SweepLeasesAt(ctx, now)
			l.SweepLeasesAt(ctx, now)
			// what Redis counts for the users, against what they were admitted
			var counted float64
			var n int
			iter := client.Scan(ctx, 0, prefix+":*", 1000).Iterator()
			for iter.Next(ctx) {
				k := iter.Val()
				v, err := client.Get(ctx, k).Bytes()
				if err != nil || len(v) != 16 {
					continue
				}
				counted += math.Float64frombits(binary.LittleEndian.Uint64(v[8:]))
				n++
			}
			st := l.LeaseStats()[0]
			t.Logf("after the %s: Redis counts %.0f units for %d users who were admitted %d; returned %d, wasted %d", tc, counted, n, admitted, st.Returned, st.Wasted)
			if int(counted) != admitted {
				t.Errorf("%s: Redis still counts %.0f units for %d admitted: %d unspent units lost for the rest of the hour (%d returned, %d wasted)",
					tc, counted, admitted, int(counted)-admitted, st.Returned, st.Wasted)
			}
		})
	}
}
