package handler

import (
	"bytes"
	"errors"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// std are the headers NGINX sets in the shipped config.
func std(ip string, more ...string) []string {
	return append([]string{"X-Original-URI", "/login?next=/", "X-Real-IP", ip}, more...)
}

func TestAllowedThenLimited(t *testing.T) {
	ts := pinned(t, Options{}, rule("login-per-ip", 2, time.Minute, limits.KeyIP))

	for remaining := 1; remaining >= 0; remaining-- {
		r := ts.auth(t, std("203.0.113.9")...)
		equal(t, reply{status: 204, body: "", headers: map[string]string{
			"ratelimit-policy":      `"login-per-ip";q=2;w=60`,
			"ratelimit":             `"login-per-ip";r=` + strconv.Itoa(remaining) + `;t=42`,
			"x-ratelimit-limit":     "2",
			"x-ratelimit-remaining": strconv.Itoa(remaining),
			"x-ratelimit-reset":     "42",
		}}, r)
	}

	r := ts.auth(t, std("203.0.113.9")...)
	equal(t, reply{status: 429, body: "", headers: map[string]string{
		"ratelimit-policy":      `"login-per-ip";q=2;w=60`,
		"ratelimit":             `"login-per-ip";r=0;t=42`,
		"x-ratelimit-limit":     "2",
		"x-ratelimit-remaining": "0",
		"x-ratelimit-reset":     "42",
		"retry-after":           "42",
		"x-ratelimit-rule":      "login-per-ip",
	}}, r)

	// Another client has its own counter.
	equal(t, 204, ts.auth(t, std("203.0.113.10")...).status)
}

func TestHeaderNamesSpelledAsTheDraft(t *testing.T) {
	ts := pinned(t, Options{}, rule("a", 1, time.Minute, limits.KeyIP))
	status, _ := ts.raw(t, "GET /auth HTTP/1.1\r\nHost: x\r\nX-Original-URI: /\r\nX-Real-IP: 192.0.2.1\r\n\r\n")
	mustEqual(t, 204, status)

	conn := rawRoundTrip(t, ts, "GET /auth HTTP/1.1\r\nHost: x\r\nX-Original-URI: /\r\nX-Real-IP: 192.0.2.1\r\nConnection: close\r\n\r\n")
	for _, line := range []string{
		"\r\nRateLimit-Policy: \"a\";q=1;w=60\r\n",
		"\r\nRateLimit: \"a\";r=0;t=42\r\n",
		"\r\nX-RateLimit-Rule: a\r\n",
		"\r\nRetry-After: 42\r\n",
	} {
		check(t, strings.Contains(conn, line), "missing %q in:\n%s", line, conn)
	}
}

func TestRealClock(t *testing.T) {
	l, _ := newLimiter(t, rule("per-ip", 3, time.Minute, limits.KeyIP))
	ts := serve(t, New(l, l, Options{}))
	r := ts.auth(t, std("192.0.2.1")...)
	mustEqual(t, 204, r.status)
	reset, err := strconv.Atoi(r.headers["x-ratelimit-reset"])
	noErr(t, err)
	// The window may have turned between the two reads; either is fine.
	check(t, reset >= 1 && reset <= 60, "reset %d", reset)
	equal(t, `"per-ip";r=2;t=`+r.headers["x-ratelimit-reset"], r.headers["ratelimit"])
}

func TestMultiRuleHeaders(t *testing.T) {
	shadow := rule("shadow-global", 1, time.Minute)
	shadow.Shadow = true
	other := rule("other-path", 1, time.Minute)
	other.Match.PathPrefix = "/other"
	ts := pinned(t, Options{},
		rule("per-ip", 5, time.Minute, limits.KeyIP),
		shadow,
		rule("per-user", 3, time.Hour, limits.KeyUser),
		other,
	)
	user := []string{"X-User-Id", "alice"}

	want := func(ip, user int) reply {
		least, limit, reset := ip, 5, 42
		if user < ip {
			least, limit, reset = user, 3, 3582
		}
		return reply{status: 204, headers: map[string]string{
			"ratelimit-policy":      `"per-ip";q=5;w=60, "per-user";q=3;w=3600`,
			"ratelimit":             `"per-ip";r=` + strconv.Itoa(ip) + `;t=42, "per-user";r=` + strconv.Itoa(user) + `;t=3582`,
			"x-ratelimit-limit":     strconv.Itoa(limit),
			"x-ratelimit-remaining": strconv.Itoa(least),
			"x-ratelimit-reset":     strconv.Itoa(reset),
		}}
	}
	// First request: the shadow rule allows; second: it denies in shadow,
	// which changes nothing the client sees.
	equal(t, want(4, 2), ts.auth(t, std("192.0.2.1", user...)...))
	equal(t, want(3, 1), ts.auth(t, std("192.0.2.1", user...)...))
	// Another IP, same user: per-ip 4 left, per-user 0.
	equal(t, want(4, 0), ts.auth(t, std("192.0.2.2", user...)...))

	// Denied by per-user; per-ip keeps its quota (nothing consumed).
	r := ts.auth(t, std("192.0.2.2", user...)...)
	equal(t, 429, r.status)
	equal(t, "per-user", r.headers["x-ratelimit-rule"])
	equal(t, "3582", r.headers["retry-after"])
	equal(t, `"per-ip";r=4;t=42, "per-user";r=0;t=3582`, r.headers["ratelimit"])
	equal(t, "", r.body)
}

func TestTiesPickTheFirstRule(t *testing.T) {
	ts := pinned(t, Options{},
		rule("first", 5, time.Minute, limits.KeyIP),
		rule("second", 5, time.Hour, limits.KeyIP),
	)
	r := ts.auth(t, std("192.0.2.1")...)
	equal(t, "5", r.headers["x-ratelimit-limit"])
	equal(t, "4", r.headers["x-ratelimit-remaining"])
	equal(t, "42", r.headers["x-ratelimit-reset"])
}

func TestNoMatchingRule(t *testing.T) {
	r1 := rule("api", 1, time.Minute, limits.KeyIP)
	r1.Match.PathPrefix = "/api/"
	ts := pinned(t, Options{}, r1)
	for range 3 {
		equal(t, reply{status: 204, headers: map[string]string{}}, ts.auth(t, std("192.0.2.1")...))
	}
}

func TestOnlyShadowRules(t *testing.T) {
	s := rule("shadow", 1, time.Minute, limits.KeyIP)
	s.Shadow = true
	ts := pinned(t, Options{}, s)
	for range 3 {
		equal(t, reply{status: 204, headers: map[string]string{}}, ts.auth(t, std("192.0.2.1")...))
	}
}

func TestDenyStatus403(t *testing.T) {
	ts := pinned(t, Options{DenyStatus: 403}, rule("r", 1, time.Minute, limits.KeyIP))
	equal(t, 204, ts.auth(t, std("192.0.2.1")...).status)
	r := ts.auth(t, std("192.0.2.1")...)
	equal(t, 403, r.status)
	equal(t, "42", r.headers["retry-after"])
	equal(t, "r", r.headers["x-ratelimit-rule"])
}

func TestCostHeader(t *testing.T) {
	opts := Options{CostHeader: "X-RateLimit-Cost", MaxCost: 100}
	ts := pinned(t, opts, rule("r", 5, time.Minute, limits.KeyIP))

	equal(t, "3", ts.auth(t, std("192.0.2.1", "X-RateLimit-Cost", "2")...).headers["x-ratelimit-remaining"])
	equal(t, "2", ts.auth(t, std("192.0.2.1")...).headers["x-ratelimit-remaining"], "absent: the rule's cost")
	equal(t, "0", ts.auth(t, std("192.0.2.1", "X-RateLimit-Cost", " 2 ")...).headers["x-ratelimit-remaining"])

	r := ts.auth(t, std("192.0.2.2", "X-RateLimit-Cost", "6")...)
	equal(t, reply{status: 429, body: "rate limited by rule \"r\"; request cost 6 can never fit (burst 5)\n", headers: map[string]string{
		"ratelimit-policy":      `"r";q=5;w=60`,
		"ratelimit":             `"r";r=5;t=0`,
		"x-ratelimit-limit":     "5",
		"x-ratelimit-remaining": "5",
		"x-ratelimit-reset":     "0",
		"x-ratelimit-rule":      "r",
	}}, r, "cost > burst: no Retry-After")

	const bad = "invalid X-RateLimit-Cost header: want an integer from 1 to 100\n"
	for _, v := range []string{"0", "-1", "+1", "1.5", "1e2", "abc", "101", "0x10", "99999999999999999999", "1 2"} {
		equal(t, reply{status: 400, body: bad, headers: map[string]string{}},
			ts.auth(t, std("192.0.2.3", "X-RateLimit-Cost", v)...), "cost %q", v)
	}
}

func TestCostHeaderOff(t *testing.T) {
	ts := pinned(t, Options{}, rule("r", 5, time.Minute, limits.KeyIP))
	r := ts.auth(t, std("192.0.2.1", "X-RateLimit-Cost", "junk")...)
	equal(t, "4", r.headers["x-ratelimit-remaining"], "CostHeader unset: the header is ignored")
}

func TestBadRequests(t *testing.T) {
	ts := pinned(t, Options{}, rule("r", 5, time.Minute, limits.KeyIP))
	const noURI = "missing X-Original-URI and X-Original-URL headers: add \"proxy_set_header X-Original-URI $request_uri;\" to the auth location" +
		" (ingress-nginx's auth-url sets \"X-Original-URL $scheme://$http_host$request_uri\")\n"
	const noIP = "no valid client IP in X-Real-IP: add \"proxy_set_header X-Real-IP $remote_addr;\" to the auth location\n"
	tests := []struct {
		name string
		kv   []string
		body string
	}{
		{"no URI", []string{"X-Real-IP", "192.0.2.1"}, noURI},
		{"empty URI", []string{"X-Original-URI", "", "X-Real-IP", "192.0.2.1"}, noURI},
		{"no IP", []string{"X-Original-URI", "/"}, noIP},
		{"empty IP", []string{"X-Original-URI", "/", "X-Real-IP", ""}, noIP},
		{"IP list", []string{"X-Original-URI", "/", "X-Real-IP", "192.0.2.1, 192.0.2.2"}, noIP},
		{"host name with port", []string{"X-Original-URI", "/", "X-Real-IP", "gw.example:80"}, noIP},
		{"IP with zone", []string{"X-Original-URI", "/", "X-Real-IP", "fe80::1%eth0"}, noIP},
		{"not an IP", []string{"X-Original-URI", "/", "X-Real-IP", "unknown"}, noIP},
	}
	for _, tt := range tests {
		equal(t, reply{status: 400, body: tt.body, headers: map[string]string{}}, ts.auth(t, tt.kv...), tt.name)
	}
}

func TestBadRequestsCustomHeaders(t *testing.T) {
	ts := pinned(t, Options{URIHeader: "X-Uri", IPHeader: "x-forwarded-for"}, rule("r", 5, time.Minute, limits.KeyIP))
	equal(t, "missing X-Uri and X-Original-URL headers: add \"proxy_set_header X-Uri $request_uri;\" to the auth location"+
		" (ingress-nginx's auth-url sets \"X-Original-URL $scheme://$http_host$request_uri\")\n",
		ts.auth(t, "X-Forwarded-For", "192.0.2.1").body)
	equal(t, "no valid client IP in x-forwarded-for: add \"proxy_set_header x-forwarded-for $proxy_add_x_forwarded_for;\" to the auth location\n",
		ts.auth(t, "X-Uri", "/", "X-Forwarded-For", "junk").body)
	equal(t, 204, ts.auth(t, "X-Uri", "/", "X-Forwarded-For", "192.0.2.1").status)
}

// TestForwardedForSpoofing checks through the listener which hop a limit is
// counted against: limit 1 per IP, so a second request counted against the
// same address is denied.
func TestForwardedForSpoofing(t *testing.T) {
	opts := Options{
		IPHeader:       "X-Forwarded-For",
		TrustedProxies: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("::1/128")},
	}
	ts := pinned(t, opts, rule("per-ip", 1, time.Minute, limits.KeyIP))
	xff := func(lines ...string) []string {
		kv := []string{"X-Original-URI", "/"}
		for _, l := range lines {
			kv = append(kv, "X-Forwarded-For", l)
		}
		return kv
	}

	steps := []struct {
		name  string
		lines []string
		want  int
	}{
		{"client 203.0.113.9 behind two proxies", []string{"203.0.113.9, 10.0.0.2, 10.0.0.1"}, 204},
		{"same client, fresh spoofed left-most hop", []string{"1.1.1.1, 203.0.113.9, 10.0.0.2, 10.0.0.1"}, 429},
		{"same client, spoofed trusted-looking hop", []string{"10.7.7.7, 203.0.113.9, 10.0.0.1"}, 429},
		{"same client, spoof in its own header line", []string{"5.5.5.5", "203.0.113.9, 10.0.0.1"}, 429},
		{"same client, mapped IPv6 spelling", []string{"::ffff:203.0.113.9, 10.0.0.1"}, 429},
		{"untrusted right-most hop wins", []string{"203.0.113.9, 198.51.100.4"}, 204},
		{"and is counted", []string{"198.51.100.4"}, 429},
		{"all trusted: the left-most", []string{"10.0.0.5, ::1"}, 204},
		{"all trusted: counted", []string{"10.0.0.5"}, 429},
	}
	for _, s := range steps {
		equal(t, s.want, ts.auth(t, xff(s.lines...)...).status, s.name)
	}
}

