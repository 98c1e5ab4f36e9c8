//go:build e2e

package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/procs"
	"github.com/rategate/rategate/internal/testredis"
)

// variant is one shipped NGINX setup.
type variant struct {
	conf       string // the config file in nginx/
	denyStatus int    // rategate's deny_status for it
	lua        bool
}

// TestAuthRequest runs nginx/nginx.conf: plain NGINX, auth_request, rategate
// answering 429.
func TestAuthRequest(t *testing.T) {
	runGateway(t, variant{conf: "nginx.conf", denyStatus: 429})
}

// TestAuthRequestQuiet runs nginx/nginx-quiet.conf: rategate answers 403,
// NGINX maps it to 429 without an error-log line.
func TestAuthRequestQuiet(t *testing.T) {
	runGateway(t, variant{conf: "nginx-quiet.conf", denyStatus: 403})
}

// TestOpenResty runs nginx/openresty.conf (access_by_lua) on Debian's
// nginx with libnginx-mod-http-lua.
func TestOpenResty(t *testing.T) {
	runGateway(t, variant{conf: "openresty.conf", denyStatus: 429, lua: true})
}

// stack is everything one variant runs: redis, two rategates sharing it,
// the app, and nginx failing open and failing closed in front of them.
type stack struct {
	dir          string
	redis        *testredis.Server
	app          *app
	rg           [2]*rategate
	open, closed *nginxServer
}

func startStack(t *testing.T, v variant) *stack {
	t.Helper()
	needBinary(t, "curl", "curl")
	needBinary(t, "nginx", "nginx")
	needBinary(t, "redis-server", "redis-server")
	if v.lua {
		needLuaModule(t)
	}
	s := &stack{dir: filepath.Join(workDir, safeName(t.Name()))}
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s.redis = testredis.Start(t)
	cfg := writeRategateConfig(t, s.dir, v.denyStatus)
	redisURL := "redis://" + s.redis.Addr + "/0"
	for i := range s.rg {
		s.rg[i] = newRategate(t, fmt.Sprintf("rategate%d", i+1), s.dir, cfg, redisURL)
		s.rg[i].start(t)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, r := range s.rg {
				t.Logf("%s log:\n%s", r.name, procs.FileTail(filepath.Join(s.dir, r.name+".log"), 15))
			}
		}
	})
	s.app = startApp(t)
	rw := rewrite{rategates: []string{s.rg[0].addr(), s.rg[1].addr()}, app: s.app.addr}
	s.open = startNginx(t, "open", v.conf, rw)
	rw.closed = true
	s.closed = startNginx(t, "closed", v.conf, rw)
	return s
}

