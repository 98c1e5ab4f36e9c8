package app

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rategate/rategate/limits/memstore"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/admin"
	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/handler"
	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/metrics"
	"github.com/rategate/rategate/policy"
	"github.com/rategate/rategate/top"
)

const denyYAML = `rules:
  - name: per-ip
    key: [ip]
    algorithm: fixed_window
    limit: 1
    period: 1h
`

// dcInstance is one rategate instance over a shared Redis, wired by New
// (so with a deny cache).
type dcInstance struct {
	app     *App
	limiter *limits.Limiter
	cache   *limits.DenyCache
	admin   *fasthttp.HostClient
}

func newDCInstance(t *testing.T, srv *testredis.Server, prefix string) *dcInstance {
	t.Helper()
	return newDCInstanceAt(t, srv.Addr, prefix)
}

// newDCInstanceAt is newDCInstance on the Redis at addr (a proxy, say).
func newDCInstanceAt(t *testing.T, addr, prefix string) *dcInstance {
	t.Helper()
	a := redisApp(t, denyYAML, func(cfg *config.Config) {
		cfg.Redis.URL = "redis://" + addr + "/0"
		cfg.Redis.KeyPrefix = prefix
	})
	l := a.Limiter()
	if l.DenyCache() == nil {
		t.Fatal("no deny cache on a single Redis")
	}
	return &dcInstance{app: a, limiter: l, cache: l.DenyCache(), admin: serveOn(t, a.AdminHandler())}
}

func (in *dcInstance) decide(t *testing.T, ip string) limits.Decision {
	t.Helper()
	var d limits.Decision
	if err := in.limiter.Decide(context.Background(), &limits.Request{IP: []byte(ip)}, &d); err != nil {
		t.Fatal(err)
	}
	return d
}

// waitEmpty waits (bounded, generously) until c holds no entry.
func waitEmpty(t *testing.T, c *limits.DenyCache, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for c.Len() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: the deny cache still holds %d entries after 10 s", what, c.Len())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestDenyCacheResetBroadcast: a key reset through one instance's admin API
// makes every instance forget its cached denial of that key.
func TestDenyCacheResetBroadcast(t *testing.T) {
	srv := testredis.Start(t)
	prefix := uniquePrefix(t)
	a, b := newDCInstance(t, srv, prefix), newDCInstance(t, srv, prefix)
	const ip = "192.0.2.7"

	if d := a.decide(t, ip); !d.Admitted {
		t.Fatalf("first request denied: %+v", d.Verdicts)
	}
	for _, in := range []*dcInstance{a, b} {
		if d := in.decide(t, ip); d.Admitted || d.Cached {
			t.Fatalf("second request: admitted=%v cached=%v, want a store denial", d.Admitted, d.Cached)
		}
		if d := in.decide(t, ip); !d.Cached {
			t.Fatalf("third request not answered by the cache")
		}
	}
	// Another identity's entry stays: a reset forgets one key only.
	b.decide(t, "192.0.2.8")
	b.decide(t, "192.0.2.8")

	if code, body := call(t, a.admin, "DELETE", "/v1/keys/per-ip?ip="+ip, ""); code != 200 {
		t.Fatalf("reset: %d %s", code, body)
	}
	if d := a.decide(t, ip); !d.Admitted || d.Cached {
		t.Fatalf("instance A right after the reset: admitted=%v cached=%v, want admitted by the store", d.Admitted, d.Cached)
	}
	deadline := time.Now().Add(10 * time.Second)
	for b.cache.Len() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("instance B still holds %d entries 10 s after the reset, want 1 (the other identity)", b.cache.Len())
		}
		time.Sleep(5 * time.Millisecond)
	}
	if d := b.decide(t, ip); d.Cached {
		t.Fatal("instance B answered the reset identity from its cache")
	}
	if d := b.decide(t, "192.0.2.8"); !d.Cached {
		t.Fatal("instance B forgot an identity nobody reset")
	}
	_, metricsText := call(t, a.admin, "GET", "/metrics", "")
	for _, want := range []string{`rategate_deny_cache_announcements_total{result="sent"} 1`,
		`rategate_deny_cache_announcements_total{result="failed"} 0`, `rategate_deny_cache_clear_all_sent_total 0`} {
		if !strings.Contains(metricsText, want+"\n") {
			t.Errorf("instance A's /metrics lacks %q", want)
		}
	}
}