func TestIdentity(t *testing.T) {
	rec := &recorder{got: make(chan string, 1)}
	ts := serve(t, New(rec, nil, Options{CostHeader: "X-Cost"}))

	ts.auth(t, "X-Original-URI", "/a/../b//c?q=1", "X-Real-IP", "::ffff:192.0.2.1", "Host", "Fallback.Example")
	equal(t, "method=GET route=/b/c host=fallback.example ip=192.0.2.1 user= cost=0", <-rec.got)

	ts.auth(t, "X-Original-URI", "/%7euser", "X-Real-IP", " 2001:DB8::1 ",
		"X-Original-Method", "POST", "X-Original-Host", "API.example.com", "X-User-Id", "alice", "X-Cost", "7")
	equal(t, "method=POST route=/~user host=api.example.com ip=2001:db8::/64 user=alice cost=7", <-rec.got)

	// An absolute URI names its host (NGINX's $request_uri never is one;
	// ingress-nginx's X-Original-URL always is).
	ts.auth(t, "X-Original-URI", "http://H./%7euser", "X-Real-IP", "192.0.2.1", "X-Original-Host", "API.example.com")
	equal(t, "method=GET route=/~user host=h ip=192.0.2.1 user= cost=0", <-rec.got)

	// A port or a trailing dot in X-Original-Host (or Host) names the same
	// host as X-Original-URL's authority does: one counter, whichever
	// header said it.
	for _, host := range []string{"Evil.Example", "evil.example.", "EVIL.example:443", "evil.example.:8080"} {
		ts.auth(t, "X-Original-URI", "/x", "X-Real-IP", "192.0.2.1", "X-Original-Host", host)
		equal(t, "method=GET route=/x host=evil.example ip=192.0.2.1 user= cost=0", <-rec.got, "X-Original-Host %q", host)
		ts.auth(t, "X-Original-URI", "/x", "X-Real-IP", "192.0.2.1", "Host", host)
		equal(t, "method=GET route=/x host=evil.example ip=192.0.2.1 user= cost=0", <-rec.got, "Host %q", host)
	}
	ts.auth(t, "X-Original-URI", "/x", "X-Real-IP", "192.0.2.1", "X-Original-Host", "[2001:DB8::1]:443")
	equal(t, "method=GET route=/x host=[2001:db8::1] ip=192.0.2.1 user= cost=0", <-rec.got)
}

