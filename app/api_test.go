package app

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/admin"
	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/policy"
	"github.com/rategate/rategate/top"
)

// stack is rategate wired in process by New, exactly as the binary wires
// it, with both handlers on real loopback listeners.
type stack struct {
	t       *testing.T
	app     *App
	rules   *policy.Manager
	limiter *limits.Limiter
	top     *top.Top
	auth    *fasthttp.HostClient
	admin   *fasthttp.HostClient
}

// newStack starts a stack over yaml's rules. redisAddr "" = memory store,
// anything else = a fresh real redis-server.
func newStack(t *testing.T, yaml, redisAddr string) *stack {
	t.Helper()
	cfg, err := config.Parse("test.yaml", []byte(steadyHours(yaml)))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Redis.KeyPrefix = uniquePrefix(t)
	// These tests check counts, not latency: a budget a loaded machine
	// cannot miss (a missed one is decided by the local fallback).
	cfg.Redis.Timeout = 2 * time.Second
	if redisAddr != "" {
		cfg.Redis.URL = "redis://" + testredis.Start(t).Addr + "/0"
	}
	a, err := New(cfg, Options{Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	resetsReady(t, a) // a deny cache is stable from then on (TestCachedDenialListsEveryRule)
	return &stack{t: t, app: a, rules: a.Rules(), limiter: a.Limiter(), top: a.Top(),
		auth: serveOn(t, a.Handler()), admin: serveOn(t, a.AdminHandler())}
}

// uniquePrefix returns a Redis key prefix of its own for a test.
func uniquePrefix(t testing.TB) string {
	return fmt.Sprintf("t%d", time.Now().UnixNano()%1_000_000_000)
}

func serveOn(t *testing.T, h fasthttp.RequestHandler) *fasthttp.HostClient {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &fasthttp.Server{Handler: h}
	go s.Serve(ln)
	t.Cleanup(func() { s.Shutdown() })
	return &fasthttp.HostClient{Addr: ln.Addr().String()}
}

// call does one request and returns status and body.
func call(t *testing.T, c *fasthttp.HostClient, method, uri, body string, kv ...string) (int, string) {
	t.Helper()
	code, answer, err := request(c, method, uri, body, kv...)
	if err != nil {
		t.Fatal(err)
	}
	return code, answer
}

// request is call for any goroutine: a failed request is its error.
func request(c *fasthttp.HostClient, method, uri, body string, kv ...string) (int, string, error) {
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + c.Addr + uri)
	req.Header.SetMethod(method)
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	if body != "" {
		req.SetBodyString(body)
	}
	if err := c.DoTimeout(req, resp, 5*time.Second); err != nil {
		return 0, "", err
	}
	return resp.StatusCode(), string(resp.Body()), nil
}

func (s *stack) ask(kv ...string) int {
	code, _ := call(s.t, s.auth, "GET", "/auth", "", kv...)
	return code
}

func (s *stack) api(method, uri, body string, want int, into any) string {
	s.t.Helper()
	code, out := call(s.t, s.admin, method, uri, body)
	if code != want {
		s.t.Fatalf("%s %s: %d, want %d: %s", method, uri, code, want, out)
	}
	if into != nil {
		if err := json.Unmarshal([]byte(out), into); err != nil {
			s.t.Fatalf("%s %s: %v: %s", method, uri, err, out)
		}
	}
	return out
}

// ruleYAML is one rule of an algorithm keyed on ip, limit 3 per hour.
func ruleYAML(alg limits.Algorithm, shadow bool) string {
	burst := ""
	if alg.UsesBurst() {
		burst = "\n    burst: 3"
	}
	return fmt.Sprintf(`rules:
  - name: r
    key: [ip, header:X-Plan]
    algorithm: %s
    limit: 3
    period: 1h%s
    shadow: %t
`, alg, burst, shadow)
}

// stores runs f against the memory store and a real Redis.
func stores(t *testing.T, f func(t *testing.T, redisAddr string)) {
	t.Run("memory", func(t *testing.T) { t.Parallel(); f(t, "") })
	t.Run("redis", func(t *testing.T) { t.Parallel(); f(t, "redis") })
}

// TestKeysAndTopEveryAlgorithm: on every algorithm and both stores, key
// inspection shows the state without consuming, reset gives the quota back,
// and top lists the identity that was denied.
func TestKeysAndTopEveryAlgorithm(t *testing.T) {
	for _, alg := range limits.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			stores(t, func(t *testing.T, redisAddr string) {
				s := newStack(t, ruleYAML(alg, false), redisAddr)
				hdr := []string{"X-Original-URI", "/a", "X-Real-IP", "192.0.2.7", "X-Plan", "free"}
				for i, want := range []int{204, 204, 204, 429, 429} {
					if got := s.ask(hdr...); got != want {
						t.Fatalf("request %d: %d, want %d", i+1, got, want)
					}
				}
				// Another identity, denied once.
				other := []string{"X-Original-URI", "/a", "X-Real-IP", "192.0.2.8", "X-Plan", "free"}
				for i := 0; i < 4; i++ {
					s.ask(other...)
				}
				uri := "/v1/keys/r?ip=192.0.2.7&header.X-Plan=free"
				var k1, k2 admin.KeyView
				s.api("GET", uri, "", 200, &k1)
				s.api("GET", uri, "", 200, &k2)
				wantKey := fmt.Sprintf("%s:{r:192.0.2.7|free}:%s", s.limiter.Prefix(), alg.Suffix())
				if k1.Key != wantKey || k1.Remaining != 0 || k1.ResetSeconds <= 0 || k1.Raw == nil {
					t.Fatalf("inspect: %+v, want key %s, remaining 0, a reset and a raw value", k1, wantKey)
				}
				wantType := "hash"
				switch info, _ := alg.Info(); {
				case alg == limits.SlidingLog:
					wantType = "zset"
				case info.Record != nil:
					wantType = "string"
					if len(k1.Raw.Record) != len(info.Record) {
						t.Fatalf("raw %+v, want the record's %d numbers", k1.Raw, len(info.Record))
					}
				}
				if k1.Raw.Type != wantType || k1.Raw.TTLMS <= 0 {
					t.Fatalf("raw %+v, want a %s with a TTL", k1.Raw, wantType)
				}
				if fmt.Sprint(k1.Raw.Hash, k1.Raw.ZSet, k1.Raw.Record) != fmt.Sprint(k2.Raw.Hash, k2.Raw.ZSet, k2.Raw.Record) || k2.Remaining != 0 {
					t.Fatalf("inspecting consumed or changed state: %+v then %+v", k1.Raw, k2.Raw)
				}

				// minutes=2: the current minute and the one before, so that
				// denials made just before a minute boundary still count.
				var tv top.TopView
				s.api("GET", "/v1/top?rule=r&minutes=2", "", 200, &tv)
				if tv.Minutes != 2 || len(tv.Rules) != 1 || len(tv.Rules[0].Top) != 2 {
					t.Fatalf("top: %+v", tv)
				}
				first, second := tv.Rules[0].Top[0], tv.Rules[0].Top[1]
				if first.Identity != "192.0.2.7|free" || first.Denied != 2 || second.Identity != "192.0.2.8|free" || second.Denied != 1 {
					t.Fatalf("top: %+v", tv.Rules[0].Top)
				}

				var reset admin.KeyView
				s.api("DELETE", uri, "", 200, &reset)
				if !reset.Reset || reset.Remaining != 3 || reset.Raw == nil || reset.Raw.Type != "none" {
					t.Fatalf("after reset: %+v", reset)
				}
				if got := s.ask(hdr...); got != 204 {
					t.Fatalf("after reset: %d, want 204", got)
				}
				// The other identity is untouched.
				if got := s.ask(other...); got != 429 {
					t.Fatalf("other identity after reset: %d, want 429", got)
				}
			})
		})
	}
}