// runGateway is the suite every variant must pass, as a timeline: each step
// builds on the counters the earlier ones left in Redis.
func runGateway(t *testing.T, v variant) {
	s := startStack(t, v)
	nx := s.open
	needWindow(t, window, 90*time.Second)

	t.Run("allowed request reaches the app with rate-limit headers", func(t *testing.T) {
		r := nx.do(t, userReq("/user/profile?tab=1", "alice"))
		wantStatus(t, r, 200)
		e := echo(t, r)
		if e.XUserID != "alice" || e.XRealIP != "127.0.0.1" || e.URI != "/user/profile?tab=1" {
			t.Errorf("the app saw X-User-Id %q, X-Real-IP %q, URI %q; want alice, 127.0.0.1, /user/profile?tab=1", e.XUserID, e.XRealIP, e.URI)
		}
		wantHeader(t, r, "RateLimit-Policy", `"per-user";q=10;w=86400`)
		wantHeaderPrefix(t, r, "RateLimit", `"per-user";r=9;t=`)
		wantHeader(t, r, "X-RateLimit-Limit", "10")
		wantHeader(t, r, "X-RateLimit-Remaining", "9")
		wantWindowSeconds(t, r, "X-RateLimit-Reset")
		wantNoHeader(t, r, "Retry-After")
		wantNoHeader(t, r, "X-RateLimit-Rule")
	})

	t.Run("a path no rule matches has no rate-limit headers", func(t *testing.T) {
		r := nx.do(t, userReq("/free/page", "alice"))
		wantStatus(t, r, 200)
		for _, h := range []string{"RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "Retry-After"} {
			wantNoHeader(t, r, h)
		}
	})

	// fleet is the user the next step exhausts; later steps build on it.
	fleet := ""
	t.Run("30 requests across both rategate instances admit exactly 10", func(t *testing.T) {
		// A response rategate could not decide (its Redis call missed the
		// deadline on a busy machine: X-RateLimit-Status: unavailable, or
		// NGINX timed out) says nothing about the count: try again with a
		// fresh user, at most three times.
		for attempt := 1; ; attempt++ {
			user := fmt.Sprintf("fleet%d", attempt)
			rs := nx.doMany(t, repeat(userReq("/user/feed", user), 30), 6)
			allowed, denied, undecided := 0, 0, 0
			for _, r := range rs {
				switch {
				case !r.decided():
					undecided++
					t.Logf("not decided by rategate: %v", r)
				case r.Status == 200:
					allowed++
				case r.Status == 429:
					denied++
				default:
					t.Errorf("unexpected response: %v", r)
				}
			}
			if undecided > 0 && attempt < 3 {
				t.Logf("attempt %d: %d of 30 responses not decided (a busy machine); again with a fresh user", attempt, undecided)
				continue
			}
			if allowed != 10 || denied != 20 {
				t.Errorf("allowed %d, denied %d, not decided %d; want 10, 20 and 0", allowed, denied, undecided)
			}
			if got := s.app.hitsOf(user); got != 10 {
				t.Errorf("the app received %d requests of user %s, want 10", got, user)
			}
			fleet = user
			return
		}
	})

	t.Run("over the limit: 429 with Retry-After, rate-limit headers and a short body", func(t *testing.T) {
		r := nx.do(t, userReq("/user/feed", fleet))
		wantStatus(t, r, 429)
		wantWindowSeconds(t, r, "Retry-After")
		wantHeader(t, r, "X-RateLimit-Rule", "per-user")
		wantHeader(t, r, "X-RateLimit-Limit", "10")
		wantHeader(t, r, "X-RateLimit-Remaining", "0")
		wantWindowSeconds(t, r, "X-RateLimit-Reset")
		wantHeader(t, r, "RateLimit-Policy", `"per-user";q=10;w=86400`)
		wantHeaderPrefix(t, r, "RateLimit", `"per-user";r=0;t=`)
		wantHeaderPrefix(t, r, "Content-Type", "text/plain")
		if len(r.Body) > 200 || !strings.Contains(r.Body, "Too Many Requests") || !strings.Contains(r.Body, "per-user") {
			t.Errorf("body %q: want one short line saying Too Many Requests and the rule", r.Body)
		}
		if got := s.app.hitsOf(fleet); got != 10 {
			t.Errorf("the app received %d requests of user %s, want still 10", got, fleet)
		}
		// (a denial keeps the client's connection, below, sends several on one)
		wantHeader(t, r, "Connection", "keep-alive")
	})

	t.Run("users are counted apart", func(t *testing.T) {
		r := nx.do(t, userReq("/user/feed", "bob"))
		wantStatus(t, r, 200)
		wantHeader(t, r, "X-RateLimit-Remaining", "9")
	})

	t.Run("a client-sent X-User-Id does not change the user", func(t *testing.T) {
		// fleet is exhausted; claiming another user id does not help.
		r := nx.do(t, userReq("/user/feed", fleet, "X-User-Id: carol"))
		wantStatus(t, r, 429)
		// Without the (demo) auth layer's X-User the request is anonymous,
		// counted by IP: not as fleet, whatever X-User-Id the client sends.
		r = nx.do(t, request{Path: "/user/feed", From: "127.0.0.9", Header: []string{"X-User-Id: " + fleet}})
		wantStatus(t, r, 200)
		wantHeader(t, r, "X-RateLimit-Remaining", "9")
		if e := echo(t, r); e.HasXUserID {
			t.Errorf("the app received the client's X-User-Id %q: NGINX must remove it", e.XUserID)
		}
	})

	t.Run("per IP: X-Real-IP is the client address, spoofing does not help", func(t *testing.T) {
		for i := 1; i <= 5; i++ {
			r := nx.do(t, request{Path: "/ip/search", From: "127.0.0.2"})
			wantStatus(t, r, 200)
			wantHeader(t, r, "X-RateLimit-Remaining", strconv.Itoa(5-i))
		}
		for _, spoof := range [][]string{
			{"X-Real-IP: 203.0.113.9"},
			{"X-Forwarded-For: 203.0.113.9"},
			{"X-Real-IP: 203.0.113.9", "X-Forwarded-For: 203.0.113.9, 198.51.100.1"},
		} {
			r := nx.do(t, request{Path: "/ip/search", From: "127.0.0.2", Header: spoof})
			if r.Status != 429 {
				t.Errorf("127.0.0.2 over its limit sending %v: got %v, want 429", spoof, r)
			}
		}
		// Another client claiming to be the exhausted address is itself.
		r := nx.do(t, request{Path: "/ip/search", From: "127.0.0.3", Header: []string{"X-Real-IP: 127.0.0.2", "X-Forwarded-For: 127.0.0.2"}})
		wantStatus(t, r, 200)
		wantHeader(t, r, "X-RateLimit-Remaining", "4")
		if e := echo(t, r); e.XRealIP != "127.0.0.3" || !strings.HasSuffix(e.XForwardedFor, "127.0.0.3") {
			t.Errorf("the app saw X-Real-IP %q, X-Forwarded-For %q; want 127.0.0.3 and a list ending in it", e.XRealIP, e.XForwardedFor)
		}
	})

	t.Run("rategate sees the original method and URI", func(t *testing.T) {
		post := request{Method: "POST", Path: "/post/comment", Header: []string{"X-User: poster"}, Body: []byte("hi")}
		for i := 0; i < 2; i++ {
			wantStatus(t, nx.do(t, post), 200)
		}
		wantStatus(t, nx.do(t, post), 429)
		// The rule is for POST only.
		r := nx.do(t, userReq("/post/comment", "poster"))
		wantStatus(t, r, 200)
		wantNoHeader(t, r, "X-RateLimit-Limit")
		// The route is normalized from the raw URI: the same rule, the same counter.
		post.Path = "/x/../post//comment?page=2"
		wantStatus(t, nx.do(t, post), 429)
	})

	t.Run("request bodies are not sent to rategate", func(t *testing.T) {
		body := []byte(strings.Repeat("b", 6000)) // over rategate's 4 KiB request limit
		for _, chunked := range []bool{false, true} {
			r := nx.do(t, request{Method: "POST", Path: "/user/upload", Header: []string{"X-User: uploader"}, Body: body, Chunked: chunked})
			wantStatus(t, r, 200)
			if !r.decided() {
				t.Errorf("chunked=%v: not decided by rategate: %v", chunked, r)
			}
			if e := echo(t, r); e.BodyBytes != int64(len(body)) {
				t.Errorf("chunked=%v: the app received %d body bytes, want %d", chunked, e.BodyBytes, len(body))
			}
		}
	})

	t.Run("application errors pass through unchanged", func(t *testing.T) {
		r := nx.do(t, userReq("/user/boom", "boomer"))
		wantStatus(t, r, 500)
		if !strings.Contains(r.Body, "app error") {
			t.Errorf("body %q: want the application's own", r.Body)
		}
		wantHeader(t, r, "X-RateLimit-Remaining", "9")
	})

	t.Run("error log after 100 denials", func(t *testing.T) {
		before := nx.errorLogSize(t)
		rs := nx.doMany(t, repeat(userReq("/user/feed", fleet), 100), 4)
		denied := 0
		for _, r := range rs {
			switch {
			case r.Status == 429:
				denied++
			case !r.decided():
				// rategate's store missed its deadline (busy machine).
				t.Logf("not decided by rategate: %v", r)
			default:
				t.Fatalf("want a denial, got %v", r)
			}
		}
		if denied < 90 {
			t.Fatalf("only %d of 100 requests were decided", denied)
		}
		// auth_request logs "auth request unexpected status: 429" for a
		// subrequest status it does not pass on; rategate-subrequest.conf
		// hands rategate's 429 on as a 403, so no variant logs a denial.
		if added := nx.errorLogSince(t, before); added != "" {
			t.Errorf("the error log gained lines during 100 denials, want none:\n%s", firstLines(added, 5))
		}
	})

	t.Run("a denial keeps the client's connection", func(t *testing.T) {
		// auth_request turns a subrequest status it does not pass on into
		// a 500, and NGINX closes the connection after a 500: every denied
		// request would cost the client (an attacker as much as anyone) a
		// new connection, and NGINX its handshake.
		conn, err := net.DialTimeout("tcp", strings.TrimPrefix(nx.base(), "http://"), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		br := bufio.NewReader(conn)
		for i := 0; i < 3; i++ {
			_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
			if _, err := fmt.Fprintf(conn, "GET /user/feed HTTP/1.1\r\nHost: gw\r\nX-User: %s\r\n\r\n", fleet); err != nil {
				t.Fatalf("request %d on the same connection: %v", i+1, err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("response %d on the same connection: %v", i+1, err)
			}
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" {
				t.Fatalf("response %d: %d (Retry-After %q), want 429 with Retry-After", i+1, resp.StatusCode, resp.Header.Get("Retry-After"))
			}
			if resp.Close {
				t.Fatalf("response %d: the 429 closes the connection (Connection: %q)", i+1, resp.Header.Get("Connection"))
			}
		}
	})

	t.Run("the limit holds whichever instance decides", func(t *testing.T) {
		user := userReq("/user/feed", "relay")
		s.rg[1].stop()
		for i := 1; i <= 6; i++ {
			r := nx.do(t, user)
			wantStatus(t, r, 200)
			wantHeader(t, r, "X-RateLimit-Remaining", strconv.Itoa(10-i))
		}
		s.rg[1].start(t)
		awaitRetry(t)
		s.rg[0].stop()
		var got []int
		for i := 0; i < 6; i++ {
			r := nx.do(t, user)
			if !r.decided() {
				t.Errorf("not decided with rategate2 up: %v", r)
			}
			got = append(got, r.Status)
		}
		if want := []int{200, 200, 200, 200, 429, 429}; fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("rategate2 alone after rategate1 counted 6: statuses %v, want %v", got, want)
		}
		s.rg[0].start(t)
		awaitRetry(t)
	})

	t.Run("both rategates down: open lets traffic through, closed answers 503", func(t *testing.T) {
		s.rg[0].stop()
		s.rg[1].stop()
		before := s.app.hitsOf(fleet)
		for i := 0; i < 3; i++ {
			r := s.open.do(t, userReq("/user/feed", fleet))
			wantStatus(t, r, 200)
			wantNoHeader(t, r, "X-RateLimit-Limit")
			wantFast(t, r)
		}
		if got := s.app.hitsOf(fleet) - before; got != 3 {
			t.Errorf("fail-open: the app received %d requests, want 3", got)
		}
		for i := 0; i < 3; i++ {
			r := s.closed.do(t, userReq("/user/feed", fleet))
			wantStatus(t, r, 503)
			if len(r.Body) > 200 {
				t.Errorf("503 body too long: %q", r.Body)
			}
			wantFast(t, r)
		}
		if got := s.app.hitsOf(fleet) - before; got != 3 {
			t.Errorf("fail-closed let %d requests reach the app", got-3)
		}
	})

	t.Run("rategates back: limits enforced again", func(t *testing.T) {
		s.rg[0].start(t)
		s.rg[1].start(t)
		awaitRetry(t)
		for _, n := range []*nginxServer{s.open, s.closed} {
			// Several requests, so that every NGINX worker is asked.
			for i := 0; i < 4; i++ {
				r := n.do(t, userReq("/user/feed", fleet))
				wantStatus(t, r, 429)
				wantHeader(t, r, "X-RateLimit-Rule", "per-user")
			}
			r := n.do(t, userReq("/user/feed", "newcomer-"+n.name))
			wantStatus(t, r, 200)
			wantHeader(t, r, "X-RateLimit-Remaining", "9")
		}
	})

	t.Run("the subrequest: identity headers set by NGINX, no body, HTTP/1.1", func(t *testing.T) {
		fake := startFakeRategate(t)
		n := startNginx(t, "fake", v.conf, rewrite{rategates: []string{fake.addr}, app: s.app.addr})
		r := n.do(t, request{
			Method: "POST", Path: "/user/check?q=1", From: "127.0.0.6", Body: []byte("payload"),
			Header: []string{"X-User: carol", "X-User-Id: mallory", "X-Real-IP: 203.0.113.9",
				"X-Forwarded-For: 203.0.113.9", "X-Original-URI: /spoofed", "X-Original-Method: GET",
				"X-RateLimit-Cost: 1000", "Cookie: session=" + strings.Repeat("s", 4000)},
		})
		wantStatus(t, r, 200)
		got := fake.last(t)
		want := map[string]string{
			"X-Original-Uri":    "/user/check?q=1",
			"X-Original-Method": "POST",
			"X-Original-Host":   "127.0.0.1",
			"X-Real-Ip":         "127.0.0.6",
			"X-Forwarded-For":   "127.0.0.6",
			"X-User-Id":         "carol",
			"X-Ratelimit-Cost":  "",
			// rategate reads no cookie; a client's (often several KiB)
			// would make the subrequest's head big enough for a crowded
			// rategate to close NGINX's connection after it
			"Cookie":            "",
			"Content-Length":    "",
			"Transfer-Encoding": "",
		}
		for k, w := range want {
			if v := got.Header.Values(k); strings.Join(v, ", ") != w {
				t.Errorf("subrequest header %s: %q, want %q", k, v, w)
			}
		}
		if got.BodyBytes != 0 || got.Proto != "HTTP/1.1" || got.Path != "/auth" {
			t.Errorf("subrequest %s %s with %d body bytes; want HTTP/1.1 /auth with none", got.Proto, got.Path, got.BodyBytes)
		}
	})

	t.Run("rategate's other answers: 400 is a 500, 503 a 503, 403 a 429", func(t *testing.T) {
		fake := startFakeRategate(t)
		n := startNginx(t, "fake", v.conf, rewrite{rategates: []string{fake.addr}, app: s.app.addr})
		before := n.errorLogSize(t)
		r := n.do(t, userReq("/user/bad-request", "dora"))
		wantStatus(t, r, 500)
		if log := n.errorLogSince(t, before); !strings.Contains(log, "400") {
			t.Errorf("a 400 from rategate left no trace in the error log: %q", log)
		}
		// rategate's failure_mode: deny is obeyed even where NGINX fails open.
		lines := len(n.accessLog(t))
		r = n.do(t, userReq("/user/store-down", "dora"))
		wantStatus(t, r, 503)
		wantHeader(t, r, "X-RateLimit-Status", "unavailable")
		if l := n.lastAccess(t, lines+1); l.ratelimit != "store_down" {
			t.Errorf("access log of rategate's store-down 503: %s; want ratelimit=store_down", l.raw)
		}
		// rategate at its connection limit: fasthttp's bare 503, no
		// X-RateLimit-Status. Not decided, and not a store failure: the
		// access log said store_down, sending the operator to Redis.
		lines = len(n.accessLog(t))
		r = n.do(t, userReq("/user/overloaded", "dora"))
		wantStatus(t, r, 503)
		if l := n.lastAccess(t, lines+1); l.ratelimit != "overloaded" {
			t.Errorf("access log of rategate's 503 at its connection limit: %s; want ratelimit=overloaded", l.raw)
		}
		// A denial with deny_status: 403: every variant answers 429.
		r = n.do(t, userReq("/user/deny-403", "dora"))
		wantStatus(t, r, 429)
		wantHeader(t, r, "Retry-After", "7")
		wantHeader(t, r, "X-RateLimit-Rule", "fake")
	})

	t.Run("rategate hangs: NGINX gives up after its timeout", func(t *testing.T) {
		hang := hangListener(t)
		rw := rewrite{rategates: []string{hang}, app: s.app.addr}
		open := startNginx(t, "hang-open", v.conf, rw)
		rw.closed = true
		closed := startNginx(t, "hang-closed", v.conf, rw)
		r := open.do(t, userReq("/user/feed", fleet))
		wantStatus(t, r, 200)
		wantNoHeader(t, r, "X-RateLimit-Limit")
		if r.Elapsed < 200*time.Millisecond || r.Elapsed > 3*time.Second {
			t.Errorf("fail-open after a hang took %v, want about proxy_read_timeout (250ms)", r.Elapsed)
		}
		r = closed.do(t, userReq("/user/feed", fleet))
		wantStatus(t, r, 503)
		if r.Elapsed > 3*time.Second {
			t.Errorf("fail-closed after a hang took %v", r.Elapsed)
		}
	})

	// Last: it stops Redis for good.
	t.Run("Redis down: rategate's failure_mode decides, NGINX passes it on", func(t *testing.T) {
		s.redis.Stop()
		// failure_mode: allow. NGINX's own policy is only for an
		// unreachable rategate, so the fail-closed NGINX lets it through too.
		// Until a rategate's breaker opens, a decision Redis fails is
		// decided by that rategate's local fallback (X-RateLimit-Status:
		// local, with its headers); once it is open, failure_mode answers
		// (unavailable, no rate-limit headers).
		fresh := fmt.Sprintf("fresh-%d", time.Now().UnixNano())
		for _, n := range []*nginxServer{s.open, s.closed} {
			sawUnavailable := false
			for i := 0; i < 20 && !sawUnavailable; i++ {
				r := n.do(t, userReq("/user/feed", fresh))
				wantStatus(t, r, 200)
				wantFast(t, r)
				switch st := r.Header.Get("X-RateLimit-Status"); st {
				case "local":
					wantHeader(t, r, "X-RateLimit-Limit", "10")
				case "unavailable":
					wantNoHeader(t, r, "X-RateLimit-Limit")
					sawUnavailable = true
				default:
					t.Fatalf("X-RateLimit-Status %q with Redis down, want local or unavailable", st)
				}
			}
			if !sawUnavailable {
				t.Errorf("no failure_mode answer after 20 requests with Redis down")
			}
		}
		// The user Redis denied for the rest of the window is still
		// denied: both rategates cached that denial (deny_cache), and no
		// Redis can have given the quota back.
		for _, n := range []*nginxServer{s.open, s.closed} {
			r := n.do(t, userReq("/user/feed", fleet))
			wantStatus(t, r, 429)
			wantHeader(t, r, "X-RateLimit-Rule", "per-user")
			wantWindowSeconds(t, r, "Retry-After")
			wantFast(t, r)
		}
	})
}