// TestDenyCacheForgetsALateRefund: a denial Redis made between a commit
// whose caller gave up and that commit's refund counted units that are
// back once the refund ran; an instance that cached it would deny until
// its retry time (the window's end here) what Redis admits. A late refund
// announces its keys as a key reset does, so every instance forgets them.
// Instance A's replies come 400 ms late (its caller waits 100 ms): its
// decision commits at once, its caller gives up, B is denied and caches
// it, then A's late reply comes and A refunds.
func TestDenyCacheForgetsALateRefund(t *testing.T) {
	srv := testredis.Start(t)
	px := testredis.StartProxy(t, srv.Addr)
	prefix := uniquePrefix(t)
	a := newDCInstanceAt(t, px.Addr, prefix)
	b := newDCInstance(t, srv, prefix)
	const ip = "192.0.2.9"
	openConnections(t, a.limiter)
	px.DelayReplies(400 * time.Millisecond)
	// (the handler gives each decision its redis.timeout; here the
	// test does)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	var d limits.Decision
	err := a.limiter.Decide(ctx, &limits.Request{IP: []byte(ip)}, &d)
	cancel()
	if err == nil && !d.Local && !d.Undecided {
		t.Fatalf("instance A was answered by Redis: %+v", d.Verdicts)
	}
	if d := b.decide(t, ip); d.Admitted || d.Cached {
		t.Fatalf("instance B after A's commit: admitted=%v cached=%v, want a store denial", d.Admitted, d.Cached)
	}
	if d := b.decide(t, ip); !d.Cached {
		t.Fatal("instance B did not cache the denial")
	}
	waitEmpty(t, b.cache, "instance B after A's late refund")
	if d := b.decide(t, ip); !d.Admitted {
		t.Fatalf("instance B after A's late refund: %+v, want admitted (A's unit is back)", d.Verdicts)
	}
}

// TestDenyCacheResubscribeClears: an instance whose subscription broke may
// have missed resets, so it clears its cache when it is subscribed again.
func TestDenyCacheResubscribeClears(t *testing.T) {
	srv := testredis.Start(t)
	in := newDCInstance(t, srv, uniquePrefix(t))
	in.decide(t, "192.0.2.7")
	in.decide(t, "192.0.2.7")
	if in.cache.Len() != 1 {
		t.Fatalf("Len %d, want 1", in.cache.Len())
	}
	if err := srv.Client(t).ClientKillByFilter(context.Background(), "TYPE", "pubsub").Err(); err != nil {
		t.Fatal(err)
	}
	waitEmpty(t, in.cache, "after the subscription was killed")
}