// TestShadowNeverDenies: a shadow rule on every algorithm never denies,
// counts shadow_limited, and consumes nothing when it would deny.
func TestShadowNeverDenies(t *testing.T) {
	for _, alg := range limits.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			stores(t, func(t *testing.T, redisAddr string) {
				s := newStack(t, ruleYAML(alg, true), redisAddr)
				hdr := []string{"X-Original-URI", "/a", "X-Real-IP", "192.0.2.7", "X-Plan", "p"}
				for i := 0; i < 20; i++ {
					if got := s.ask(hdr...); got != 204 {
						t.Fatalf("request %d under a shadow rule: %d, want 204", i+1, got)
					}
				}
				var k admin.KeyView
				s.api("GET", "/v1/keys/r?ip=192.0.2.7&header.X-Plan=p", "", 200, &k)
				if k.Remaining != 0 {
					t.Fatalf("remaining %d, want 0 (3 consumed, 17 would-deny consumed nothing)", k.Remaining)
				}
				if alg == limits.SlidingLog && len(k.Raw.ZSet) != 3 {
					t.Fatalf("sliding log holds %d entries, want 3: would-deny requests must not be logged", len(k.Raw.ZSet))
				}
				out := s.api("GET", "/metrics", "", 200, nil)
				for _, want := range []string{
					`rategate_decisions_total{rule="r",decision="allowed"} 3`,
					`rategate_decisions_total{rule="r",decision="limited"} 0`,
					`rategate_decisions_total{rule="r",decision="shadow_limited"} 17`,
					`rategate_requests_total{outcome="allowed"} 20`,
				} {
					if !strings.Contains(out, want+"\n") {
						t.Fatalf("/metrics lacks %q", want)
					}
				}
			})
		})
	}
}

