package app

import (
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// TestMatchHostAndKeyAgree: a rule with match.host counts every request it
// matches under that host's one key. match.host compared with
// strings.EqualFold, which holds the Kelvin sign (U+212A) one letter with
// k and the long s (U+017F) one with s, while AppendHost keeps both apart
// (it never turns a non-ASCII letter into ASCII): each spelling of
// kiosk.example's k's and s that match.host matched counted apart, so a
// limit of 3 an hour on host kiosk.example admitted 3 per spelling. (Either
// fix passes: the spellings counted as kiosk.example, or not matched, as
// NGINX's server_name does not match them.)
func TestMatchHostAndKeyAgree(t *testing.T) {
	s := newStack(t, `
rules:
  - name: kiosk
    match:
      host: kiosk.example
    key: [host]
    algorithm: fixed_window
    limit: 3
    period: 1h
`, "")
	const K, S = "\u212a", "\u017f"
	ruled := 0
	for _, h := range []string{
		"kiosk.example", K + "iosk.example", "kio" + S + "k.example", "kios" + K + ".example",
		K + "io" + S + K + ".example", K + "io" + S + "k.example", "kio" + S + K + ".example",
	} {
		for range 3 {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			req.SetRequestURI("http://" + s.auth.Addr + "/auth")
			req.Header.Set("X-Original-URI", "/")
			req.Header.Set("X-Real-IP", "192.0.2.1")
			req.Header.Set("X-Original-Host", h)
			if err := s.auth.DoTimeout(req, resp, 5*time.Second); err != nil {
				t.Fatal(err)
			}
			// admitted under the rule: it answered with its limit
			if resp.StatusCode() == 204 && len(resp.Header.Peek("X-RateLimit-Limit")) > 0 {
				ruled++
			}
			fasthttp.ReleaseRequest(req)
			fasthttp.ReleaseResponse(resp)
		}
	}
	if ruled != 3 {
		t.Fatalf("the rule on host kiosk.example (limit 3 an hour) admitted %d requests over 7 spellings match.host matches, want 3: "+
			"the rule's match and its key disagree", ruled)
	}
}