// TestHeaderNamesAnyCase: header names are case-insensitive, in the config
// as on the wire. The handler reads them in their canonical form, so a name
// configured in any case must find a header sent in any other.
func TestHeaderNamesAnyCase(t *testing.T) {
	rec := &recorder{got: make(chan string, 1)}
	ts := serve(t, New(rec, nil, Options{UserHeader: "x-USER", IPHeader: "x-client-ip", URIHeader: "X-URI",
		MethodHeader: "x-verb", HostHeader: "X-SITE", CostHeader: "x-COST"}))
	for _, hdr := range []string{
		"X-Uri: /a\r\nX-Client-Ip: 192.0.2.7\r\nX-Verb: PUT\r\nX-Site: Api.Example\r\nX-User: bob\r\nX-Cost: 3\r\n",
		"x-uri: /a\r\nx-client-ip: 192.0.2.7\r\nx-verb: PUT\r\nx-site: Api.Example\r\nx-user: bob\r\nx-cost: 3\r\n",
		"X-URI: /a\r\nX-CLIENT-IP: 192.0.2.7\r\nX-VERB: PUT\r\nX-SITE: Api.Example\r\nX-USER: bob\r\nX-COST: 3\r\n",
	} {
		status, body := ts.raw(t, "GET /auth HTTP/1.1\r\nHost: ignored\r\n"+hdr+"Connection: close\r\n\r\n")
		mustEqual(t, 204, status, body)
		equal(t, "method=PUT route=/a host=api.example ip=192.0.2.7 user=bob cost=3", <-rec.got, "%q", hdr)
	}
}

func TestStoreFailure(t *testing.T) {
	storeErr := errors.New("dial tcp 127.0.0.1:1: connect: connection refused")
	for _, mode := range []limits.FailureMode{limits.FailAllow, limits.FailLocal} {
		f := &failingStore{err: storeErr, mode: mode, deadline: make(chan time.Duration, 1)}
		ts := serve(t, New(f, f, Options{Timeout: 80 * time.Millisecond}))
		equal(t, reply{status: 204, headers: map[string]string{"x-ratelimit-status": "unavailable"}},
			ts.auth(t, std("192.0.2.1")...), "mode %q", mode)
		left := <-f.deadline
		check(t, left > 0 && left <= 80*time.Millisecond, "Decide must get its own deadline, got %v", left)
	}

	f := &failingStore{err: storeErr, mode: limits.FailDeny, deadline: make(chan time.Duration, 1)}
	ts := serve(t, New(f, f, Options{}))
	equal(t, reply{
		status:  503,
		body:    "rate-limit store unavailable: dial tcp 127.0.0.1:1: connect: connection refused\n",
		headers: map[string]string{"x-ratelimit-status": "unavailable"},
	}, ts.auth(t, std("192.0.2.1")...))

	// Bad input is still 400, never 503: it is not the store's fault.
	equal(t, 400, ts.auth(t, "X-Real-IP", "192.0.2.1").status)
}

