package main

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/internal/testredis"
)

func start(t *testing.T, rdb *redis.Client, r rule, timeout time.Duration) *limiter {
	t.Helper()
	if r.prefix == "" {
		r.prefix = "t"
	}
	if r.name == "" {
		r.name = "per-user"
	}
	if r.burst == 0 {
		r.burst = r.limit
	}
	l, err := newLimiter(context.Background(), rdb, r, timeout, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { close(l.queue) })
	return l
}

// ask sends one /auth request with headers (name, value, ...).
func ask(l *limiter, hdrs ...string) *fasthttp.RequestCtx {
	ctx := &fasthttp.RequestCtx{}
	ctx.Request.SetRequestURI("/auth")
	for i := 0; i+1 < len(hdrs); i += 2 {
		ctx.Request.Header.Set(hdrs[i], hdrs[i+1])
	}
	l.serve(ctx)
	return ctx
}

// header finds a response header by name in any case (Peek would look for
// fasthttp's normalized spelling, not the one SetCanonical wrote).
func header(ctx *fasthttp.RequestCtx, name string) string {
	for k, v := range ctx.Response.Header.All() {
		if strings.EqualFold(string(k), name) {
			return string(v)
		}
	}
	return ""
}

// TestExactlyLimit: concurrent requests of one user on a fresh key admit
// exactly the limit (the burst for gcra and token_bucket), every denial
// says when to retry, and the key has a TTL no longer than it needs.
func TestExactlyLimit(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client(t)
	for _, algo := range []string{"sliding_window", "fixed_window", "gcra", "token_bucket"} {
		t.Run(algo, func(t *testing.T) {
			l := start(t, rdb, rule{algorithm: algo, key: "user", prefix: algo, limit: 5, period: time.Minute}, time.Second)
			const n = 12
			var answers []*fasthttp.RequestCtx
			user := ""
			// A fixed window that ends while the requests run admits the
			// limit twice: go again with a fresh user then.
			for attempt := 0; attempt < 2; attempt++ {
				user = "alice" + strconv.Itoa(attempt)
				answers = make([]*fasthttp.RequestCtx, n)
				before := time.Now().Unix() / 60
				var wg sync.WaitGroup
				for i := range n {
					wg.Go(func() { answers[i] = ask(l, "X-Original-URI", "/x", "X-Real-IP", "10.0.0.1", "X-User-Id", user) })
				}
				wg.Wait()
				if time.Now().Unix()/60 == before {
					break
				}
			}
			allowed, remaining := 0, map[string]bool{}
			for _, a := range answers {
				switch a.Response.StatusCode() {
				case 204:
					allowed++
					remaining[header(a, "X-RateLimit-Remaining")] = true
				case 429:
					if r, err := strconv.Atoi(header(a, "Retry-After")); err != nil || r < 1 || r > 120 { // sliding_window: up to two periods
						t.Errorf("429 with Retry-After %q", header(a, "Retry-After"))
					}
				default:
					t.Errorf("status %d (%s)", a.Response.StatusCode(), header(a, "X-RateLimit-Status"))
				}
				if header(a, "X-RateLimit-Limit") != "5" || header(a, "RateLimit-Policy") != `"per-user";q=5;w=60` ||
					header(a, "RateLimit") == "" || header(a, "X-RateLimit-Reset") == "" {
					t.Errorf("headers: %s", a.Response.Header.String())
				}
			}
			if allowed != 5 || len(remaining) != 5 || !remaining["0"] || !remaining["4"] {
				t.Errorf("allowed %d of %d with remaining %v, want 5 with 4..0", allowed, n, remaining)
			}
			ttl, err := rdb.PTTL(context.Background(), algo+":u:"+user).Result()
			if err != nil || ttl <= 0 || ttl > 2*time.Minute {
				t.Errorf("key TTL %v, %v", ttl, err)
			}
			if u := l.undecided.Load(); u != 0 {
				t.Errorf("%d undecided", u)
			}
		})
	}
}

