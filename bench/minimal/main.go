// Command minimal is the rate limiter a team would write instead of running
// rategate, kept honest and simple: the reference `make bench` holds rategate
// to (bench/README.md). One rule from flags, one small Lua script per
// algorithm (Redis TIME, atomic, keys with TTLs), go-redis, decisions gathered
// into pipelines by a few runner goroutines, a deadline per request, and the
// rate-limit headers rategate sends. No local caching of decisions.
//
//	minimal -listen 127.0.0.1:18090 -redis 127.0.0.1:6379 -algorithm sliding_window -limit 1000 -period 1m
//
// GET /auth reads X-Original-URI (required), X-User-Id and X-Real-IP, as
// rategate does; the demo header X-User reaches it as X-User-Id through
// nginx/rategate-identity-demo.conf. A request without a user is keyed by its
// IP (an IPv6 client by its /64). GET /metrics counts the requests answered
// without a decision (Redis too slow or failing: allowed, as failure_mode allow).
package main

import (
	"context"
	"embed"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/signal"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/valyala/fasthttp"
)

//go:embed *.lua
var scripts embed.FS

var (
	hdrURI, hdrUser, hdrIP                     = []byte("X-Original-URI"), []byte("X-User-Id"), []byte("X-Real-IP")
	hdrPolicy, hdrRateLimit                    = []byte("RateLimit-Policy"), []byte("RateLimit")
	hdrLimit, hdrRemaining, hdrReset, hdrRetry = []byte("X-RateLimit-Limit"), []byte("X-RateLimit-Remaining"), []byte("X-RateLimit-Reset"), []byte("Retry-After")
	hdrStatus, valUnavailable                  = []byte("X-RateLimit-Status"), []byte("unavailable")
	errExpired                                 = errors.New("deadline passed while queued")
)

// rule is the one limit, from flags.
type rule struct {
	name, algorithm, key, prefix string
	limit, burst                 int64
	period                       time.Duration
}

// call is one decision on its way through a pipeline; done gets one value.
type call struct {
	keys     [1]string
	buf      []byte
	deadline time.Time
	timer    *time.Timer
	done     chan struct{}
	res      []int64 // allowed, remaining, reset ms, retry ms
	err      error
}

type limiter struct {
	r                  rule
	rdb                *redis.Client
	script             *redis.Script
	args               []any
	policy, limit, sfn []byte
	timeout            time.Duration
	queue              chan *call
	calls              sync.Pool
	undecided          atomic.Int64
}

// newLimiter loads the rule's script into Redis and starts the runners.
func newLimiter(ctx context.Context, rdb *redis.Client, r rule, timeout time.Duration, pipelines int) (*limiter, error) {
	p, us := r.period.Milliseconds(), r.period.Microseconds()
	t := (us + r.limit - 1) / r.limit // gcra's interval, rounded up
	args := map[string][]any{"sliding_window": {r.limit, p}, "fixed_window": {r.limit, p},
		"gcra": {t, r.burst * t}, "token_bucket": {r.limit, us, r.burst}}[r.algorithm]
	src, err := scripts.ReadFile(r.algorithm + ".lua")
	if args == nil || err != nil || r.limit < 1 || r.burst < 1 || p < 1 {
		return nil, fmt.Errorf("want -algorithm sliding_window|fixed_window|gcra|token_bucket, -limit, -burst >= 1 and -period >= 1ms")
	}
	l := &limiter{r: r, rdb: rdb, script: redis.NewScript(string(src)), args: args, timeout: timeout,
		queue: make(chan *call, 4096), sfn: []byte(strconv.Quote(r.name)), limit: strconv.AppendInt(nil, r.limit, 10)}
	l.policy = fmt.Appendf(nil, "%s;q=%d;w=%d", l.sfn, r.limit, (r.period+time.Second-1)/time.Second)
	l.calls.New = func() any {
		c := &call{done: make(chan struct{}, 1), timer: time.NewTimer(time.Hour)}
		c.timer.Stop()
		return c
	}
	if err := l.script.Load(ctx, rdb).Err(); err != nil {
		return nil, fmt.Errorf("load %s.lua: %w", r.algorithm, err)
	}
	for range pipelines {
		go l.run()
	}
	return l, nil
}

