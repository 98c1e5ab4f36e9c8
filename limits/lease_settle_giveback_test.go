package limits_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// TestLeaseSettleKeepsGiveBacksInFlight: cd7b2ed settles a window's
// spent slice a second after it was spent and bumps the entry's epoch then
// (settleSpent), which ends the give back of every unit spent before the
// bump, not only of the settled slice's: a request that spent a unit of a
// live slice and is denied by its other rule just after loses it. A busy
// instance settles a slice about every take (some 20 a second), so the
// give backs in flight at each settle are lost: the leased global rule
// counts units no admitted request used (docs/algorithms.md says only a
// unit "given back later than" the second after its slice was spent is
// lost).
//
// Real Redis, real clocks, RunLeases sweeping: a leased fixed_window
// global rule (1,000,000 a minute) and a per-user rule (1 an hour, not
// leased); 4 goroutines of fresh users (admitted) and 4 of one user over
// its limit (each spends a global unit and gives it back) for 3 s. Then
// the instance returns its leases: the global count must be exactly the
// admitted requests (140-156 units over with the bump; none since a settle
// only clamps avail to what the slices left in the record hold).
func TestLeaseSettleKeepsGiveBacksInFlight(t *testing.T) {
	_, rs := realRedisStore(t)
	// the whole run in one minute's window: it takes about 4 s
	if left := 60_000_000 - time.Now().UnixMicro()%60_000_000; left < 10_000_000 {
		time.Sleep(time.Duration(left+10_000) * time.Microsecond)
	}
	prefix := fmt.Sprintf("rb%d", time.Now().UnixNano()%1_000_000)
	const limit = 1_000_000
	global := leasedRule("global", limits.FixedWindow, limit, time.Minute)
	perUser := &limits.Rule{Name: "per-user", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.FixedWindow,
		Limit: 1, Period: time.Hour, Burst: 1, Cost: 1}
	l := limits.New(limits.Options{Store: rs, Prefix: prefix, Rules: []*limits.Rule{global, perUser}, Leaser: rs})
	l.NoDenyCache()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go l.RunLeases(ctx)
	var admitted, abusive, seq atomic.Int64
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d limits.Decision
			for time.Now().Before(stop) {
				user := "abuser"
				if g%2 == 0 {
					user = fmt.Sprintf("u%d", seq.Add(1))
				} else {
					abusive.Add(1)
				}
				if err := l.Decide(context.Background(), &limits.Request{User: []byte(user)}, &d); err != nil {
					t.Error(err)
					return
				}
				if d.Admitted {
					admitted.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	cancel()
	time.Sleep(200 * time.Millisecond)
	l.ReturnLeases(context.Background(), 0)
	st := l.LeaseStats()
	// the count the global rule holds: ask once without a lease
	plain := *global
	plain.Lease = false
	lp := limits.New(limits.Options{Store: rs, Prefix: prefix, Rules: []*limits.Rule{&plain}})
	lp.NoDenyCache()
	var d limits.Decision
	if err := lp.Decide(context.Background(), &limits.Request{}, &d); err != nil || !d.Admitted {
		t.Fatalf("the probe: %v, admitted %v", err, d.Admitted)
	}
	counted := limit - 1 - d.Verdicts[0].Result.Remaining
	t.Logf("%d admitted, %d requests of the user over its limit; the global rule counts %d; lease stats %+v",
		admitted.Load(), abusive.Load(), counted, st)
	if lost := counted - admitted.Load(); lost != 0 {
		t.Errorf("the global rule counts %d units no admitted request used (%d admitted): give backs in flight ended by a settle's epoch bump", lost, admitted.Load())
	}
}
