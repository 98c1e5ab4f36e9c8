package limits_test

import (
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/storetest"
)

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