// syncBuffer is a log sink safe for concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(substr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, l := range strings.Split(s.b.String(), "\n") {
		if strings.Contains(l, substr) {
			n++
		}
	}
	return n
}

func TestLogsAreSampled(t *testing.T) {
	var logs syncBuffer
	log := zerolog.New(&logs).Level(zerolog.InfoLevel)

	f := &failingStore{err: errors.New("boom"), deadline: make(chan time.Duration, 1)}
	ts := serve(t, New(f, f, Options{Logger: log}))
	for range 200 {
		ts.auth(t, std("192.0.2.1")...)
	}
	// One burst line, plus the first of every 1000 after the burst.
	n := logs.lines(`"level":"warn"`)
	check(t, n >= 1 && n <= 2, "%d store-error lines for 200 failures", n)
	equal(t, n, logs.lines(`"error":"boom"`))

	logs = syncBuffer{}
	ts = pinned(t, Options{Logger: log}, rule("per-ip", 10, time.Minute, limits.KeyIP))
	for range 210 {
		ts.auth(t, std("192.0.2.1")...)
	}
	n = logs.lines(`"message":"request limited"`)
	check(t, n >= 10 && n <= 20, "%d denial lines for 200 denials (10 per second)", n)
	equal(t, n, logs.lines(`"rule":"per-ip"`))
	// The other info lines are the per-second counts of suppressed lines.
	equal(t, n, logs.lines(`"level":"info"`)-logs.lines(`denial lines suppressed`), "allowed requests are not logged")
}

func TestHealth(t *testing.T) {
	l, _ := newLimiter(t)
	ts := serve(t, New(l, l, Options{}))
	equal(t, reply{status: 200, body: "ok\n", headers: map[string]string{}}, ts.get(t, "/healthz"))
	equal(t, reply{status: 200, body: "ready: memory\n", headers: map[string]string{}}, ts.get(t, "/readyz"))
	equal(t, reply{status: 404, body: "not found\n", headers: map[string]string{}}, ts.get(t, "/"))
	equal(t, 404, ts.get(t, "/auth/x").status)

	f := &failingStore{err: errors.New("connection refused"), deadline: make(chan time.Duration, 1)}
	ts = serve(t, New(f, f, Options{Timeout: 30 * time.Millisecond}))
	equal(t, reply{status: 200, body: "ok\n", headers: map[string]string{}}, ts.get(t, "/healthz"))
	equal(t, reply{status: 503, body: "not ready: redis 127.0.0.1:1: connection refused\n", headers: map[string]string{}},
		ts.get(t, "/readyz"))
	left := <-f.deadline
	check(t, left > 0 && left <= 30*time.Millisecond, "Ping must get the timeout, got %v", left)
}

// TestAskedOnAuthOnly: Options.Asked hears each /auth request, bad ones
// too, and not the probes or other paths (a Kubernetes probe every few
// seconds would keep the lag monitor ticking on an idle pod).
func TestAskedOnAuthOnly(t *testing.T) {
	l, _ := newLimiter(t)
	var asked atomic.Int64
	ts := serve(t, New(l, l, Options{Asked: func() { asked.Add(1) }}))
	ts.get(t, "/healthz")
	ts.get(t, "/readyz")
	ts.get(t, "/")
	ts.get(t, "/auth/x")
	equal(t, int64(0), asked.Load(), "asked on probes and other paths")
	ts.get(t, "/auth", std("192.0.2.1")...)
	ts.get(t, "/auth") // no headers: a 400, asked all the same
	equal(t, int64(2), asked.Load(), "asked on /auth")
}

func TestAuthAnyMethodNoBody(t *testing.T) {
	ts := pinned(t, Options{}, rule("r", 100, time.Minute, limits.KeyIP))
	for _, m := range []string{"GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH"} {
		status, body := ts.raw(t, m+" /auth HTTP/1.1\r\nHost: x\r\nX-Original-URI: /\r\nX-Real-IP: 192.0.2.1\r\nConnection: close\r\n\r\n")
		equal(t, 204, status, m)
		equal(t, "", body, m)
	}
}

// TestConcurrentExactlyLimit sends 200 requests at once over separate
// connections against a limit of 50: exactly 50 are admitted.
func TestConcurrentExactlyLimit(t *testing.T) {
	ts := pinned(t, Options{}, rule("global", 50, time.Minute))
	const n = 200
	var wg sync.WaitGroup
	start := make(chan struct{})
	statuses := make(chan int, n)
	for range n {
		wg.Go(func() {
			req := fasthttp.AcquireRequest()
			resp := fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI("http://" + ts.addr + "/auth")
			req.Header.Set("X-Original-URI", "/")
			req.Header.Set("X-Real-IP", "192.0.2.1")
			<-start
			if err := ts.client.DoTimeout(req, resp, 10*time.Second); err != nil {
				statuses <- -1
				return
			}
			statuses <- resp.StatusCode()
		})
	}
	close(start)
	wg.Wait()
	close(statuses)
	count := map[int]int{}
	for s := range statuses {
		count[s]++
	}
	equal(t, map[int]int{204: 50, 429: 150}, count)
}

// hostile are header values a client (or a broken proxy) may send.
var hostile = []string{
	"a:b", "{x}", "}{", "x}:{y", "a b", " lead", "trail ", "a|b", "=192.0.2.1",
	"%7B%7D", "%", "a\tb", "\x01\x02\x7f", "\xff\xfe\xfd", "ünïcödé", "\"quoted\"",
	"a\\b", "../../etc", strings.Repeat("a", 8192), strings.Repeat("{", 8192),
}