// TestIdentity: who shares a counter, and what is refused.
func TestIdentity(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client(t)
	// gcra: no window boundary to make a limit of 1 whole again mid-test
	l := start(t, rdb, rule{algorithm: "gcra", key: "user", prefix: "id", limit: 1, burst: 1, period: time.Minute}, time.Second)
	status := func(hdrs ...string) int {
		return ask(l, append([]string{"X-Original-URI", "/x"}, hdrs...)...).Response.StatusCode()
	}
	for _, c := range []struct {
		what string
		hdrs []string
		want int
	}{
		{"a user", []string{"X-Real-IP", "10.0.0.1", "X-User-Id", "bob"}, 204},
		{"the same user from another IP", []string{"X-Real-IP", "10.0.0.2", "X-User-Id", "bob"}, 429},
		{"no user: keyed by IP", []string{"X-Real-IP", "10.0.0.1"}, 204},
		{"the same IPv4 address mapped into IPv6", []string{"X-Real-IP", "::ffff:10.0.0.1"}, 429},
		{"a user named like the IP key", []string{"X-Real-IP", "10.0.0.9", "X-User-Id", "10.0.0.1"}, 204},
		{"an IPv6 client", []string{"X-Real-IP", "2001:db8:1:2::1"}, 204},
		{"another address of its /64", []string{"X-Real-IP", "2001:db8:1:2:ffff::7"}, 429},
		{"the next /64", []string{"X-Real-IP", "2001:db8:1:3::1"}, 204},
		{"no IP and no user", nil, 400},
		{"an invalid IP", []string{"X-Real-IP", "10.0.0.300"}, 400},
		{"a user id over 256 bytes", []string{"X-Real-IP", "10.0.0.1", "X-User-Id", string(make([]byte, 257))}, 400},
	} {
		if got := status(c.hdrs...); got != c.want {
			t.Errorf("%s: %d, want %d", c.what, got, c.want)
		}
	}
	if got := ask(l, "X-Real-IP", "10.0.0.5", "X-User-Id", "carol").Response.StatusCode(); got != 400 {
		t.Errorf("no X-Original-URI: %d, want 400", got)
	}
}

// TestRedisDown: with Redis gone, a request is answered within its deadline,
// allowed, marked and counted; SCRIPT FLUSH costs one request, not all.
func TestRedisDown(t *testing.T) {
	srv := testredis.Start(t)
	rdb := srv.Client(t)
	l := start(t, rdb, rule{algorithm: "sliding_window", key: "global", prefix: "down", limit: 100, period: time.Minute}, 100*time.Millisecond)
	req := []string{"X-Original-URI", "/x", "X-Real-IP", "10.0.0.1"}
	if got := ask(l, req...).Response.StatusCode(); got != 204 || l.undecided.Load() != 0 {
		t.Fatalf("first request: %d, %d undecided", got, l.undecided.Load())
	}
	if err := rdb.ScriptFlush(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	if a := ask(l, req...); header(a, "X-RateLimit-Status") != "unavailable" || l.undecided.Load() != 1 {
		t.Errorf("after SCRIPT FLUSH: %s, %d undecided", a.Response.Header.String(), l.undecided.Load())
	}
	if a := ask(l, req...); header(a, "X-RateLimit-Remaining") != "98" || l.undecided.Load() != 1 {
		t.Errorf("script not reloaded: %s, %d undecided", a.Response.Header.String(), l.undecided.Load())
	}
	srv.Stop()
	began := time.Now()
	a := ask(l, req...)
	if took := time.Since(began); took > time.Second || a.Response.StatusCode() != 204 ||
		header(a, "X-RateLimit-Status") != "unavailable" || l.undecided.Load() != 2 {
		t.Errorf("Redis down: %d in %v, %s, %d undecided", a.Response.StatusCode(), took, a.Response.Header.String(), l.undecided.Load())
	}
	m := &fasthttp.RequestCtx{}
	m.Request.SetRequestURI("/metrics")
	l.serve(m)
	if got := string(m.Response.Body()); got != "minimal_undecided_total 2\n" {
		t.Errorf("/metrics = %q", got)
	}
}
