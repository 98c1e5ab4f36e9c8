package handler

import (
	"net/netip"
	"strings"
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
	// hugeAllocs: the allowed request of TestHugeRequestAllocs, an
	// 18 KB route: the route, key and identity buffers grow from nothing
	// again (geometrically), the rest is reused. Measured 40.
	hugeAllocs = 50
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

// TestHugeRequestAllocs: a request whose route (and so its key) grows
// a buffer past maxPooledBuf gives back only that buffer: the scratch goes
// back to the pool with every buffer bounded, and the next such request
// grows just the large ones again. (put used to drop the whole scratch:
// from a 16.5 KB route on, each request regrew everything, 86 allocations
// and twice the CPU of one just below.)
func TestHugeRequestAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items on purpose; run without -race")
	}
	store := memstore.New()
	defer store.Close()
	l := limits.NewLimiter(store, "rg", []*limits.Rule{rule("per-route", 1<<40, time.Minute, limits.KeyRoute)})
	h := New(l, l, Options{})
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/auth")
	// each raw byte 0xE9 is %E9 in the route: 18,003 bytes
	ctx.Request.Header.Set("X-Original-URI", "/"+strings.Repeat("\xe9", 6000))
	ctx.Request.Header.Set("X-Real-IP", "192.0.2.7")
	serve := func() {
		ctx.Response.Reset()
		h.Serve(&ctx)
	}
	serve()
	if got := ctx.Response.StatusCode(); got != 204 {
		t.Fatalf("status %d, want 204", got)
	}
	n := testing.AllocsPerRun(200, serve)
	t.Logf("allocations per request with an 18 KB route: %v", n)
	if n > hugeAllocs {
		t.Errorf("%v allocations per request with an 18 KB route, want <= %d (only its large buffers regrown)", n, hugeAllocs)
	}
	s := h.pool.Get().(*scratch)
	defer h.pool.Put(s)
	for name, c := range map[string]int{"route": cap(s.route), "ip": cap(s.ip), "host": cap(s.host), "buf": cap(s.buf),
		"list": cap(s.list), "item": cap(s.item)} {
		if c > maxPooledBuf {
			t.Errorf("the pooled scratch keeps a %s buffer of %d bytes, want at most %d", name, c, maxPooledBuf)
		}
	}
}
