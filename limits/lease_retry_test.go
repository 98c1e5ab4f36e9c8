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

// TestLeaseLocalDenialRetryNotShort: the store's retry counts from when
// Redis decided; a leased rule's local denials counted it from before the
// take was sent, so with 30 ms from rategate to Redis every Retry-After
// the instance gave itself ended 30 ms before the window did (a client
// that waited it out was denied again). A fixed window of 10 s on a real
// Redis behind a proxy that holds each request 30 ms: the local denial's
// retry reaches the window's end.
func TestLeaseLocalDenialRetryNotShort(t *testing.T) {
	px, rs := proxiedRedisStore(t, 0)
	ctx := context.Background()
	const period = 10 * time.Second
	p := limits.PeriodUS(period)
	// not within 2 s of a window's end: the test stays in one window
	if left := p - time.Now().UnixMicro()%p; left < 2_000_000 {
		time.Sleep(time.Duration(left+10_000) * time.Microsecond)
	}
	r := leasedRule("global", limits.FixedWindow, 20, period)
	l := limits.New(limits.Options{Store: rs, Prefix: fmt.Sprintf("lrs%d", time.Now().UnixNano()%1_000_000), Rules: []*limits.Rule{r}, Leaser: rs,
		Lease: limits.LeaseOptions{SyncPrefetch: true}})
	l.NoDenyCache()
	px.DelayRequests(30 * time.Millisecond)
	var d limits.Decision
	admitted := 0
	for i := 0; i < 40 && admitted < 20; i++ {
		if err := l.Decide(ctx, &limits.Request{Cost: 1}, &d); err != nil {
			t.Fatal(err)
		}
		if d.Admitted {
			admitted++
		}
	}
	if admitted != 20 {
		t.Fatalf("%d of the limit of 20 admitted", admitted)
	}
	// the store's denial, then the instance's own
	for i := 0; i < 3; i++ {
		if err := l.Decide(ctx, &limits.Request{Cost: 1}, &d); err != nil || d.Admitted {
			t.Fatalf("request %d past the limit: %v, admitted %v", i, err, d.Admitted)
		}
		at := time.Now().UnixMicro()
		end := (at/p + 1) * p
		if got := at + d.Verdicts[0].Result.RetryUS; got < end-1000 {
			t.Fatalf("denial %d: Retry-After ends %.1f ms before the window does", i, float64(end-got)/1000)
		}
	}
}