// TestHostileHeaderValues sends each hostile value in each identity header,
// byte for byte, and accepts any answer but a 5xx.
func TestHostileHeaderValues(t *testing.T) {
	plan := rule("per-plan", 1000, time.Minute, limits.KeyHeader)
	plan.Key[0].Header = "X-Plan"
	ts := pinned(t, Options{CostHeader: "X-Cost", IPHeader: "X-Forwarded-For"},
		rule("per-user", 1000, time.Minute, limits.KeyUser),
		rule("per-route", 1000, time.Minute, limits.KeyRoute, limits.KeyMethod, limits.KeyHost),
		plan,
	)
	base := map[string]string{
		"X-Original-URI": "/x", "X-Forwarded-For": "192.0.2.1", "X-User-Id": "u",
		"X-Original-Method": "GET", "X-Original-Host": "h", "X-Plan": "free",
	}
	names := []string{"X-Original-URI", "X-Forwarded-For", "X-User-Id", "X-Original-Method", "X-Original-Host", "X-Plan", "X-Cost", "Host"}
	const noIP = "no valid client IP in X-Forwarded-For: add \"proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\" to the auth location\n"
	const badCost = "invalid X-Cost header: want an integer from 1 to 1000\n"
	for _, name := range names {
		for _, v := range hostile {
			var b strings.Builder
			b.WriteString("GET /auth HTTP/1.1\r\n")
			if name != "Host" {
				b.WriteString("Host: x\r\n")
			}
			for k, bv := range base {
				if k != name {
					b.WriteString(k + ": " + bv + "\r\n")
				}
			}
			b.WriteString(name + ": " + v + "\r\nConnection: close\r\n\r\n")
			status, body := ts.raw(t, b.String())
			got := reply{status: status, body: body, headers: map[string]string{}}

			switch {
			case strings.ContainsAny(v, "\x01") || name == "Host":
				// fasthttp refuses control bytes in any header, and
				// malformed Host values, with its own 400; the Host
				// values it accepts get a decision (X-Original-Host wins).
				check(t, status == 400 || status == 204, "%s: %.40q: %d %q", name, v, status, body)
			case name == "X-Forwarded-For":
				equal(t, reply{status: 400, body: noIP, headers: map[string]string{}}, got, "%s: %.40q", name, v)
			case name == "X-Cost":
				equal(t, reply{status: 400, body: badCost, headers: map[string]string{}}, got, "%s: %.40q", name, v)
			default:
				// Any value of the other headers is a valid identity.
				equal(t, 204, status, "%s: %.40q: %q", name, v, body)
			}
		}
	}

	// Many repeated lines of every identity header, one request: refused,
	// naming the first such header. A proxy that adds its copy after the
	// client's (HAProxy's add-header) instead of replacing it would
	// otherwise let the client's copy name the client. X-Forwarded-For is
	// a list: its lines are walked as one. A header a rule reads, repeated,
	// is refused too.
	for _, identity := range []bool{true, false} {
		var b strings.Builder
		b.WriteString("GET /auth HTTP/1.1\r\nHost: x\r\n")
		for i := range 200 {
			v := hostile[i%len(hostile)]
			if strings.ContainsAny(v, "\x01") {
				continue // fasthttp itself rejects control bytes with 400
			}
			v = v[:min(len(v), 32)]
			for _, name := range []string{"X-Original-URI", "X-User-Id", "X-Original-Method", "X-Original-Host"} {
				if identity || i == 0 {
					b.WriteString(name + ": " + v + "\r\n")
				}
			}
			b.WriteString("X-Plan: " + v + "\r\n")
			b.WriteString("X-Forwarded-For: 192.0.2." + strconv.Itoa(i) + "\r\n")
		}
		b.WriteString("Connection: close\r\n\r\n")
		status, body := ts.raw(t, b.String())
		want := "duplicate X-Plan header: a header the rate-limit rules read must be sent once\n"
		if identity {
			want = "duplicate X-Original-URI header: a header rategate reads the client's identity from must be sent once" +
				" (set it with proxy_set_header, which replaces the client's copy)\n"
		}
		equal(t, reply{status: 400, body: want, headers: map[string]string{}},
			reply{status: status, body: body, headers: map[string]string{}}, "repeated headers, identity %v", identity)
	}
}

// TestDuplicateIdentityHeaders: each header rategate reads the client's
// identity from, sent twice (in any case), is a 400 naming it, whichever
// copy a proxy in front added; X-Forwarded-For may come in several lines.
func TestDuplicateIdentityHeaders(t *testing.T) {
	for _, xff := range []bool{false, true} {
		opts := Options{CostHeader: "X-Cost"}
		ipHeader := "X-Real-IP"
		if xff {
			opts.IPHeader, ipHeader = "X-Forwarded-For", "X-Forwarded-For"
		}
		ts := pinned(t, opts, rule("per-user", 1000, time.Minute, limits.KeyUser))
		base := [][2]string{{"X-Original-URI", "/x"}, {ipHeader, "192.0.2.1"}, {"X-User-Id", "u"},
			{"X-Original-Method", "GET"}, {"X-Original-Host", "h"}, {"X-Cost", "1"}}
		for i, twice := range base {
			var b strings.Builder
			b.WriteString("GET /auth HTTP/1.1\r\nHost: x\r\n")
			for _, kv := range base {
				b.WriteString(kv[0] + ": " + kv[1] + "\r\n")
			}
			// the second copy in another case, as a proxy may write it
			b.WriteString(strings.ToLower(twice[0]) + ": 198.51.100." + strconv.Itoa(i) + "\r\nConnection: close\r\n\r\n")
			status, body := ts.raw(t, b.String())
			if xff && twice[0] == "X-Forwarded-For" {
				equal(t, 204, status, "X-Forwarded-For in two lines: %q", body)
				continue
			}
			equal(t, 400, status, "%s twice (xff %v)", twice[0], xff)
			check(t, strings.HasPrefix(body, "duplicate "+twice[0]+" header: "), "%s twice: %q", twice[0], body)
		}
	}

	// A request built in code has no raw head: checked through fasthttp.
	h := New(&recorder{got: make(chan string, 1)}, nil, Options{})
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/auth")
	ctx.Request.Header.Set("X-Original-URI", "/x")
	ctx.Request.Header.Add("X-Real-IP", "192.0.2.1")
	ctx.Request.Header.Add("X-Real-IP", "192.0.2.2")
	h.Serve(&ctx)
	equal(t, 400, ctx.Response.StatusCode(), "X-Real-IP twice, built in code: %q", ctx.Response.Body())
}

