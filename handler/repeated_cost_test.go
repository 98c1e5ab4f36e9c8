package handler_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/handler"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
)

// TestRepeatedListCostsOncePerRequest: X-Rategate-Repeated lists the
// headers a client repeated (the Lua variant sets it); through the plain
// variant NGINX passes a client's own on, up to 8 KiB. The handler
// scanned the whole list once for every header name the rules read: a
// policy whose 20 rules match 20 headers (X-Tier-0..19) made an /auth
// request with a 7,000-byte list of "a," cost 20 scans of 3,500 items
// (measured: 152x an ordinary request, head parsed, memory store). The
// list must cost its length about once per request.
func TestRepeatedListCostsOncePerRequest(t *testing.T) {
	var rs []*limits.Rule
	for i := 0; i < 20; i++ {
		rs = append(rs, &limits.Rule{Name: fmt.Sprintf("tier%d", i),
			Match:     limits.Match{Headers: []limits.HeaderMatch{{Name: fmt.Sprintf("X-Tier-%d", i), Value: []byte("gold")}}},
			Key:       []limits.KeyPart{{Kind: limits.KeyIP}},
			Algorithm: limits.FixedWindow, Limit: 1 << 40, Period: time.Minute, Burst: 1 << 40, Cost: 1})
	}
	store := memstore.New()
	defer store.Close()
	l := limits.NewLimiter(store, "rc", rs)
	h := handler.New(l, l, handler.Options{})
	base := "GET /auth HTTP/1.1\r\nHost: rategate\r\nX-Original-URI: /api/items\r\nX-Original-Method: GET\r\n" +
		"X-Original-Host: example.com\r\nX-Real-IP: 192.0.2.7\r\nX-Tier-3: gold\r\n"
	ordinary := base + "\r\n"
	crafted := base + "X-Rategate-Repeated: " + strings.Repeat("a,", 3500) + "\r\n\r\n"
	var o, x time.Duration
	for try := 0; try < 3; try++ {
		o, x = serveTime(t, h, ordinary, 100), serveTime(t, h, crafted, 100)
		if x <= 10*o {
			break
		}
	}
	t.Logf("20 header names: ordinary %v, with a %d-byte X-Rategate-Repeated %v per request (%.0fx)", o, 7000, x, float64(x)/float64(o))
	if x > 10*o {
		t.Errorf("an /auth request with a 7,000-byte X-Rategate-Repeated costs %.0fx an ordinary one (%v against %v): want at most 10x", float64(x)/float64(o), x, o)
	}
}
