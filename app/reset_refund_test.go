package app

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rategate/rategate/admin"
	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
)

// prefixedInstance is one rategate instance (wired by New) over the Redis at
// addr, with the given rules and key prefix.
func prefixedInstance(t *testing.T, yaml, addr, prefix string, set func(*config.Config)) *dcInstance {
	t.Helper()
	a := redisApp(t, yaml, func(cfg *config.Config) {
		cfg.Redis.URL = "redis://" + addr + "/0"
		cfg.Redis.KeyPrefix = prefix
		if set != nil {
			set(cfg)
		}
	})
	l := a.Limiter()
	return &dcInstance{app: a, limiter: l, cache: l.DenyCache(), admin: serveOn(t, a.AdminHandler())}
}

// TestAdminResetThenLateRefund: an admin reset (DELETE
// /v1/keys/...) lands between a decision that Redis committed after its
// caller gave up (redis.timeout) and that decision's late refund. The reset
// already erased the abandoned commit; the refund then takes the same units
// out of the count that the requests admitted after the reset built, so the
// window after the reset admits more than the limit.
//
// Docs: failure.md "if Redis did commit it, the commit is given back (a
// refund) ... errs on the strict side"; lua/refund.lua "A refund only ever
// gives back what the request still holds ... a late or lost refund leaves
// the limiter stricter than exact, never looser". operations.md: the reset
// is the "unban" button, i.e. a fresh quota of the limit, not more.
func TestAdminResetThenLateRefund(t *testing.T) {
	for _, alg := range []string{"fixed_window", "gcra"} {
		t.Run(alg, func(t *testing.T) {
			const limit = 3
			burst := ""
			if alg == "gcra" {
				burst = "\n    burst: 3"
			}
			yaml := fmt.Sprintf(`rules:
  - name: per-ip
    key: [ip]
    algorithm: %s
    limit: %d
    period: 1h%s
`, alg, limit, burst)
			srv := testredis.Start(t)
			px := testredis.StartProxy(t, srv.Addr)
			prefix := uniquePrefix(t)
			// A may have a pipeline in flight per abandoned decision.
			a := prefixedInstance(t, yaml, px.Addr, prefix, func(cfg *config.Config) { cfg.Redis.Coalesce.Pipelines = 16 })
			b := prefixedInstance(t, yaml, srv.Addr, prefix, nil)
			const ip = "192.0.2.77"

			openConnections(t, a.limiter)

			// A's replies come 1.5 s late (room for a loaded machine); its
			// callers give up after 100 ms. Redis runs (and commits) the
			// decisions as soon as they are sent.
			px.DelayReplies(1500 * time.Millisecond)
			start := time.Now()
			var wg sync.WaitGroup
			for range limit {
				wg.Add(1)
				go func() {
					defer wg.Done()
					ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
					defer cancel()
					var d limits.Decision
					_ = a.limiter.Decide(ctx, &limits.Request{IP: []byte(ip)}, &d)
				}()
			}
			wg.Wait()
			// The commits are in Redis once B's look (which costs
			// nothing) finds no quota left. On a loaded machine under
			// -race one of A's decisions once reached Redis after B's
			// request: B was admitted, A's last decision denied (nothing
			// to refund), and the test stopped there.
			for {
				var k admin.KeyView
				if code, body := call(t, b.admin, "GET", "/v1/keys/per-ip?ip="+ip, ""); code != 200 || json.Unmarshal([]byte(body), &k) != nil {
					t.Fatalf("B's look: %d %s", code, body)
				} else if k.Remaining == 0 {
					break
				}
				if time.Since(start) > 500*time.Millisecond {
					t.Fatalf("A's %d abandoned decisions did not all reach Redis within 500 ms", limit)
				}
				time.Sleep(5 * time.Millisecond)
			}
			if d := b.decide(t, ip); d.Admitted {
				t.Fatalf("B before the reset: admitted, want denied (A's %d abandoned decisions committed)", limit)
			}

			// The operator unbans the identity through B.
			if code, body := call(t, b.admin, "DELETE", "/v1/keys/per-ip?ip="+ip, ""); code != 200 {
				t.Fatalf("reset: %d %s", code, body)
			}
			admitted := 0
			for range limit + 1 {
				if d := b.decide(t, ip); d.Admitted {
					admitted++
				}
			}
			if time.Since(start) > 1300*time.Millisecond {
				t.Fatalf("the reset and %d decisions took %v, near the 1.5 s reply delay: the late refunds may have landed before the reset, and the test proves nothing", limit+1, time.Since(start))
			}
			if admitted != limit {
				t.Fatalf("right after the reset B admitted %d, want the fresh %d", admitted, limit)
			}
			// Now A's late replies arrive and A refunds its abandoned
			// commits. Keep asking B for 3 s.
			px.DelayReplies(0)
			deadline := time.Now().Add(3 * time.Second)
			extra := 0
			for time.Now().Before(deadline) && extra < 10 {
				if d := b.decide(t, ip); d.Admitted {
					extra++
				}
				time.Sleep(20 * time.Millisecond)
			}
			if extra > 0 {
				_, m := call(t, a.admin, "GET", "/metrics", "")
				t.Fatalf("%s limit %d per hour: after the admin reset the identity was admitted %d times in the same window (%d, then %d more once A's late refunds of commits the reset had already erased ran), want at most %d; instance A: %s",
					alg, limit, admitted+extra, admitted, extra, limit, grepLines(m, "rategate_redis_abandoned_decisions_total"))
			}
		})
	}
}