// TestTrailerIsRefused: fasthttp reads a chunked body's trailer fields
// and its Peek falls back to them, so a client reaching /auth could name
// itself (or a rule's header) after the body, where no proxy rewrites
// it. A request with a trailer is a 400 whatever the trailer says; a body
// without one is not refused.
func TestTrailerIsRefused(t *testing.T) {
	byKey := rule("per-key", 1, time.Minute, limits.KeyHeader)
	byKey.Key[0].Header = "X-Api-Key"
	l, _ := newLimiter(t, rule("per-user", 1, time.Minute, limits.KeyUser), byKey)
	ts := serve(t, New(pinnedClock{l: l, now: pinnedNow()}, l, Options{}))
	head := "POST /auth HTTP/1.1\r\nHost: x\r\nX-Real-IP: 192.0.2.1\r\n"
	chunked := func(headers, trailer string) (int, string) {
		return ts.raw(t, head+headers+"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n1\r\na\r\n0\r\n"+trailer+"\r\n")
	}
	want := "trailer fields on /auth: rategate reads a client's identity from the request head only" +
		" (send no body: proxy_pass_request_body off)\n"
	for _, tc := range []struct{ headers, trailer string }{
		{"", "X-Original-URI: /x\r\n"},
		{"X-Original-URI: /x\r\n", "X-User-Id: u2\r\n"},
		{"X-Original-URI: /x\r\nX-User-Id: u\r\n", "X-User-Id: u2\r\n"},
		{"X-Original-URI: /x\r\n", "X-Api-Key: k2\r\n"},
		{"X-Original-URI: /x\r\nTrailer: X-Other\r\n", "X-Other: 1\r\n"},
	} {
		status, body := chunked(tc.headers, tc.trailer)
		equal(t, 400, status, "trailer %q after %q: %q", tc.trailer, tc.headers, body)
		equal(t, want, body, "trailer %q", tc.trailer)
	}
	// An empty chunked body ("0") before the trailer: fasthttp sets the
	// ContentLength to 0 first; still refused.
	for _, who := range []string{"u", "u2"} {
		status, body := ts.raw(t, head+"X-Original-URI: /x\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n0\r\nX-User-Id: "+who+"\r\n\r\n")
		equal(t, 400, status, "an empty chunked body, trailer X-User-Id: %s: %q", who, body)
	}
	// A Trailer header that only declares names (no chunked body: nothing
	// can follow) is a header like any other. NGINX passes a client's on,
	// and Go's HTTP client sends one for a request with Trailer set.
	status, body := ts.raw(t, head+"X-Original-URI: /x\r\nX-User-Id: v\r\nTrailer: X-User-Id, X-Other\r\nConnection: close\r\n\r\n")
	equal(t, 204, status, "Trailer declared on a request without a body: %q", body)
	// Without a trailer a body changes nothing: u's one request, then 429.
	status, body = chunked("X-Original-URI: /x\r\nX-User-Id: u\r\nX-Api-Key: k\r\n", "")
	equal(t, 204, status, "a chunked body without a trailer: %q", body)
	status, _ = ts.raw(t, head+"X-Original-URI: /x\r\nX-User-Id: u\r\nX-Api-Key: k3\r\nContent-Length: 1\r\nConnection: close\r\n\r\na")
	equal(t, 429, status, "u's second request, with a body")
}

// TestPathParametersStripped: with path parameters stripped, a target a
// Tomcat-like application serves as /admin is counted as /admin, under a
// match.path prefix and by a rule keyed on the route, and one NGINX routes
// under /admin stays under it ("/admin/..;/x"); kept (the default), NGINX's
// own reading stands.
func TestPathParametersStripped(t *testing.T) {
	admin := rule("admin-per-ip", 1, time.Minute, limits.KeyIP)
	admin.Match.PathPrefix = "/admin"
	perRoute := rule("per-route", 2, time.Minute, limits.KeyRoute)
	ts := pinned(t, Options{PathParams: limits.StripPathParams}, admin, perRoute)
	equal(t, 204, ts.auth(t, "X-Original-URI", "/admin", "X-Real-IP", "192.0.2.1").status)
	for _, uri := range []string{"/;x/admin", "/x/..;/admin", "/admin;jsessionid=9", "/static/..;/admin/users",
		"/%3Bx/admin", "/x/..%3b/admin", "/admin/..;/x"} {
		r := ts.auth(t, "X-Original-URI", uri, "X-Real-IP", "192.0.2.1")
		equal(t, 429, r.status, "%s after /admin", uri)
		equal(t, "admin-per-ip", r.headers["x-ratelimit-rule"], "%s", uri)
	}
	equal(t, 204, ts.auth(t, "X-Original-URI", "/login;a", "X-Real-IP", "192.0.2.2").status)
	r := ts.auth(t, "X-Original-URI", "/x/..;/login;b", "X-Real-IP", "192.0.2.3")
	equal(t, 204, r.status)
	equal(t, "0", r.headers["x-ratelimit-remaining"], "/login's second request")
	equal(t, 429, ts.auth(t, "X-Original-URI", "/login", "X-Real-IP", "192.0.2.4").status, "/login's third request")

	// An escaped '/' inside a parameter: Tomcat ends the parameter at the
	// next literal '/' ("/admin"), NGINX's decoded path at the %2F
	// ("/public"): refused, as no spelling can be counted for both.
	for _, uri := range []string{"/admin;x%2F..%2Fpublic", "/admin;%2F..%2Fz1", "/admin/users;a%2F..%2F..%2Fq", "/a%3Bx%2f../b"} {
		r := ts.auth(t, "X-Original-URI", uri, "X-Real-IP", "192.0.2.9")
		equal(t, 400, r.status, "%s", uri)
		check(t, strings.HasPrefix(r.body, "a path parameter holds an escaped '/'"), "%s: %q", uri, r.body)
	}

	kept := pinned(t, Options{}, admin, perRoute)
	equal(t, 204, kept.auth(t, "X-Original-URI", "/admin", "X-Real-IP", "192.0.2.1").status)
	equal(t, 204, kept.auth(t, "X-Original-URI", "/;x/admin", "X-Real-IP", "192.0.2.1").status, "kept: /;x/admin is not /admin")
}