// TestOverrideKeepsStateSound: changing a rule's numbers at run time on
// every algorithm and both stores keeps the stored state meaningful: no
// error, remaining within [0, burst]; an identity that used its whole quota
// stays limited when the limit is lowered; a raised limit gives every
// algorithm exactly the extra quota (the used count carries over: a
// bucket's in units, whatever the rate); and a shortened period leaves an
// identity limited no longer than its used units take at the new rate
// (sliding_log: the new period; the windows: the window they were counted
// in).
func TestOverrideKeepsStateSound(t *testing.T) {
	for _, alg := range limits.Algorithms {
		t.Run(string(alg), func(t *testing.T) {
			stores(t, func(t *testing.T, redisAddr string) {
				s := newStack(t, ruleYAML(alg, false), redisAddr)
				hdr := []string{"X-Original-URI", "/a", "X-Real-IP", "192.0.2.9", "X-Plan", "p"}
				for i := 0; i < 3; i++ {
					s.ask(hdr...)
				}
				inspect := func() admin.KeyView {
					t.Helper()
					var k admin.KeyView
					s.api("GET", "/v1/keys/r?ip=192.0.2.9&header.X-Plan=p", "", 200, &k)
					if k.Remaining < 0 || k.Remaining > k.Burst {
						t.Fatalf("remaining %d outside [0, %d]", k.Remaining, k.Burst)
					}
					return k
				}
				// Lower: 3 used of a new 2 → still limited, remaining 0.
				s.api("PUT", "/v1/rules/r/override", `{"limit":2}`, 200, nil)
				if k := inspect(); k.Remaining != 0 || k.Limit != 2 {
					t.Fatalf("after lowering to 2: %+v", k)
				}
				if got := s.ask(hdr...); got != 429 {
					t.Fatalf("after lowering: %d, want 429", got)
				}
				// Raise by factor 2 of the file's 3 → 6.
				s.api("PUT", "/v1/rules/r/override", `{"factor":2}`, 200, nil)
				wantLeft := 3
				if k := inspect(); k.Limit != 6 || k.Remaining != int64(wantLeft) {
					t.Fatalf("after factor 2: limit %d remaining %d, want 6 and %d", k.Limit, k.Remaining, wantLeft)
				}
				allowed := 0
				for i := 0; i < 6; i++ {
					if s.ask(hdr...) == 204 {
						allowed++
					}
				}
				if allowed != wantLeft {
					t.Fatalf("after factor 2: %d more allowed, want exactly %d", allowed, wantLeft)
				}
				// Back to the file's 3.
				s.api("DELETE", "/v1/rules/r/override", "", 200, nil)
				if k := inspect(); k.Remaining != 0 || k.Limit != 3 {
					t.Fatalf("after delete: %+v", k)
				}
				if got := s.ask(hdr...); got != 429 {
					t.Fatalf("after delete: %d, want 429", got)
				}
				// Shorten the period from 1h to 1m: the quota comes back
				// within the new period, not the old hour; but a window
				// count stays in force while the window it was counted in
				// (the hour) lasts, one more minute as sliding_window's prev.
				s.api("PUT", "/v1/rules/r/override", `{"period":"1m"}`, 200, nil)
				bound := int64(60)
				switch alg {
				case limits.FixedWindow:
					bound = 3600
				case limits.SlidingWindow:
					bound = 3660
				case limits.GCRA, limits.TokenBucket:
					bound = 120 // the 6 used, at 20 s each
				}
				if k := inspect(); k.ResetSeconds > bound || k.Remaining != 0 {
					t.Fatalf("after period 1m: full again in %ds, want <= %d, and nothing left: %+v", k.ResetSeconds, bound, k)
				}
			})
		})
	}
}

