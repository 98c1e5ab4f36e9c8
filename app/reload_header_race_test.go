package app

import (
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/internal/testredis"
)

// TestReloadDuplicateHeaderCheckedUnderTheRulesThatDecide: /auth refuses
// a request that sends twice a header the rules read (the application may
// take another copy than the one counted). The list of those headers and
// the rules were two atomic loads: a request could pass the check under
// the old rules' list (no X-Plan) and be decided by the new rules, keyed
// on X-Plan, during a reload. Every request must be checked and decided
// under one rule set.
func TestReloadDuplicateHeaderCheckedUnderTheRulesThatDecide(t *testing.T) {
	redisURL := "redis://" + testredis.Start(t).Addr + "/0"
	head := fmt.Sprintf("redis: {url: %q, key_prefix: %q}\n", redisURL, uniquePrefix(t))
	withPlan := head + `rules:
  - name: plan
    key: ["header:X-Plan"]
    algorithm: fixed_window
    limit: 1000000000
    period: 1h
`
	without := head + "rules: []\n"
	a, write := fileApp(t, without, zerolog.Nop())
	h := a.Handler()

	var stop atomic.Bool
	var wg sync.WaitGroup
	var slipped, total, refused atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ctx fasthttp.RequestCtx
			for !stop.Load() {
				ctx.Request.Reset()
				ctx.Response.Reset()
				ctx.Request.SetRequestURI("/auth")
				ctx.Request.Header.Set("X-Original-URI", "/x")
				ctx.Request.Header.Set("X-Real-IP", "192.0.2.1")
				ctx.Request.Header.Add("X-Plan", "free")
				ctx.Request.Header.Add("X-Plan", "enterprise")
				h(&ctx)
				total.Add(1)
				switch {
				case ctx.Response.StatusCode() == 400:
					refused.Add(1)
				case strings.Contains(ctx.Response.Header.String(), `"plan"`):
					slipped.Add(1) // decided (and counted) by the X-Plan rule
				}
			}
		}()
	}
	deadline := time.Now().Add(8 * time.Second)
	reloads := 0
	for time.Now().Before(deadline) && slipped.Load() == 0 && reloads < 4000 {
		for _, y := range []string{withPlan, without} {
			write(y)
			if _, err := a.Reload("test"); err != nil {
				t.Fatal(err)
			}
			reloads++
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d reloads, %d requests sending X-Plan twice: %d refused (400), %d decided by the rule keyed on X-Plan",
		reloads, total.Load(), refused.Load(), slipped.Load())
	if slipped.Load() > 0 {
		t.Errorf("%d requests sending X-Plan twice were decided by the rule keyed on X-Plan instead of refused", slipped.Load())
	}
}
