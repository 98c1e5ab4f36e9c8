package app

import (
	"testing"
	"time"

	"github.com/rategate/rategate/limits/memstore"

	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/handler"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/metrics"
	"github.com/rategate/rategate/top"
)

// observedAllocs is handler/alloc_test.go's allowedAllocs (9: measured 7
// plus 2): metrics as the store observer and the handler's observer must
// add none.
const observedAllocs = 9

// TestObservedAuthAllocs: an allowed and a denied /auth request, observed
// by the metrics and the top sketch through an instrumented memory store,
// allocate no more than an unobserved one.
func TestObservedAuthAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items on purpose; run without -race")
	}
	m := metrics.New()
	mem := memstore.New()
	defer mem.Close()
	rules := []*limits.Rule{
		{Name: "per-ip", Key: []limits.KeyPart{{Kind: limits.KeyIP}}, Algorithm: limits.FixedWindow, Limit: 1 << 40, Period: time.Minute, Burst: 1 << 40, Cost: 1},
		{Name: "shadow", Key: []limits.KeyPart{{Kind: limits.KeyIP}}, Algorithm: limits.FixedWindow, Limit: 1, Period: time.Minute, Burst: 1, Cost: 1, Shadow: true},
	}
	l := limits.New(limits.Options{Store: mem, Prefix: "rg", Rules: rules, Observer: m})
	m.SetRules([]metrics.RuleInfo{{Name: "per-ip"}, {Name: "shadow"}})
	h := handler.New(l, l, handler.Options{Observer: observer{metrics: m, top: top.New()}})
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/auth")
	ctx.Request.Header.Set("X-Original-URI", "/api/v1/items?page=2")
	ctx.Request.Header.Set("X-Real-IP", "192.0.2.7")
	serve := func() {
		ctx.Response.Reset()
		h.Serve(&ctx)
	}
	l0 := limits.NewLimiter(mem, "rg", rules)
	h0 := handler.New(l0, l0, handler.Options{})
	var c0 fasthttp.RequestCtx
	ctx.Request.CopyTo(&c0.Request)
	base := testing.AllocsPerRun(2000, func() { c0.Response.Reset(); h0.Serve(&c0) })
	serve()
	serve() // the shadow rule now would deny: the top sketch has its entry
	if got := ctx.Response.StatusCode(); got != 204 {
		t.Fatalf("status %d, want 204", got)
	}
	n := testing.AllocsPerRun(2000, serve)
	t.Logf("allocations per /auth request (2 rules, one shadow would-deny): %v observed, %v unobserved on the bare store", n, base)
	if n > base {
		t.Errorf("observing adds %v allocations per request, want none", n-base)
	}
	// One more key string than the one-rule budget: the second rule's key.
	if n > observedAllocs+1 {
		t.Errorf("%v allocations per observed request, want <= %d", n, observedAllocs+1)
	}
}
