package bench_test

// Go micro-benchmarks of rategate's hot path, from the cheapest piece to
// a whole decision against a real redis-server:
//
//	go test -run '^$' -bench . -benchmem ./bench/
//	go test -run '^$' -bench 'Serve/redis' -benchmem -cpuprofile cpu.out ./bench/ && go tool pprof -top bench.test cpu.out
//
// They are for finding where the time goes, not for pass/fail: speed is
// judged by `make bench`'s ratios against the floor (bench/README.md).

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/app"
	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/handler"
	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/lua"
)

// users are the identities the benchmarks cycle through, as make bench's
// 10,000 users.
var users = func() [][]byte {
	u := make([][]byte, 10000)
	for i := range u {
		u[i] = []byte("user" + strconv.Itoa(i+1))
	}
	return u
}()

// BenchmarkNormalizeRoute is the route half of identity parsing: the URI
// NGINX sends, normalized into the route rules match on.
func BenchmarkNormalizeRoute(b *testing.B) {
	for _, uri := range []string{
		"/api/items/42",
		"/api/items/42?page=2&sort=name",
		"/api//v1/./items/../items/%7Euser?x=1",
	} {
		b.Run(uri, func(b *testing.B) {
			src := []byte(uri)
			dst := make([]byte, 0, 256)
			b.ReportAllocs()
			for b.Loop() {
				dst = limits.NormalizeRoute(dst[:0], src)
			}
		})
	}
}

// BenchmarkKey is key building for one rule: the escaped identity and the
// full Redis key.
func BenchmarkKey(b *testing.B) {
	r := userRule("api-per-user", "/api/", limits.FixedWindow)
	req := &limits.Request{Method: []byte("GET"), Route: []byte("/api/items/42"), IP: []byte("127.0.0.1")}
	var ident, key []byte
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		req.User = users[i%len(users)]
		i++
		ident, _ = limits.AppendIdentity(ident[:0], r, req)
		key = limits.AppendKey(key[:0], "rg", r, ident)
	}
}

// BenchmarkLimiterMemory is rule matching, key building and the memory
// store's decision, for N rules of which `match` apply to the request.
func BenchmarkLimiterMemory(b *testing.B) {
	for _, c := range []struct{ rules, match int }{{1, 1}, {10, 1}, {10, 3}, {30, 1}, {30, 10}} {
		b.Run(fmt.Sprintf("rules=%d/matching=%d", c.rules, c.match), func(b *testing.B) {
			var rules []*limits.Rule
			for i := range c.rules {
				prefix := "/api/"
				if i >= c.match {
					prefix = "/other" + strconv.Itoa(i) + "/"
				}
				rules = append(rules, userRule("rule-"+strconv.Itoa(i), prefix, limits.FixedWindow))
			}
			store := memstore.New()
			defer store.Close()
			l := limits.NewLimiter(store, "rg", rules)
			req := &limits.Request{Method: []byte("GET"), Route: []byte("/api/items/42"), IP: []byte("127.0.0.1")}
			var d limits.Decision
			ctx := context.Background()
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				req.User = users[i%len(users)]
				i++
				if err := l.Decide(ctx, req, &d); err != nil || !d.Admitted || len(d.Verdicts) != c.match {
					b.Fatalf("decide: %v, admitted %v, %d verdicts", err, d.Admitted, len(d.Verdicts))
				}
			}
		})
	}
}

// BenchmarkServe is a whole /auth request through handler.Serve on a
// fasthttp.RequestCtx (no network on the HTTP side), with:
//
//	canned  a Decider that returns a fixed decision: identity parsing and
//	        the response headers only
//	memory  the limiter and the memory store
//	redis   wired as main.go wires it with -redis: Redis store, metrics
//	        wrapper, circuit breaker, metrics and top-denied observer; one
//	        request at a time (serial) or 50 at once (parallel)
//
// Requests are those of make bench's mostly-allowed scenario, against
// bench/policy.yaml's rules.
func BenchmarkServe(b *testing.B) {
	cfg, err := config.Load("policy.yaml")
	if err != nil {
		b.Fatal(err)
	}

	b.Run("canned", func(b *testing.B) {
		r := cfg.Rules[0]
		d := &canned{Admitted: true, Denier: -1, Verdicts: []limits.Verdict{
			{Rule: r, Key: "rg:{api-per-user:user1}:fw", Cost: 1, Result: limits.Result{Allowed: true, Remaining: 99, ResetUS: 42_000_000}},
		}}
		serveSerial(b, handler.New(d, nil, handler.Options{}).Serve, allowed)
	})
	b.Run("memory", func(b *testing.B) {
		store := memstore.New()
		defer store.Close()
		l := limits.NewLimiter(store, "rg", cfg.Rules)
		serveSerial(b, handler.New(l, l, handler.Options{}).Serve, allowed)
	})
	b.Run("memory/denied", func(b *testing.B) {
		store := memstore.New()
		defer store.Close()
		l := limits.NewLimiter(store, "rg", cfg.Rules)
		serveSerial(b, handler.New(l, l, handler.Options{}).Serve, attack)
	})

	srv := testredis.Start(b)
	h := wiredRedis(b, srv, cfg)
	b.Run("redis/serial", func(b *testing.B) { serveSerial(b, h, allowed) })
	b.Run("redis/parallel", func(b *testing.B) { serveParallel(b, h, allowed) })
	b.Run("redis/denied/parallel", func(b *testing.B) { serveParallel(b, h, attack) })
}

