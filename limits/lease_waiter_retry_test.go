package limits_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// TestLeaseWaiterRetryFromItsAnswer: 18ed4a9 counts a denied
// take's retry from the reply (at) and says a local denial is "never
// short; long by at most the reply's trip". A decision that waited for
// that take (its clock read before it waited) is then denied locally with
// RetryUS = at + retry - its own stale now: long by the reply's trip plus
// its wait. Real Redis behind a proxy holding replies 300 ms: the taker's
// Retry-After ends ~300 ms after the window, the waiters' 450-550 ms
// (now counted from each answer).
func TestLeaseWaiterRetryFromItsAnswer(t *testing.T) {
	px, rs := proxiedRedisStore(t, 5*time.Second)
	ctx := context.Background()
	const period = 10 * time.Second
	p := limits.PeriodUS(period)
	if left := p - time.Now().UnixMicro()%p; left < 4_000_000 {
		time.Sleep(time.Duration(left+10_000) * time.Microsecond)
	}
	r := leasedRule("global", limits.FixedWindow, 20, period)
	l := limits.New(limits.Options{Store: rs, Prefix: fmt.Sprintf("lw%d", time.Now().UnixNano()%1_000_000), Rules: []*limits.Rule{r}, Leaser: rs,
		Lease: limits.LeaseOptions{SyncPrefetch: true}})
	l.NoDenyCache()
	var d limits.Decision
	for i := 0; i < 40; i++ {
		_ = l.Decide(ctx, &limits.Request{Cost: 1}, &d)
	}
	time.Sleep(300 * time.Millisecond) // exUntil (Recheck 250 ms) passes
	px.DelayReplies(300 * time.Millisecond)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var worst int64
	for g := 0; g < 4; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			time.Sleep(time.Duration(g) * 50 * time.Millisecond)
			var d limits.Decision
			start := time.Now().UnixMicro()
			if err := l.Decide(ctx, &limits.Request{Cost: 1}, &d); err != nil {
				t.Error(err)
				return
			}
			at := time.Now().UnixMicro()
			end := (at/p + 1) * p
			mu.Lock()
			t.Logf("g%d waited %.0f ms, admitted %v: Retry-After ends %.0f ms after the window", g, float64(at-start)/1000, d.Admitted, float64(at+d.Verdicts[0].Result.RetryUS-end)/1000)
			worst = max(worst, at+d.Verdicts[0].Result.RetryUS-end)
			mu.Unlock()
		}()
	}
	wg.Wait()
	if worst > 400_000 {
		t.Errorf("a local denial's Retry-After ends %.0f ms after the window with a reply trip of 300 ms (said: long by at most the reply's trip)", float64(worst)/1000)
	}
}