// TestOverrideAPI: validation names the field, unknown rules are 404,
// GET /v1/rules shows file, override and effective values side by side.
func TestOverrideAPI(t *testing.T) {
	s := newStack(t, `rules:
  - name: g
    key: [ip]
    algorithm: gcra
    limit: 100
    period: 1m
    burst: 50
    cost: 5
  - name: w
    key: [ip]
    algorithm: fixed_window
    limit: 10
    period: 1s
`, "")
	bad := []struct{ rule, body, want string }{
		{"g", `{"limit":0}`, "limit: must be >= 1, got 0"},
		{"g", `{"limit":1.5}`, "limit: must be a whole number, got 1.5"},
		{"g", `{"limit":"ten"}`, `limit: must be a whole number, got "ten"`},
		{"g", `{"period":"fast"}`, `period: "fast" is not a duration`},
		{"g", `{"period":60}`, "period: must be a duration string"},
		{"g", `{"period":"1.5ms"}`, "period: must be a whole number of milliseconds"},
		{"g", `{"burst":2}`, "cost: 5 is more than the burst (2)"},
		{"g", `{"factor":0.01}`, "cost: 5 is more than the burst (1) such a request could never be allowed (after factor 0.01)"},
		{"g", `{"factor":-1}`, "factor: must be > 0"},
		{"g", `{"factor":2000}`, "factor: must be > 0 and <= 1000"},
		{"g", `{"limt":5}`, `limt: unknown field; use limit, period, burst, factor, reason or ttl`},
		{"g", `{}`, "give at least one of limit, period, burst, factor"},
		{"g", `[1]`, "body must be a JSON object"},
		{"g", `{"ttl":"0s","limit":5}`, "ttl: must be >= 1ms"},
		{"g", `{"ttl":"1ns","limit":5}`, "ttl: must be >= 1ms and <= 400d, got 1ns"},
		{"w", `{"burst":5}`, "burst: is only for gcra and token_bucket, not fixed_window"},
		{"w", `{"limit":2000000000}`, "limit: must be <= 1000000000"},
	}
	for _, c := range bad {
		code, out := call(t, s.admin, "PUT", "/v1/rules/"+c.rule+"/override", c.body)
		var e admin.APIError
		_ = json.Unmarshal([]byte(out), &e)
		msg := strings.Join(append(e.Errors, e.Error), "\n")
		if code != 400 || !strings.Contains(strings.ReplaceAll(msg, ":", ""), strings.ReplaceAll(c.want, ":", "")) {
			t.Errorf("PUT %s %s: %d %s, want 400 naming %q", c.rule, c.body, code, out, c.want)
		}
	}
	if code, _ := call(t, s.admin, "PUT", "/v1/rules/nope/override", `{"limit":1}`); code != 404 {
		t.Errorf("unknown rule: %d, want 404", code)
	}
	if code, _ := call(t, s.admin, "GET", "/v1/rules/g/override", ""); code != 405 {
		t.Errorf("GET override: %d, want 405", code)
	}

	var rv policy.RuleView
	s.api("PUT", "/v1/rules/g/override", `{"limit":200,"factor":1.5,"reason":"sale","ttl":"1h"}`, 200, &rv)
	if rv.File.Limit != 100 || rv.File.Burst != 50 || rv.Effective.Limit != 300 || rv.Effective.Burst != 150 ||
		rv.Override == nil || rv.Override.Reason != "sale" || rv.Override.ExpiresAt == nil {
		t.Fatalf("override view: %+v", rv)
	}
	var view policy.RulesView
	s.api("GET", "/v1/rules", "", 200, &view)
	if len(view.Rules) != 2 || view.Rules[0].Effective.Limit != 300 || view.Rules[1].Override != nil || view.OverridesShared {
		t.Fatalf("rules view: %+v", view)
	}
	if got := s.limiter.Rules()[0].Limit; got != 300 {
		t.Fatalf("limiter enforces %d, want 300", got)
	}
	s.api("DELETE", "/v1/rules/g/override", "", 200, &rv)
	if rv.Override != nil || rv.Effective.Limit != 100 || s.limiter.Rules()[0].Limit != 100 {
		t.Fatalf("after delete: %+v", rv)
	}
}

