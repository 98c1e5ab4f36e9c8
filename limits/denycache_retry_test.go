package limits_test

import (
	"context"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/storetest"
)

// TestDenyCacheRetryIsTheLatestDenial: a request two rules deny may retry
// when both have room again. The store's answer names the rule whose quota
// returns last (Denier); a cached answer must not name an earlier one. A
// client that waits for the cached Retry-After, and nothing else touches
// its keys, must then be admitted.
func TestDenyCacheRetryIsTheLatestDenial(t *testing.T) {
	short := dcFixed(1, 10*time.Second)
	short.Name = "short"
	long := dcFixed(2, time.Minute)
	long.Name = "long"
	l, _ := dcLimiter(t, 100, short, long)
	start := storetest.WindowStart(time.Minute)
	dcWant(t, "first", dcAsk(t, l, "u", 1, start+1), true, false)
	dcWant(t, "second, next short window", dcAsk(t, l, "u", 1, start+10_000_000), true, false)
	now := start + 11_000_000
	d := dcAsk(t, l, "u", 1, now)
	dcWant(t, "third (store)", d, false, false)
	if got := d.Verdicts[d.Denier].Rule.Name; got != "long" {
		t.Fatalf("store denier %q, want long", got)
	}
	storeRetry := d.Verdicts[d.Denier].Result.RetryUS

	now += 1_000_000
	d = dcAsk(t, l, "u", 1, now)
	dcWant(t, "fourth (cached)", d, false, true)
	v := d.Verdicts[d.Denier]
	retry := v.Result.RetryUS
	t.Logf("store said retry in %dµs (rule long); the cached answer 1s later says %dµs (rule %s)", storeRetry, retry, v.Rule.Name)
	// What the client is told: Retry-After, whole seconds rounded up.
	after := (retry + 999_999) / 1_000_000
	d = dcAsk(t, l, "u", 1, now+after*1_000_000)
	if !d.Admitted {
		t.Fatalf("a client that obeyed the cached Retry-After: %ds (rule %q) is refused at that time by rule %q (retry %dµs more)",
			after, v.Rule.Name, d.Verdicts[d.Denier].Rule.Name, d.Verdicts[d.Denier].Result.RetryUS)
	}
}

// TestDenyCacheRetryOfALargerCost: a denial cached for cost 1 also denies
// cost 5 (a larger cost never fits earlier), but on a bucket cost 5 fits
// later than cost 1: the cache must not tell it cost 1's retry time. The
// store answers it then; in a fixed window, where every cost that can fit
// fits when the window ends, the cache answers it with the same retry. A
// client that waits for the Retry-After it was given is then admitted.
func TestDenyCacheRetryOfALargerCost(t *testing.T) {
	tb := &limits.Rule{Name: "tb", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.TokenBucket,
		Limit: 1, Period: time.Second, Burst: 5, Cost: 1}
	fw := dcFixed(5, 10*time.Second)
	for _, c := range []struct {
		rule   *limits.Rule
		cached bool // cost 5 answered by the cache
	}{{tb, false}, {fw, true}} {
		t.Run(string(c.rule.Algorithm), func(t *testing.T) {
			l, _ := dcLimiter(t, 100, c.rule)
			now := storetest.WindowStart(time.Minute) + 1
			dcWant(t, "cost 5, the whole quota", dcAsk(t, l, "u", 5, now), true, false)
			dcWant(t, "cost 1 (store)", dcAsk(t, l, "u", 1, now+1), false, false)
			d := dcAsk(t, l, "u", 5, now+2)
			dcWant(t, "cost 5", d, false, c.cached)
			retry := d.Verdicts[d.Denier].Result.RetryUS
			after := (retry + 999_999) / 1_000_000
			t.Logf("cost 5 (cached %v): Retry-After %ds", d.Cached, after)
			d = dcAsk(t, l, "u", 5, now+2+after*1_000_000)
			if !d.Admitted {
				t.Fatalf("a cost-5 client that obeyed Retry-After: %ds is refused then (retry %dµs more)",
					after, d.Verdicts[d.Denier].Result.RetryUS)
			}
		})
	}
}

// slowStore is a memory store that answers d after it is asked, deciding
// at the end of the wait: a Redis a round trip away.
type slowStore struct {
	*memstore.Store
	d time.Duration
}

