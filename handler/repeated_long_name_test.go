package handler

import (
	"net/textproto"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/valyala/fasthttp"
)

// TestRepeatedListLongNameAllocs: listedNames lower-cases each item of
// X-Rategate-Repeated into a 64-byte array on the stack, and an item
// longer than that into a fresh slice. A rule that reads a header whose
// name is longer than 64 bytes (config allows any token) lets a client's
// own list (the plain NGINX variant passes it on, up to 8 KiB) of items
// of that name's length cost an allocation per growth of each item: the
// /auth request stops being allocation-free in the handler.
func TestRepeatedListLongNameAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items on purpose; run without -race")
	}
	long := textproto.CanonicalMIMEHeaderKey("X-" + strings.Repeat("a", 78)) // 80 bytes
	r := rule("long", 1<<40, time.Minute, limits.KeyIP)
	r.Match.Headers = []limits.HeaderMatch{{Name: long, Value: []byte("gold")}}
	store := memstore.New()
	defer store.Close()
	l := limits.NewLimiter(store, "rg", []*limits.Rule{r})
	h := New(l, l, Options{})
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/auth")
	ctx.Request.Header.Set("X-Original-URI", "/api/items")
	ctx.Request.Header.Set("X-Real-IP", "192.0.2.7")
	ctx.Request.Header.Set(long, "gold")
	// 85 items of the name's length, none of them the name: 6,885 bytes
	ctx.Request.Header.Set(repeatedHeader, strings.TrimSuffix(strings.Repeat(strings.Repeat("z", len(long))+",", 85), ","))
	serve := func() {
		ctx.Response.Reset()
		h.Serve(&ctx)
	}
	serve()
	if got := ctx.Response.StatusCode(); got != 204 {
		t.Fatalf("status %d, want 204: %s", got, ctx.Response.Body())
	}
	n := testing.AllocsPerRun(200, serve)
	t.Logf("allocations per /auth request with an 85-item X-Rategate-Repeated, items as long as an 80-byte header name a rule reads: %v", n)
	if n > allowedAllocs {
		t.Errorf("%v allocations per /auth request, want <= %d (as without the list): each item longer than 64 bytes is lower-cased into a new slice", n, allowedAllocs)
	}
}