// TestHasParams: the check that skips NGINX's route for requests with no
// ';' in any spelling never skips one that has it.
func TestHasParams(t *testing.T) {
	for uri, want := range map[string]bool{
		"/a;b": true, "/a%3Bb": true, "/a%3bb": true, "/%25%3Bx": true, "/a?x=%3B": true,
		"/a": false, "/a%3": false, "/a%3C": false, "%": false, "/%2F%3": false,
	} {
		if got := hasParams([]byte(uri)); got != want {
			t.Errorf("hasParams(%q) = %v, want %v", uri, got, want)
		}
	}
}

// TestHeadCountsAsGet: a rule on GET keyed on the method counts HEAD
// under GET: one quota, not two.
func TestHeadCountsAsGet(t *testing.T) {
	r := rule("per-method", 1, time.Minute, limits.KeyIP, limits.KeyMethod)
	r.Match.Methods = []string{"GET", "HEAD"} // config's methods: [GET]
	ts := pinned(t, Options{}, r)
	equal(t, 204, ts.auth(t, std("192.0.2.1", "X-Original-Method", "GET")...).status)
	equal(t, 429, ts.auth(t, std("192.0.2.1", "X-Original-Method", "HEAD")...).status, "HEAD after GET spent the quota")
	equal(t, 204, ts.auth(t, std("192.0.2.2", "X-Original-Method", "HEAD")...).status)
	equal(t, 429, ts.auth(t, std("192.0.2.2", "X-Original-Method", "GET")...).status, "GET after HEAD spent the quota")
}

// TestDuplicateRuleHeader: a header a rule reads (a header key dimension,
// a header match) sent twice is refused with 400: NGINX passes every copy
// to the application, which may take another than the one a rule counted
// (one random copy per request would be a fresh quota each time). Headers
// no rule reads may repeat, and a reload moves what is refused.
func TestDuplicateRuleHeader(t *testing.T) {
	byKey := rule("per-key", 2, time.Minute, limits.KeyHeader)
	byKey.Key[0].Header = "X-Api-Key"
	free := rule("free-plan", 5, time.Minute, limits.KeyIP)
	free.Match.Headers = []limits.HeaderMatch{{Name: "X-Plan", Value: []byte("free")}}
	l, _ := newLimiter(t, byKey, free)
	ts := serve(t, New(pinnedClock{l: l, now: pinnedNow()}, l, Options{}))
	send := func(lines ...string) reply {
		t.Helper()
		status, body := ts.raw(t, "GET /auth HTTP/1.1\r\nHost: x\r\nX-Original-URI: /\r\nX-Real-IP: 192.0.2.1\r\n"+
			strings.Join(lines, "")+"Connection: close\r\n\r\n")
		return reply{status: status, body: body, headers: map[string]string{}}
	}
	dup := func(name string) reply {
		return reply{status: 400, body: "duplicate " + name + " header: a header the rate-limit rules read must be sent once\n", headers: map[string]string{}}
	}
	equal(t, 204, send("X-Api-Key: K\r\n").status)
	equal(t, 204, send("X-Api-Key: K\r\n").status)
	equal(t, 429, send("X-Api-Key: K\r\n").status, "K is over its limit")
	for i := range 3 {
		r := send("X-Api-Key: fresh"+strconv.Itoa(i)+"\r\n", "X-Api-Key: K\r\n")
		equal(t, dup("X-Api-Key"), r, "a fresh key before K")
		r = send("X-Api-Key: K\r\n", "x-api-key: fresh"+strconv.Itoa(i)+"\r\n")
		equal(t, dup("X-Api-Key"), r, "K, then a fresh key in another case")
	}
	equal(t, dup("X-Plan"), send("X-Api-Key: a\r\n", "X-Plan: pro\r\n", "X-Plan: free\r\n"), "a match header twice")
	equal(t, 204, send("X-Api-Key: b\r\n", "X-Other: 1\r\n", "X-Other: 2\r\n").status, "a header no rule reads may repeat")

	l.SetRules([]*limits.Rule{rule("per-ip", 5, time.Minute, limits.KeyIP)})
	equal(t, 204, send("X-Api-Key: K\r\n", "X-Api-Key: K2\r\n").status, "after a reload no rule reads X-Api-Key")

	// fasthttp keeps one value (the last) of User-Agent and Content-Type,
	// so their repeats are found in the raw header lines.
	byAgent := rule("per-agent", 2, time.Minute, limits.KeyHeader)
	byAgent.Key[0].Header = "User-Agent"
	json := rule("json", 5, time.Minute, limits.KeyIP)
	json.Match.Headers = []limits.HeaderMatch{{Name: "Content-Type", Value: []byte("application/json")}}
	l.SetRules([]*limits.Rule{byAgent, json})
	equal(t, 204, send("User-Agent: BadBot\r\n").status)
	equal(t, dup("User-Agent"), send("User-Agent: BadBot\r\n", "user-agent: fresh\r\n"), "a fresh User-Agent after the counted one")
	equal(t, dup("Content-Type"), send("User-Agent: b\r\n", "Content-Type: application/json\r\n", "Content-Type: text/plain\r\n"), "Content-Type twice")
	equal(t, 204, send("User-Agent: c\r\n", "Content-Type: application/json\r\n").status, "each once")

	// The Lua variant passes one copy of some repeated headers and names
	// them in X-Rategate-Repeated.
	equal(t, dup("User-Agent"), send("User-Agent: d\r\n", "X-Rategate-Repeated: accept, USER-AGENT\r\n"), "User-Agent named repeated")
	equal(t, dup("Content-Type"), send("User-Agent: e\r\n", "Content-Type: application/json\r\n", "X-Rategate-Repeated: content-type\r\n"),
		"Content-Type named repeated")
	equal(t, 204, send("User-Agent: f\r\n", "X-Rategate-Repeated: accept,user-agents, agent\r\n").status, "only other headers named")
}

