package limits_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"
	"github.com/rategate/rategate/limits/storetest"
)

// TestLocalFallbackCostFitsRuleIsNotNeverFits: a rule of 10 per hour
// whose requests cost 3 (a valid rule: cost <= limit), decided by the local
// fallback with local_share 4 (Redis down, or one decision that timed
// out: docs/failure.md). The fallback divides the limit and burst by the
// share (10/4 = 2) and leaves the cost, so the local store answers that
// the request can *never* fit: RetryUS = NeverFits, which /auth turns into
// a 429 without Retry-After and the body "request cost 3 can never fit
// (burst 10)". Every request of the rule is refused that way for as long
// as the store fails, and an honest client is told not to retry at all,
// for a cost the rule admits (the moment Redis answers again, it is
// admitted). A denial of a cost the rule itself admits must carry a retry
// time, never NeverFits.
func TestLocalFallbackCostFitsRuleIsNotNeverFits(t *testing.T) {
	dead := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(testredis.FreePort(t)),
		ContextTimeoutEnabled: true, MaxRetries: -1, DialerRetries: 1, DialTimeout: 100 * time.Millisecond})
	rs, err := redisstore.New(dead, "dead")
	if err != nil {
		t.Fatal(err)
	}
	defer rs.Close()
	local := memstore.New()
	defer local.Close()
	for _, algo := range limits.Algorithms {
		t.Run(string(algo), func(t *testing.T) {
			rule := &limits.Rule{Name: "r", Key: []limits.KeyPart{{Kind: limits.KeyIP}}, Algorithm: algo,
				Limit: 10, Period: time.Hour, Burst: 10, Cost: 3}
			l := limits.New(limits.Options{Store: rs, Prefix: "lc-" + string(algo), Rules: []*limits.Rule{rule},
				Fallback: local, LocalShare: 4, FailureMode: limits.FailLocal})
			now := storetest.WindowStart(time.Hour) + 1
			var d limits.Decision
			if err := l.DecideAt(context.Background(), &limits.Request{IP: []byte("192.0.2.9")}, &d, now); err == nil || !d.Local {
				t.Fatalf("err %v, local %v: want the store error and a local decision", err, d.Local)
			}
			v := d.Verdicts[0]
			t.Logf("local decision of cost %d (rule limit %d, burst %d): admitted %v, %+v", v.Cost, rule.Limit, rule.Burst, d.Admitted, v.Result)
			if !d.Admitted && v.Result.RetryUS == limits.NeverFits {
				t.Fatalf("%s: a request of cost 3 under a rule of burst 10 is answered \"can never fit\" (no Retry-After) by the local fallback (local_share 4): %+v", algo, v.Result)
			}
		})
	}
}
