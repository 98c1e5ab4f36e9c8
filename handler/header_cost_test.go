package handler_test

import (
	"bufio"
	"bytes"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/handler"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
)

// serveTime is the least time, over rounds, that reading head (a whole
// /auth request as NGINX sends it) and answering it take, per request:
// the least is the one a loaded machine disturbed least.
func serveTime(t *testing.T, h *handler.Handler, head string, n int) time.Duration {
	var ctx fasthttp.RequestCtx
	src := strings.NewReader(head)
	br := bufio.NewReaderSize(src, 64<<10)
	serve := func() {
		src.Reset(head)
		br.Reset(src)
		ctx.Request.Reset()
		ctx.Response.Reset()
		if err := ctx.Request.Read(br); err != nil {
			t.Fatal(err)
		}
		h.Serve(&ctx)
		if st := ctx.Response.StatusCode(); st != fasthttp.StatusNoContent {
			t.Fatalf("status %d: %s", st, ctx.Response.Body())
		}
	}
	serve()
	best := time.Duration(1 << 62)
	for round := 0; round < 7; round++ {
		start := time.Now()
		for i := 0; i < n; i++ {
			serve()
		}
		best = min(best, time.Since(start))
	}
	return best / time.Duration(n)
}

// TestLongHeaderValueCostsOncePerRequest: a client chooses the value of
// a header the rules read (match.header, a header key), up to NGINX's
// 8 KiB header buffer, and the white space at its ends that rategate
// trims (limits.TrimValue: tabs, control bytes, Latin-1 NEL 0x85,
// U+3000, ...); NGINX passes all of those on. Twenty rules that match
// X-Plan: planN (a plan tier per route, say) each trimmed the value
// again: an /auth request whose X-Plan is 7,000 bytes of 0x85 then
// "plan3" cost twenty trims of 7,000 bytes, about half a millisecond of
// CPU, against a few µs for "plan3" (measured: 217x for match.header,
// 59x for a header key, read and decided with the memory store). NGINX
// gives up on rategate at 250 ms and lets the request through; a
// thousand such requests a second fill a core. A header value must cost
// its length about once per request, not once per rule.
func TestLongHeaderValueCostsOncePerRequest(t *testing.T) {
	const rules = 20
	pad := strings.Repeat("\x85", 7000)
	for _, c := range []struct {
		name   string
		rule   func(i int) *limits.Rule
		header string
		value  string
	}{
		{"match.header", func(i int) *limits.Rule {
			return &limits.Rule{Name: fmt.Sprintf("plan%d", i), Match: limits.Match{Headers: []limits.HeaderMatch{{Name: "X-Plan", Value: []byte(fmt.Sprintf("plan%d", i))}}},
				Key: []limits.KeyPart{{Kind: limits.KeyIP}}, Algorithm: limits.FixedWindow, Limit: 1 << 40, Period: time.Minute, Burst: 1 << 40, Cost: 1}
		}, "X-Plan", "plan3"},
		{"key header", func(i int) *limits.Rule {
			return &limits.Rule{Name: fmt.Sprintf("key%d", i), Key: []limits.KeyPart{{Kind: limits.KeyHeader, Header: "X-Api-Key"}},
				Algorithm: limits.FixedWindow, Limit: 1 << 40, Period: time.Minute, Burst: 1 << 40, Cost: 1}
		}, "X-Api-Key", "k-0123456789"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var rs []*limits.Rule
			for i := 0; i < rules; i++ {
				rs = append(rs, c.rule(i))
			}
			store := memstore.New()
			defer store.Close()
			l := limits.NewLimiter(store, "hc", rs)
			h := handler.New(l, l, handler.Options{})
			head := func(v string) string {
				var b bytes.Buffer
				b.WriteString("GET /auth HTTP/1.1\r\nHost: rategate\r\nX-Original-URI: /svc3/items\r\nX-Original-Method: GET\r\n")
				b.WriteString("X-Original-Host: example.com\r\nX-Real-IP: 192.0.2.7\r\n" + c.header + ": " + v + "\r\n\r\n")
				return b.String()
			}
			ordinary, crafted := head(c.value), head(pad+c.value)
			var o, x time.Duration
			for try := 0; try < 3; try++ {
				o, x = serveTime(t, h, ordinary, 100), serveTime(t, h, crafted, 100)
				if x <= 10*o {
					break
				}
			}
			t.Logf("%d rules: ordinary %v, %d-byte value %v per request (%.0fx)", rules, o, len(pad+c.value), x, float64(x)/float64(o))
			if x > 10*o {
				t.Errorf("an /auth request with a %d-byte %s padded with white space costs %.0fx an ordinary one (%v against %v): want at most 10x",
					len(pad+c.value), c.header, float64(x)/float64(o), x, o)
			}
		})
	}
}
