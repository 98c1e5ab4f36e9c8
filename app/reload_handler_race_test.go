package app

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/internal/testredis"
)

// TestReloadDenyStatusAndRulesSwapTogether: a reload that changes the
// rules and deny_status together must answer every request under the old
// file or the new one. The rules are swapped (Manager.SetFile) before the
// decision handler carrying deny_status (and every identity.* setting),
// so for a moment a request is denied by the new file's rule with the
// old file's status: a 429 where neither file gives one (the old file
// has no rule, the new one denies with 403).
func TestReloadDenyStatusAndRulesSwapTogether(t *testing.T) {
	redisURL := "redis://" + testredis.Start(t).Addr + "/0"
	head := fmt.Sprintf("redis: {url: %q, key_prefix: %q}\n", redisURL, uniquePrefix(t))
	strict := head + `deny_status: 403
rules:
  - name: none-left
    key: [ip]
    algorithm: fixed_window
    limit: 1
    period: 1h
`
	open := head + "rules: []\n"
	a, write := fileApp(t, strict, zerolog.Nop())
	h := a.Handler()
	ask := func(ctx *fasthttp.RequestCtx) int {
		ctx.Request.Reset()
		ctx.Response.Reset()
		ctx.Request.SetRequestURI("/auth")
		ctx.Request.Header.Set("X-Original-URI", "/x")
		ctx.Request.Header.Set("X-Real-IP", "192.0.2.1")
		h(ctx)
		return ctx.Response.StatusCode()
	}
	var ctx fasthttp.RequestCtx
	if c := ask(&ctx); c != 204 {
		t.Fatalf("first request: %d", c)
	}
	if c := ask(&ctx); c != 403 {
		t.Fatalf("second request: %d, want 403", c)
	}

	var stop atomic.Bool
	var wg sync.WaitGroup
	var mixed, total atomic.Int64
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var ctx fasthttp.RequestCtx
			for !stop.Load() {
				c := ask(&ctx)
				total.Add(1)
				if c != 204 && c != 403 {
					mixed.Add(1)
				}
			}
		}()
	}
	deadline := time.Now().Add(8 * time.Second)
	reloads := 0
	for time.Now().Before(deadline) && mixed.Load() == 0 && reloads < 4000 {
		for _, y := range []string{open, strict} {
			write(y)
			if _, err := a.Reload("test"); err != nil {
				t.Fatal(err)
			}
			reloads++
		}
	}
	stop.Store(true)
	wg.Wait()
	t.Logf("%d reloads, %d requests, %d answered neither as the old file (204) nor as the new one (403)", reloads, total.Load(), mixed.Load())
	if mixed.Load() > 0 {
		t.Errorf("%d requests were denied by the 403 file's rule with the other file's 429", mixed.Load())
	}
}