func main() {
	var r rule
	listen := flag.String("listen", "127.0.0.1:8090", "listen `addr`")
	addr := flag.String("redis", "127.0.0.1:6379", "Redis `host:port`")
	timeout := flag.Duration("timeout", 50*time.Millisecond, "deadline of one decision, queueing included")
	pipelines := flag.Int("pipelines", 4, "runner goroutines, each sending one pipeline at a time")
	flag.StringVar(&r.name, "name", "minimal", "rule `name` in the headers")
	flag.StringVar(&r.algorithm, "algorithm", "sliding_window", "sliding_window | fixed_window | gcra | token_bucket")
	flag.StringVar(&r.key, "key", "user", "user (the IP without one) | ip | global")
	flag.StringVar(&r.prefix, "prefix", "min", "key prefix")
	flag.Int64Var(&r.limit, "limit", 1000, "requests per period")
	flag.Int64Var(&r.burst, "burst", 0, "gcra and token_bucket: requests at once (default: the limit)")
	flag.DurationVar(&r.period, "period", time.Minute, "period")
	flag.Parse()
	if r.burst == 0 {
		r.burst = r.limit
	}
	if r.key != "user" && r.key != "ip" && r.key != "global" || *pipelines < 1 || *timeout <= 0 {
		fatal(errors.New("want -key user|ip|global, -pipelines >= 1 and -timeout > 0"))
	}
	rdb := redis.NewClient(&redis.Options{Addr: *addr, ContextTimeoutEnabled: true})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	l, err := newLimiter(ctx, rdb, r, *timeout, *pipelines)
	cancel()
	if err != nil {
		fatal(err)
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		fatal(err)
	}
	srv := &fasthttp.Server{Handler: l.serve, Name: "minimal", NoDefaultServerHeader: true, NoDefaultContentType: true,
		ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	select {
	case err := <-errc:
		fatal(err)
	case <-sigs:
		_ = srv.Shutdown()
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "minimal:", err)
	os.Exit(1)
}

func (l *limiter) serve(ctx *fasthttp.RequestCtx) {
	switch string(ctx.Path()) {
	case "/auth":
		l.auth(ctx)
	case "/metrics":
		fmt.Fprintf(ctx, "minimal_undecided_total %d\n", l.undecided.Load())
	default:
		ctx.SetStatusCode(fasthttp.StatusNotFound)
	}
}

func (l *limiter) auth(ctx *fasthttp.RequestCtx) {
	h := &ctx.Request.Header
	if len(h.PeekBytes(hdrURI)) == 0 {
		ctx.Error("missing X-Original-URI\n", fasthttp.StatusBadRequest)
		return
	}
	c := l.calls.Get().(*call)
	c.buf = append(c.buf[:0], l.r.prefix...)
	if u := h.PeekBytes(hdrUser); l.r.key == "user" && len(u) > 0 {
		if len(u) > 256 {
			ctx.Error("X-User-Id longer than 256 bytes\n", fasthttp.StatusBadRequest)
			l.calls.Put(c)
			return
		}
		c.buf = append(append(c.buf, ":u:"...), u...)
	} else if l.r.key != "global" {
		ip, err := netip.ParseAddr(string(h.PeekBytes(hdrIP)))
		if err != nil {
			ctx.Error("missing or invalid X-Real-IP\n", fasthttp.StatusBadRequest)
			l.calls.Put(c)
			return
		}
		if ip = ip.Unmap(); ip.Is6() {
			ip = netip.PrefixFrom(ip, 64).Masked().Addr()
		}
		c.buf = ip.AppendTo(append(c.buf, ":i:"...))
	}
	c.keys[0], c.err = string(c.buf), nil
	c.deadline = time.Now().Add(l.timeout)
	c.timer.Reset(l.timeout)
	select {
	case l.queue <- c:
		select {
		case <-c.done:
			c.timer.Stop()
			if c.err == nil && len(c.res) == 4 {
				l.respond(ctx, c)
				l.calls.Put(c)
				return
			}
		case <-c.timer.C:
			c = nil // the runner still holds it: left to the GC
		}
	case <-c.timer.C:
	}
	// Not decided in time, or Redis failed: allowed, and counted.
	l.undecided.Add(1)
	ctx.Response.Header.SetCanonical(hdrStatus, valUnavailable)
	ctx.SetStatusCode(fasthttp.StatusNoContent)
	if c != nil {
		l.calls.Put(c)
	}
}

func (l *limiter) respond(ctx *fasthttp.RequestCtx, c *call) {
	rh := &ctx.Response.Header
	rem, reset := max(c.res[1], 0), (c.res[2]+999)/1000
	rh.SetCanonical(hdrPolicy, l.policy)
	b := append(append(c.buf[:0], l.sfn...), ";r="...)
	b = append(strconv.AppendInt(b, rem, 10), ";t="...)
	rh.SetCanonical(hdrRateLimit, strconv.AppendInt(b, reset, 10))
	rh.SetCanonical(hdrLimit, l.limit)
	rh.SetCanonical(hdrRemaining, strconv.AppendInt(b[:0], rem, 10))
	rh.SetCanonical(hdrReset, strconv.AppendInt(b[:0], reset, 10))
	c.buf = b
	if c.res[0] == 1 {
		ctx.SetStatusCode(fasthttp.StatusNoContent)
		return
	}
	rh.SetCanonical(hdrRetry, strconv.AppendInt(b[:0], max((c.res[3]+999)/1000, 1), 10))
	ctx.SetStatusCode(fasthttp.StatusTooManyRequests)
}

// run sends whatever is queued (up to 128 calls) as one pipeline, and again.
func (l *limiter) run() {
	batch, cmds := make([]*call, 0, 128), make([]*redis.Cmd, 0, 128)
	for c := range l.queue {
		batch = append(batch[:0], c)
	fill:
		for len(batch) < cap(batch) {
			select {
			case c := <-l.queue:
				batch = append(batch, c)
			default:
				break fill
			}
		}
		now, last, live := time.Now(), time.Time{}, batch[:0]
		for _, c := range batch {
			if !c.deadline.After(now) { // its caller has given up: never sent
				c.err = errExpired
				c.done <- struct{}{}
				continue
			}
			if c.deadline.After(last) {
				last = c.deadline
			}
			live = append(live, c)
		}
		if len(live) == 0 {
			continue
		}
		ctx, cancel := context.WithDeadline(context.Background(), last)
		pipe := l.rdb.Pipeline()
		cmds = cmds[:0]
		for _, c := range live {
			cmds = append(cmds, l.script.EvalSha(ctx, pipe, c.keys[:], l.args...))
		}
		_, _ = pipe.Exec(ctx)
		cancel()
		reload := false
		for i, c := range live {
			c.res, c.err = cmds[i].Int64Slice()
			reload = reload || redis.HasErrorPrefix(c.err, "NOSCRIPT")
		}
		if reload { // Redis lost its scripts (a restart, SCRIPT FLUSH): these calls failed, the next will not
			ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
			_ = l.script.Load(ctx, l.rdb).Err()
			cancel()
		}
		for _, c := range live {
			c.done <- struct{}{}
		}
	}
}