// workload is the requests a Serve benchmark sends: the URI and the users
// it rotates through.
type workload struct {
	uri   string
	users [][]byte
}

var (
	// allowed is make bench's mostly-allowed scenario: 10,000 users far
	// below their limit.
	allowed = workload{"/api/items/42", users}
	// attack is its attack scenario: 5 users at 10 per second each, nearly
	// every request denied.
	attack = workload{"/attack/items/1", users[:5]}
)

// wiredRedis builds the handler as the binary does with -redis (app.New).
func wiredRedis(b *testing.B, srv *testredis.Server, cfg *config.Config) fasthttp.RequestHandler {
	cfg.Redis.URL = "redis://" + srv.Addr + "/0"
	a, err := app.New(cfg, app.Options{Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(a.Close)
	return a.Handler()
}

func newAuthCtx(uri string) *fasthttp.RequestCtx {
	ctx := &fasthttp.RequestCtx{}
	ctx.Request.SetRequestURI("/auth")
	ctx.Request.Header.Set("X-Original-URI", uri)
	ctx.Request.Header.Set("X-Original-Method", "GET")
	ctx.Request.Header.Set("X-Original-Host", "bench.local")
	ctx.Request.Header.Set("X-Real-IP", "127.0.0.1")
	ctx.Request.Header.Set("X-User-Id", "user1")
	return ctx
}

func serveSerial(b *testing.B, h fasthttp.RequestHandler, w workload) {
	ctx := newAuthCtx(w.uri)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if err := serveOne(h, ctx, w.users[i%len(w.users)]); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

// serveParallel serves from ~50 goroutines at once, like NGINX's
// connections, each with its own RequestCtx.
func serveParallel(b *testing.B, h fasthttp.RequestHandler, w workload) {
	b.SetParallelism(25) // 25 x GOMAXPROCS goroutines, 50 on 2 CPUs
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := newAuthCtx(w.uri)
		i := 0
		for pb.Next() {
			if err := serveOne(h, ctx, w.users[i%len(w.users)]); err != nil {
				b.Error(err)
				return
			}
			i++
		}
	})
}

// serveOne serves one request of user; 204 and 429 are the answers expected.
func serveOne(h fasthttp.RequestHandler, ctx *fasthttp.RequestCtx, user []byte) error {
	ctx.Request.Header.SetBytesV("X-User-Id", user)
	ctx.Response.Reset()
	h(ctx)
	switch st := ctx.Response.StatusCode(); st {
	case fasthttp.StatusNoContent, fasthttp.StatusTooManyRequests:
		if ctx.Response.Header.Peek("X-RateLimit-Status") != nil {
			return fmt.Errorf("answered by failure_mode: %s", ctx.Response.Header.Peek("X-RateLimit-Status"))
		}
		return nil
	default:
		return fmt.Errorf("status %d: %s", st, ctx.Response.Body())
	}
}

// BenchmarkRedisDecide is the Redis store alone: one decision (all of a
// request's rules in one EVALSHA of decide.lua) against a real
// redis-server, one at a time or 50 at once, coalesced into pipelines
// (the default) or each on its own round trip.
func BenchmarkRedisDecide(b *testing.B) {
	srv := testredis.Start(b)
	client := srv.Client(b)
	coalesced, err := redisstore.New(client, "redis "+srv.Addr)
	if err != nil {
		b.Fatal(err)
	}
	alone, err := redisstore.New(client, "redis "+srv.Addr, redisstore.CoalesceOptions{Disabled: true})
	if err != nil {
		b.Fatal(err)
	}
	keys := make([][]string, 3) // keys[rule][user]
	for j := range keys {
		keys[j] = make([]string, len(users))
		for u := range users {
			keys[j][u] = fmt.Sprintf("rgbench:{r%d:%s}:fw", j, users[u])
		}
	}
	for _, n := range []int{1, 3} {
		for _, parallel := range []bool{false, true} {
			for _, rs := range []*redisstore.Store{coalesced, alone} {
				name := fmt.Sprintf("rules=%d/serial", n)
				if parallel {
					name = fmt.Sprintf("rules=%d/parallel", n)
				}
				if _, ok := rs.Coalescing(); ok {
					name += "/coalesced"
				} else {
					name += "/alone"
				}
				b.Run(name, func(b *testing.B) {
					b.ReportAllocs()
					if !parallel {
						decideLoop(b, rs, keys[:n], func(body func()) {
							for b.Loop() {
								body()
							}
						})
						return
					}
					b.SetParallelism(25)
					b.RunParallel(func(pb *testing.PB) {
						decideLoop(b, rs, keys[:n], func(body func()) {
							for pb.Next() {
								body()
							}
						})
					})
				})
			}
		}
	}
}

// decideLoop runs Decide for len(keys) fixed_window rules (keys[rule][user])
// of rotating users.
func decideLoop(b *testing.B, rs *redisstore.Store, keys [][]string, loop func(func())) {
	n := len(keys)
	batch := &limits.Batch{Checks: make([]limits.Check, n)}
	res := make([]limits.Result, n)
	i := 0
	loop(func() {
		u := i % len(users)
		i++
		for j := range batch.Checks {
			batch.Checks[j] = limits.Check{Key: keys[j][u], Algorithm: limits.FixedWindow,
				Limit: 1 << 40, PeriodUS: 60_000_000, Burst: 1 << 40, Cost: 1}
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		ok, err := rs.Decide(ctx, batch, res)
		cancel()
		if err != nil || !ok {
			b.Errorf("decide: %v, admitted %v", err, ok)
		}
	})
}

// BenchmarkRedisPipelined is what coalescing decisions could buy: the
// same one-rule decide.lua EVALSHA, `depth` of them per round trip
// (go-redis pipeline), from 1 or 50 goroutines. Compare its
// decisions/s with BenchmarkRedisDecide/rules=1.
func BenchmarkRedisPipelined(b *testing.B) {
	srv := testredis.Start(b)
	client := srv.Client(b)
	src, err := lua.Decide()
	if err != nil {
		b.Fatal(err)
	}
	script := redis.NewScript(src)
	if err := script.Load(context.Background(), client).Err(); err != nil {
		b.Fatal(err)
	}
	code := limits.FixedWindow.Code()
	keys := make([]string, len(users))
	for u := range users {
		keys[u] = fmt.Sprintf("rgbench:{pipe:%s}:fw", users[u])
	}
	for _, depth := range []int{1, 4, 16} {
		for _, par := range []int{1, 25} {
			b.Run(fmt.Sprintf("depth=%d/goroutines=%dxGOMAXPROCS", depth, par), func(b *testing.B) {
				b.SetParallelism(par)
				b.ReportAllocs()
				b.RunParallel(func(pb *testing.PB) {
					i := 0
					cmds := make([]*redis.Cmd, 0, depth)
					for pb.Next() {
						pipe := client.Pipeline()
						cmds = cmds[:0]
						for range depth {
							u := i % len(users)
							i++
							cmds = append(cmds, script.EvalSha(context.Background(), pipe, []string{keys[u]},
								0, code, int64(1<<40), int64(60_000_000), int64(1<<40), 1, 0))
						}
						if _, err := pipe.Exec(context.Background()); err != nil {
							b.Errorf("pipeline: %v", err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.N*depth)/b.Elapsed().Seconds(), "decisions/s")
			})
		}
	}
}

// userRule is a rule keyed on the user with a limit no benchmark reaches.
func userRule(name, prefix string, algo limits.Algorithm) *limits.Rule {
	return &limits.Rule{
		Name: name, Match: limits.Match{PathPrefix: prefix},
		Key:       []limits.KeyPart{{Kind: limits.KeyUser}},
		Algorithm: algo, Limit: 1 << 40, Period: time.Minute, Burst: 1 << 40, Cost: 1,
	}
}

// canned fills every decision with a fixed one: the handler's own cost.
type canned limits.Decision

func (c *canned) Decide(_ context.Context, _ *limits.Request, d *limits.Decision) error {
	d.Admitted, d.Denier = c.Admitted, c.Denier
	d.Verdicts = append(d.Verdicts[:0], c.Verdicts...)
	return nil
}