// TestOverrideExpires: an override with a ttl ends by itself.
func TestOverrideExpires(t *testing.T) {
	s := newStack(t, ruleYAML(limits.GCRA, false), "redis")
	s.api("PUT", "/v1/rules/r/override", `{"limit":9,"ttl":"300ms"}`, 200, nil)
	if got := s.limiter.Rules()[0].Limit; got != 9 {
		t.Fatalf("limit %d, want 9", got)
	}
	within(t, 2*time.Second, "override expires", func() error {
		if got := s.limiter.Rules()[0].Limit; got != 3 {
			return fmt.Errorf("limit %d", got)
		}
		return nil
	})
}

// TestKeysBadRequests: every missing or invalid identity part is named.
func TestKeysBadRequests(t *testing.T) {
	s := newStack(t, `identity: {anonymous: skip}
rules:
  - name: multi
    key: [ip, user, route, method, host, header:X-Plan]
    algorithm: fixed_window
    limit: 3
    period: 1m
`, "")
	code, out := call(t, s.admin, "GET", "/v1/keys/multi?ip=nope", "")
	for _, want := range []string{`ip: \"nope\" is not an IP address`, "user: rule", "route:", "method:", "host:", "header.X-Plan:"} {
		if code != 400 || !strings.Contains(out, strings.ReplaceAll(want, `\"`, `"`)) && !strings.Contains(out, want) {
			t.Errorf("want 400 naming %q, got %d %s", want, code, out)
		}
	}
	if code, _ := call(t, s.admin, "GET", "/v1/keys/nope?ip=192.0.2.1", ""); code != 404 {
		t.Errorf("unknown rule: %d, want 404", code)
	}
	// A host with a port or a trailing dot is no host /auth counts, and a
	// value padded with white space no value it counts.
	for _, c := range []struct{ param, value, want string }{
		{"host", "api.example.com:443", `write "api.example.com"`},
		{"host", "api.example.com.", `write "api.example.com"`},
		{"header.x-plan", "gold%C2%A0", "starts or ends with white space"},
		{"header.x-plan", "%E3%80%80gold", "starts or ends with white space"},
		{"user", "al%0Bx", "control byte"},
	} {
		q := map[string]string{"ip": "192.0.2.1", "user": "alice", "route": "/", "method": "get", "host": "h", "header.x-plan": "g"}
		q[c.param] = c.value
		path := "/v1/keys/multi?"
		for _, name := range []string{"ip", "user", "route", "method", "host", "header.x-plan"} {
			path += name + "=" + q[name] + "&"
		}
		code, out := call(t, s.admin, "GET", path, "")
		if code != 400 || !strings.Contains(strings.ReplaceAll(out, `\"`, `"`), c.want) {
			t.Errorf("%s=%s: want 400 naming %q, got %d %s", c.param, c.value, c.want, code, out)
		}
	}
	var k admin.KeyView
	s.api("GET", "/v1/keys/multi?ip=192.0.2.1&user=alice&route=/a/../b&method=get&host=API.example.com&header.x-plan=gold", "", 200, &k)
	if want := s.limiter.Prefix() + ":{multi:192.0.2.1|alice|/b|GET|api.example.com|gold}:fw2"; k.Key != want {
		t.Fatalf("key %q, want %q", k.Key, want)
	}
}

