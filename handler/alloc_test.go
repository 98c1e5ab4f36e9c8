package handler

import (
	"net/netip"
	"testing"
	"time"

	"github.com/rategate/rategate/limits/memstore"

	"github.com/rategate/rategate/limits"
	"github.com/valyala/fasthttp"
)

// Allocation budgets (go1.26, amd64).
const (
	// allowedAllocs: one allowed /auth request with one rule through Serve,
	// the real limiter and the memory store. Measured 2, both in the memory
	// store; the handler and the limiter add none (limits.TestLimiterAllocs).
	allowedAllocs = 2
	// handlerAllocs: the same request with a Decider that allocates
	// nothing: the handler itself, identity parsing and the decision's
	// context (reused, see deadline.go) allocate nothing.
	handlerAllocs = 0
)

func TestAuthAllowedAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items on purpose; run without -race")
	}
	store := memstore.New()
	defer store.Close()
	l := limits.NewLimiter(store, "rg", []*limits.Rule{rule("per-ip", 1<<40, time.Minute, limits.KeyIP)})
	h := New(l, l, Options{})

	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/auth")
	ctx.Request.Header.Set("X-Original-URI", "/api/v1/items/../items?page=2")
	ctx.Request.Header.Set("X-Real-IP", "192.0.2.7")
	ctx.Request.Header.Set("X-User-Id", "alice")
	ctx.Request.Header.Set("X-Original-Method", "GET")
	ctx.Request.Header.Set("X-Original-Host", "api.example.com")
	serve := func() {
		ctx.Response.Reset()
		h.Serve(&ctx)
	}
	serve()
	if got := ctx.Response.StatusCode(); got != 204 {
		t.Fatalf("status %d, want 204", got)
	}
	if got := string(ctx.Response.Header.PeekCanonical([]byte("X-RateLimit-Limit"))); got != "1099511627776" {
		t.Fatalf("X-RateLimit-Limit %q", got)
	}

	n := testing.AllocsPerRun(2000, serve)
	t.Logf("allocations per allowed /auth request: %v", n)
	if n > allowedAllocs {
		t.Errorf("%v allocations per allowed /auth request, want <= %d", n, allowedAllocs)
	}
}

// TestHandlerAllocs measures the handler alone: a Decider that allocates
// nothing, so every allocation counted is the handler's (plus the context).
func TestHandlerAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items on purpose; run without -race")
	}
	r := &limits.Rule{Name: "per-ip", Limit: 100, Period: time.Minute, Burst: 100}
	d := &canned{Admitted: true, Denier: -1, Verdicts: []limits.Verdict{
		{Rule: r, Cost: 1, Result: limits.Result{Allowed: true, Remaining: 99, ResetUS: 42_000_000}},
	}}
	h := New(d, nil, Options{})
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/auth")
	ctx.Request.Header.Set("X-Original-URI", "/api/v1/items?page=2")
	ctx.Request.Header.Set("X-Real-IP", "2001:db8::7")
	ctx.Request.Header.Set("X-User-Id", "alice")
	serve := func() {
		ctx.Response.Reset()
		h.Serve(&ctx)
	}
	serve()
	n := testing.AllocsPerRun(2000, serve)
	t.Logf("allocations per allowed /auth request, handler and context only: %v", n)
	if n > handlerAllocs {
		t.Errorf("%v allocations per allowed /auth request in the handler, want <= %d", n, handlerAllocs)
	}
}

// TestForwardedAllocs: walking X-Forwarded-For past trusted proxies
// allocates nothing either.
func TestForwardedAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are only meaningful without -race")
	}
	lines := [][]byte{[]byte("198.51.100.9, 203.0.113.7"), []byte("10.0.0.2, 10.0.0.1")}
	trusted := []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")}
	if a, ok := forwardedClient(lines, trusted); !ok || a != netip.MustParseAddr("203.0.113.7") {
		t.Fatalf("client %v %v, want 203.0.113.7", a, ok)
	}
	if n := testing.AllocsPerRun(1000, func() { _, _ = forwardedClient(lines, trusted) }); n != 0 {
		t.Fatalf("%v allocations per X-Forwarded-For walk, want 0", n)
	}
}