func (s slowStore) Decide(ctx context.Context, b *limits.Batch, res []limits.Result) (bool, error) {
	time.Sleep(s.d)
	return s.Store.Decide(ctx, b, res)
}

// TestDenyCacheRetryCountsFromTheAnswer: on the real clock, a store
// decides some time after it is asked (a round trip, a queue), and its
// retry counts from then. A cached answer's retry must not run out before
// the store's does: counted from when the store answered, not from when
// it was asked (it was 50 ms early here, enough to turn a Retry-After of
// 2 s into 1 s when the store's wait was just over a second).
func TestDenyCacheRetryCountsFromTheAnswer(t *testing.T) {
	m := memstore.New()
	t.Cleanup(func() { m.Close() })
	const delay = 50 * time.Millisecond
	l := limits.New(limits.Options{Store: slowStore{m, delay}, Prefix: "rg", Rules: []*limits.Rule{dcFixed(1, storetest.SteadyDuration())},
		DenyCache: limits.NewDenyCache(100)})
	var d limits.Decision
	ask := func() time.Time {
		t.Helper()
		start := time.Now()
		if err := l.Decide(context.Background(), &limits.Request{User: []byte("u")}, &d); err != nil {
			t.Fatal(err)
		}
		return start
	}
	ask()
	asked := ask()
	if d.Admitted || d.Cached {
		t.Fatalf("second request: admitted=%v cached=%v, want the store's denial", d.Admitted, d.Cached)
	}
	// the store decided no sooner than delay after it was asked
	due := asked.Add(delay + time.Duration(d.Verdicts[0].Result.RetryUS)*time.Microsecond)
	at := ask()
	if !d.Cached {
		t.Fatal("third request not answered by the cache")
	}
	told := at.Add(time.Duration(d.Verdicts[0].Result.RetryUS) * time.Microsecond)
	if early := due.Sub(told); early > time.Millisecond {
		t.Fatalf("the cached retry runs out %v before the store's", early)
	}
}

// TestDenyCacheRetryOfALargerCostOnTwoRules: a request of cost 2 whose
// two rules both hold a denial cached for cost 1, one a fixed_window (its
// entry answers a larger cost) and one a token_bucket (its entry does not:
// cost 2 fits later than cost 1 there). The cached answer must not name
// the fixed window alone, with its Retry-After, while the bucket, whose
// entry could not say when cost 2 fits, refuses the request longer: the
// store would name the bucket. A client that waits for the Retry-After it
// was given, with nothing else touching its keys, must then be admitted.
func TestDenyCacheRetryOfALargerCostOnTwoRules(t *testing.T) {
	fw := dcFixed(5, 10*time.Second)
	fw.Name = "fw"
	tb := &limits.Rule{Name: "tb", Key: []limits.KeyPart{{Kind: limits.KeyUser}}, Algorithm: limits.TokenBucket,
		Limit: 1, Period: 30 * time.Second, Burst: 5, Cost: 1}
	l, _ := dcLimiter(t, 100, fw, tb)
	now := storetest.WindowStart(time.Minute) + 1
	dcWant(t, "cost 5, both quotas", dcAsk(t, l, "u", 5, now), true, false)
	d := dcAsk(t, l, "u", 1, now+1)
	dcWant(t, "cost 1 (store; both rules deny and are cached)", d, false, false)
	if got := d.Verdicts[d.Denier].Rule.Name; got != "tb" {
		t.Fatalf("store denier %q, want tb", got)
	}
	d = dcAsk(t, l, "u", 2, now+2)
	v := d.Verdicts[d.Denier]
	after := (v.Result.RetryUS + 999_999) / 1_000_000
	t.Logf("cost 2 (cached %v): denied by %q, Retry-After %ds", d.Cached, v.Rule.Name, after)
	d = dcAsk(t, l, "u", 2, now+2+after*1_000_000)
	if !d.Admitted {
		t.Fatalf("a cost-2 client that obeyed Retry-After: %ds (rule %q) is refused then by rule %q (retry %dµs more)",
			after, v.Rule.Name, d.Verdicts[d.Denier].Rule.Name, d.Verdicts[d.Denier].Result.RetryUS)
	}
}