// TestAdminRoutesMatchTheRawPath: an escaped "/" in a rule name is part of
// that one segment. /v1/rules/r1%2F..%2Fr2/override used to be decoded and
// cleaned into /v1/rules/r2/override and changed rule r2.
func TestAdminRoutesMatchTheRawPath(t *testing.T) {
	s := newStack(t, `rules:
  - name: r1
    key: [ip]
    algorithm: fixed_window
    limit: 10
    period: 1m
  - name: r2
    key: [ip]
    algorithm: fixed_window
    limit: 10
    period: 1m
`, "")
	for _, path := range []string{
		"/v1/rules/r1%2F..%2Fr2/override",
		"/v1/rules/r1%2f..%2fr2/override",
		"/v1/rules/%2E%2E%2Fr2/override",
		"/v1/rules/x/../r2/override",
	} {
		// Written on the wire as is: an HTTP client library would clean it.
		c, err := net.Dial("tcp", s.admin.Addr)
		if err != nil {
			t.Fatal(err)
		}
		body := `{"limit":1}`
		fmt.Fprintf(c, "PUT %s HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", path, len(body), body)
		line, _ := bufio.NewReader(c).ReadString('\n')
		c.Close()
		if strings.Contains(line, " 200 ") {
			t.Errorf("PUT %s: %s, want the path refused", path, strings.TrimSpace(line))
		}
	}
	for _, r := range s.limiter.Rules() {
		if r.Limit != 10 {
			t.Errorf("rule %s now has limit %d: an escaped path reached it", r.Name, r.Limit)
		}
	}
	// The plain spelling still works, and GET /v1/keys/ too.
	s.api("PUT", "/v1/rules/r2/override", `{"limit":3}`, 200, nil)
	s.api("GET", "/v1/keys/r2?ip=192.0.2.1", "", 200, nil)
}

// TestKeysIPv6IsThePrefix: the admin API's ?ip= names the same identity as
// /auth: an IPv6 address is its /64 (identity.ipv6_prefix), so inspecting
// any address of the network shows the quota the whole network spent.
func TestKeysIPv6IsThePrefix(t *testing.T) {
	s := newStack(t, `rules:
  - name: r
    key: [ip]
    algorithm: fixed_window
    limit: 2
    period: 1h
`, "")
	for _, ip := range []string{"2001:db8:1:2::1", "2001:db8:1:2:ffff::7"} {
		if got := s.ask("X-Original-URI", "/", "X-Real-IP", ip); got != 204 {
			t.Fatalf("%s: %d", ip, got)
		}
	}
	var k admin.KeyView
	s.api("GET", "/v1/keys/r?ip=2001:db8:1:2::99", "", 200, &k)
	if k.Remaining != 0 || !strings.Contains(k.Key, "2001:db8:1:2::/64") {
		t.Fatalf("key view of another address of the /64: %+v", k)
	}
	s.api("GET", "/v1/keys/r?ip=2001:db8:1:3::1", "", 200, &k)
	if k.Remaining != 2 {
		t.Fatalf("another /64: remaining %d, want 2", k.Remaining)
	}
}