// awaitRetry waits until every NGINX worker asks the instances it saw fail
// again: each worker skips a failed instance for fail_timeout, counted in
// whole seconds, so up to fail_timeout + 1s.
func awaitRetry(t *testing.T) {
	time.Sleep(failTimeout(t) + 1500*time.Millisecond)
}

// ---- assertions --------------------------------------------------------------

func wantStatus(t *testing.T, r response, want int) {
	t.Helper()
	if r.Status != want {
		t.Fatalf("status %d, want %d: %v", r.Status, want, r)
	}
}

func wantHeader(t *testing.T, r response, name, want string) {
	t.Helper()
	if got := r.Header.Values(name); len(got) != 1 || got[0] != want {
		t.Errorf("%s: %q, want %q; response %v", name, got, want, r)
	}
}

func wantHeaderPrefix(t *testing.T, r response, name, prefix string) {
	t.Helper()
	if got := r.Header.Values(name); len(got) != 1 || !strings.HasPrefix(got[0], prefix) {
		t.Errorf("%s: %q, want one value starting %q; response %v", name, got, prefix, r)
	}
}

func wantNoHeader(t *testing.T, r response, name string) {
	t.Helper()
	if got := r.Header.Values(name); len(got) != 0 {
		t.Errorf("%s: %q, want none; response %v", name, got, r)
	}
}