// TestEscapedUsersDoNotShareCounters: user names that differ only in bytes
// the key escapes, or that spell another user's escaped form, count apart.
func TestEscapedUsersDoNotShareCounters(t *testing.T) {
	ts := pinned(t, Options{}, rule("per-user", 1, time.Minute, limits.KeyUser))
	pairs := [][2]string{
		{"a|b", "a%7Cb"},
		{"{x}", "%7Bx%7D"},
		{"a b", "a%20b"},
		{"a:b", "a%3Ab"},
		{"=192.0.2.1", ""}, // the second is anonymous from 192.0.2.1
		{"\xff", "%FF"},
		{"a}:{b", "a%7D:%7Bb"},
		{strings.Repeat("x", 300) + "1", strings.Repeat("x", 300) + "2"}, // hashed keys
	}
	for _, p := range pairs {
		for _, user := range p {
			kv := "GET /auth HTTP/1.1\r\nHost: x\r\nX-Original-URI: /\r\nX-Real-IP: 192.0.2.1\r\n"
			if user != "" {
				kv += "X-User-Id: " + user + "\r\n"
			}
			kv += "Connection: close\r\n\r\n"
			status, _ := ts.raw(t, kv)
			equal(t, 204, status, "first request of %q (pair %q)", user, p)
			status, _ = ts.raw(t, kv)
			equal(t, 429, status, "second request of %q", user)
		}
	}
}

// TestRouteSpellingsShareACounter: a route-keyed limit cannot be dodged by
// spelling the path another way.
func TestRouteSpellingsShareACounter(t *testing.T) {
	admin := rule("admin", 1, time.Minute, limits.KeyRoute)
	admin.Match.PathPrefix = "/admin"
	ts := pinned(t, Options{}, admin)
	equal(t, 204, ts.auth(t, "X-Original-URI", "/admin", "X-Real-IP", "192.0.2.1").status)
	for _, uri := range []string{"/a/../admin", "//admin", "/%2e%2e/admin", "/%61dmin", "/admin?x=1", "/./admin#f", "http://h/admin",
		// NGINX decodes %2F and routes these to /admin too.
		"/%2Fadmin", "/%2fadmin", "/x/..%2Fadmin", "/x%2F..%2Fadmin", "http://h/%2Fadmin"} {
		equal(t, 429, ts.auth(t, "X-Original-URI", uri, "X-Real-IP", "192.0.2.1").status, "%s", uri)
	}
	// NGINX routes these elsewhere: "%252F" is a literal "%2F", and case,
	// ';' and a trailing dot are part of the path.
	for _, uri := range []string{"/%252Fadmin", "/ADMIN", "/x/admin"} {
		equal(t, reply{status: 204, headers: map[string]string{}}, ts.auth(t, "X-Original-URI", uri, "X-Real-IP", "192.0.2.1"), "%s", uri)
	}
	for _, uri := range []string{"/admin;x", "/admin.", "/admin/"} {
		r := ts.auth(t, "X-Original-URI", uri, "X-Real-IP", "192.0.2.1")
		equal(t, 204, r.status, "%s", uri)
		equal(t, "0", r.headers["x-ratelimit-remaining"], "%s: a route of its own", uri)
	}
}

func TestCannedDecisions(t *testing.T) {
	r := &limits.Rule{Name: `we"ird\`, Limit: 7, Period: 1500 * time.Millisecond, Burst: 9}
	tests := []struct {
		name string
		d    canned
		want reply
	}{
		{"sub-second retry rounds up to 1; 1500ms is stated as 2 periods", canned{Admitted: false, Denier: 0, Verdicts: []limits.Verdict{
			{Rule: r, Cost: 1, Result: limits.Result{Remaining: -3, ResetUS: 1, RetryUS: 1}},
		}}, reply{status: 429, body: "", headers: map[string]string{
			"ratelimit-policy":      `"we\"ird\\";q=14;w=3`,
			"ratelimit":             `"we\"ird\\";r=0;t=1`,
			"x-ratelimit-limit":     "7",
			"x-ratelimit-remaining": "0",
			"x-ratelimit-reset":     "1",
			"retry-after":           "1",
			"x-ratelimit-rule":      `we"ird\`,
		}}},
		{"zero retry still says 1", canned{Admitted: false, Denier: 0, Verdicts: []limits.Verdict{
			{Rule: r, Cost: 1, Result: limits.Result{RetryUS: 0}},
		}}, reply{status: 429, body: "", headers: map[string]string{
			"ratelimit-policy":      `"we\"ird\\";q=14;w=3`,
			"ratelimit":             `"we\"ird\\";r=0;t=0`,
			"x-ratelimit-limit":     "7",
			"x-ratelimit-remaining": "0",
			"x-ratelimit-reset":     "0",
			"retry-after":           "1",
			"x-ratelimit-rule":      `we"ird\`,
		}}},
		{"denied without a denier", canned{Admitted: false, Denier: -1}, reply{status: 429, body: "", headers: map[string]string{}}},
		{"reset rounds up", canned{Admitted: true, Denier: -1, Verdicts: []limits.Verdict{
			{Rule: r, Cost: 1, Result: limits.Result{Allowed: true, Remaining: 6, ResetUS: 41_000_001}},
		}}, reply{status: 204, headers: map[string]string{
			"ratelimit-policy":      `"we\"ird\\";q=14;w=3`,
			"ratelimit":             `"we\"ird\\";r=6;t=42`,
			"x-ratelimit-limit":     "7",
			"x-ratelimit-remaining": "6",
			"x-ratelimit-reset":     "42",
		}}},
	}
	for _, tt := range tests {
		ts := serve(t, New(&tt.d, nil, Options{}))
		equal(t, tt.want, ts.auth(t, std("192.0.2.1")...), tt.name)
	}
}