// TestDenyCacheMetrics: denials answered from the cache are counted as
// limited and as cached per rule, never reach the store, and the cache's
// size is exported, all on the admin listener's /metrics.
func TestDenyCacheMetrics(t *testing.T) {
	cfg, err := config.Parse("test.yaml", []byte(steadyHours(denyYAML)))
	if err != nil {
		t.Fatal(err)
	}
	// The parts New wires for Redis, over a memory store: a limiter with a
	// deny cache and the metrics as its store observer.
	m := metrics.New()
	mem := memstore.New()
	defer mem.Close()
	c := limits.NewDenyCache(1000)
	l := limits.New(limits.Options{Store: mem, Prefix: "rg", Rules: cfg.Rules, DenyCache: c, Observer: m})
	m.ObserveDenyCache(c)
	mgr := policy.NewManager(policy.ManagerOptions{Config: cfg, Limiter: l, Metrics: m, Log: zerolog.Nop()})
	h := handler.New(l, l, handler.Options{Observer: observer{metrics: m, top: top.New()}})
	auth := serveOn(t, h.Serve)
	adminSrv := serveOn(t, admin.NewServer(admin.ServerOptions{Rules: mgr, Limiter: l, Metrics: m, Log: zerolog.Nop()}).Serve)

	ask := func(ip string) *fasthttp.Response {
		req, resp := fasthttp.AcquireRequest(), &fasthttp.Response{}
		defer fasthttp.ReleaseRequest(req)
		req.SetRequestURI("http://" + auth.Addr + "/auth")
		req.Header.Set("X-Original-URI", "/a")
		req.Header.Set("X-Real-IP", ip)
		if err := auth.DoTimeout(req, resp, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for i, want := range []int{204, 429, 429, 429} {
		resp := ask("192.0.2.7")
		if resp.StatusCode() != want {
			t.Fatalf("request %d: %d, want %d", i+1, resp.StatusCode(), want)
		}
		if want == 429 {
			// A cached denial answers like the store's: rule and Retry-After.
			if r := string(resp.Header.Peek("X-RateLimit-Rule")); r != "per-ip" {
				t.Fatalf("request %d: X-RateLimit-Rule %q", i+1, r)
			}
			if ra := string(resp.Header.Peek("Retry-After")); ra == "" || ra == "0" {
				t.Fatalf("request %d: Retry-After %q", i+1, ra)
			}
		}
	}
	ask("192.0.2.8")
	ask("192.0.2.8")

	_, body := call(t, adminSrv, "GET", "/metrics", "")
	for _, want := range []string{
		`rategate_deny_cache_decisions_total{rule="per-ip"} 2`,
		`rategate_decisions_total{rule="per-ip",decision="limited"} 4`,
		`rategate_decisions_total{rule="per-ip",decision="allowed"} 2`,
		`rategate_deny_cache_entries 2`,
		`rategate_deny_cache_evictions_total 0`,
		`rategate_requests_total{outcome="limited"} 4`,
		// 6 requests, 2 answered from the cache: 4 store decisions.
		`rategate_store_duration_seconds_count{op="decide"} 4`,
	} {
		if !strings.Contains(body, "\n"+want+"\n") {
			t.Errorf("/metrics lacks %q", want)
		}
	}
	for _, fam := range []string{"rategate_deny_cache_decisions_total counter", "rategate_deny_cache_entries gauge", "rategate_deny_cache_evictions_total counter"} {
		if !strings.Contains(body, "# TYPE "+fam+"\n") {
			t.Errorf("/metrics lacks # TYPE %s", fam)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", regexp.MustCompile(`(?m)^rategate_(deny_cache|decisions|store_duration_seconds_count).*$`).FindAllString(body, -1))
	}
}

// TestDenyCacheObservedAllocs: observing a denial answered from the cache
// (metrics and the top sketch) allocates nothing, and neither does the
// cached decision itself.
func TestDenyCacheObservedAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	cfg, err := config.Parse("test.yaml", []byte(steadyHours(denyYAML)))
	if err != nil {
		t.Fatal(err)
	}
	m := metrics.New()
	mem := memstore.New()
	defer mem.Close()
	c := limits.NewDenyCache(100)
	l := limits.New(limits.Options{Store: mem, Prefix: "rg", Rules: cfg.Rules, DenyCache: c, Observer: m})
	m.ObserveDenyCache(c)
	m.SetRules([]metrics.RuleInfo{{Name: "per-ip"}})
	obs := observer{metrics: m, top: top.New()}
	req := &limits.Request{IP: []byte("192.0.2.7")}
	var d limits.Decision
	ctx := context.Background()
	for i := 0; i < 3; i++ {
		if err := l.Decide(ctx, req, &d); err != nil {
			t.Fatal(err)
		}
		obs.Decided(&d, time.Millisecond)
	}
	if !d.Cached {
		t.Fatal("third request not answered by the cache")
	}
	n := testing.AllocsPerRun(1000, func() {
		_ = l.Decide(ctx, req, &d)
		obs.Decided(&d, time.Millisecond)
	})
	if n != 0 {
		t.Errorf("a cached denial, decided and observed, allocates %v, want 0", n)
	}
}

// TestRedisDataLoss: Redis flushed behind rategate's back (FLUSHALL, a
// restart without persistence). The deny cache would keep denying until
// the old retry time while other instances admit; instead each instance
// notices the loss within a few seconds (the epoch marker), drops its
// cached denials and says so, and a runtime override that vanished with
// the data is logged too.
func TestRedisDataLoss(t *testing.T) {
	srv := testredis.Start(t)
	cfg, err := config.Parse("test.yaml", []byte(steadyHours(denyYAML)))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Redis.URL = "redis://" + srv.Addr + "/0"
	cfg.Redis.KeyPrefix = uniquePrefix(t)
	var logs syncBuffer
	a, err := New(cfg, Options{Log: zerolog.New(&logs)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(a.Close)
	resetsReady(t, a) // else its first subscription may clear the denial cached below
	l := a.Limiter()
	decide := func() limits.Decision {
		var d limits.Decision
		_ = l.Decide(context.Background(), &limits.Request{IP: []byte("192.0.2.7")}, &d)
		return d
	}
	decide()
	decide()
	if d := decide(); !d.Cached {
		t.Fatal("third request not answered by the deny cache")
	}
	if _, err := a.Rules().SetOverride(context.Background(), "per-ip", []byte(`{"limit":5}`)); err != nil {
		t.Fatal(err)
	}
	// The override cleared the cache: deny again so that it holds an entry.
	for i := 0; i < 6; i++ {
		decide()
	}
	if l.DenyCache().Len() == 0 {
		t.Fatal("nothing cached before the flush")
	}
	time.Sleep(1500 * time.Millisecond) // the epoch marker has been read once
	if err := srv.Client(t).FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	took := within(t, 5*time.Second, "the deny cache forgets after FLUSHALL", func() error {
		if n := l.DenyCache().Len(); n != 0 {
			return fmt.Errorf("%d cached denials", n)
		}
		return nil
	})
	if d := decide(); !d.Admitted || d.Cached {
		t.Fatalf("after the flush: admitted=%v cached=%v, want admitted by the empty Redis", d.Admitted, d.Cached)
	}
	within(t, 5*time.Second, "both log lines", func() error {
		for _, want := range []string{"Redis lost its data", "runtime overrides no longer in the shared store"} {
			if logs.lines(want) == 0 {
				return fmt.Errorf("no log line %q", want)
			}
		}
		return nil
	})
	t.Logf("cache cleared %v after FLUSHALL", took.Round(time.Millisecond))
}

// TestCachedDenialListsEveryRule: a denial the deny cache answers carries
// the same rate-limit headers as the store's denial before it: every
// matching rule in RateLimit-Policy and RateLimit, not only the denying one.
func TestCachedDenialListsEveryRule(t *testing.T) {
	s := newStack(t, `rules:
  - name: per-ip
    key: [ip]
    algorithm: fixed_window
    limit: 1
    period: 1h
  - name: global
    algorithm: gcra
    limit: 1000
    period: 1s
    burst: 1000
`, "redis")
	get := func() *fasthttp.Response {
		req, resp := fasthttp.AcquireRequest(), &fasthttp.Response{}
		defer fasthttp.ReleaseRequest(req)
		req.SetRequestURI("http://" + s.auth.Addr + "/auth")
		req.Header.Set("X-Original-URI", "/")
		req.Header.Set("X-Real-IP", "192.0.2.33")
		if err := s.auth.DoTimeout(req, resp, 5*time.Second); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	get()
	store, cached := get(), get()
	if store.StatusCode() != 429 || cached.StatusCode() != 429 {
		t.Fatalf("statuses %d, %d, want 429 twice", store.StatusCode(), cached.StatusCode())
	}
	if s.limiter.DenyCache().Len() == 0 {
		t.Fatal("the second denial was not cached")
	}
	for _, h := range []string{"RateLimit-Policy", "X-RateLimit-Rule", "X-RateLimit-Limit"} {
		a, b := string(store.Header.Peek(h)), string(cached.Header.Peek(h))
		if a != b {
			t.Errorf("%s: store's denial %q, cached denial %q", h, a, b)
		}
	}
	rl := string(cached.Header.Peek("RateLimit"))
	if !strings.Contains(rl, `"per-ip";r=0`) || !strings.Contains(rl, `"global";r=`) {
		t.Errorf("cached denial RateLimit %q, want both rules", rl)
	}
}

// openConnections has l decide for 8 other clients at once, so that its
// Redis connections are open before a test delays Redis: a new
// connection's handshake would hold a decision back past its caller's
// deadline, and it would not be sent.
func openConnections(t *testing.T, l *limits.Limiter) {
	t.Helper()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var d limits.Decision
			if err := l.Decide(context.Background(), &limits.Request{IP: fmt.Appendf(nil, "198.51.100.%d", i)}, &d); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
}