// wantWindowSeconds checks that header holds the seconds left in the current
// window (Retry-After, X-RateLimit-Reset), within 2s.
func wantWindowSeconds(t *testing.T, r response, name string) {
	t.Helper()
	v := r.Header.Get(name)
	got, err := strconv.Atoi(v)
	if err != nil {
		t.Errorf("%s: %q, want whole seconds; response %v", name, v, r)
		return
	}
	want := math.Ceil(untilWindowEnd(time.Now(), window).Seconds())
	if math.Abs(float64(got)-want) > 2 {
		t.Errorf("%s: %d, want about %v (the seconds left in the window)", name, got, want)
	}
}

// wantFast checks that NGINX answered without waiting on a timeout: a
// refused connection fails at once.
func wantFast(t *testing.T, r response) {
	t.Helper()
	if r.Elapsed > 2*time.Second {
		t.Errorf("took %v with rategate down, want well under a second", r.Elapsed)
	}
}

// echo decodes the app's answer.
func echo(t *testing.T, r response) appEcho {
	t.Helper()
	var e appEcho
	if err := json.Unmarshal([]byte(r.Body), &e); err != nil {
		t.Fatalf("not the app's answer (%v): %v", err, r)
	}
	return e
}

func firstLines(s string, n int) string {
	lines := strings.SplitN(s, "\n", n+1)
	if len(lines) > n {
		lines = lines[:n]
	}
	return strings.Join(lines, "\n")
}
