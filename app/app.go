// Package app wires rategate together: it opens the store, builds the
// limiter with its breaker, local fallback and deny cache, the policy
// manager, metrics, the decision handler and the admin API, runs the two
// listeners and the background tasks, and reloads what can be swapped.
// It is the only package that knows every other one.
package app

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/limits/redisstore"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/admin"
	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/handler"
	"github.com/rategate/rategate/internal/lag"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/metrics"
	"github.com/rategate/rategate/policy"
	"github.com/rategate/rategate/top"
)

// Defaults of the listeners.
const (
	DefaultListen      = ":8080"
	DefaultAdminListen = "127.0.0.1:9090"
)

// adminMaxConns bounds the admin listener's connections (scrapes, the
// CLI, a dashboard or two; the main listener's bound is
// handler.DefaultMaxConns).
const adminMaxConns = 256

// epochEvery is how often each instance checks that Redis kept its data.
const epochEvery = time.Second

// shutdownGrace bounds a graceful shutdown: in-flight requests finish
// within it.
const shutdownGrace = 20 * time.Second

// Options are what the command line and environment say, on top of the
// config file (they win over it).
type Options struct {
	// ConfigPath is the config file; "" when running the built-in policy
	// (reload then answers admin.ErrNoConfigFile).
	ConfigPath string
	// Listen, AdminListen and RedisURL win over the file when set.
	Listen, AdminListen, RedisURL string
	// AdminToken (RATEGATE_ADMIN_TOKEN) wins over admin.token when set.
	AdminToken string
	// LogLevelFixed says the log level came from a flag or the
	// environment: the file's log_level is then not a reload question.
	LogLevelFixed bool
	// Watch reloads the config file when its content changes.
	Watch bool
	// Pprof serves Go profiles on the admin listener.
	Pprof bool
	// Version is rategate's version (rategate_build_info, -version).
	Version string
	Log     zerolog.Logger
}

// App is one rategate process.
type App struct {
	opts Options
	log  zerolog.Logger

	cfgMu sync.Mutex // serializes reloads; guards cfg
	cfg   *config.Config

	redis    *redisstore.Store // nil on the memory store
	lag      *lag.Monitor      // how late goroutines run (closed on the memory store)
	lagBound time.Duration     // the lag from which timeouts are put down to rategate (starved)
	store    limits.Store
	local    *memstore.Store // the local fallback (Redis only)
	breaker  *limits.Breaker
	limiter  *limits.Limiter
	metrics  *metrics.Metrics
	rules    *policy.Manager
	top      *top.Top
	observer observer
	handler  atomic.Pointer[handler.Handler]
	admin    *admin.Server
	resets   *redisstore.Resets // nil without a deny cache
	// openAdmin is the admin listener's address when it is reachable
	// beyond this host (empty on loopback, or before Run): a reload may
	// not leave it without a token that can guard it.
	openAdmin atomic.Value // string

	bg     context.Context
	stopBG context.CancelFunc
	wg     sync.WaitGroup
}

// New builds a rategate from a loaded configuration. It connects to Redis
// (without waiting for it: a Redis that is down is answered by the failure
// mode until it is up) and starts the background tasks, but does not
// listen: Run does. Close releases everything.
func New(cfg *config.Config, opts Options) (*App, error) {
	// As config does for admin.token: a client's credential is trimmed,
	// so the token is too (RATEGATE_ADMIN_TOKEN from a file ends in a
	// newline), and its white space does not count toward its length.
	opts.AdminToken = strings.TrimSpace(opts.AdminToken)
	cfg.Admin.Token = strings.TrimSpace(cfg.Admin.Token)
	a := &App{opts: opts, log: opts.Log, cfg: cfg}
	if opts.AdminToken != "" {
		cfg.Admin.Token = opts.AdminToken
	}
	a.bg, a.stopBG = context.WithCancel(context.Background())

	// A decision that times out while rategate itself waits for CPU says
	// nothing about Redis: the breakers do not count it (limits.Breaker,
	// Starved) once a goroutine waits a quarter of the decision budget to
	// run (a decision hands off four times or more).
	a.lag = lag.Start()
	a.lagBound = cfg.Redis.Timeout / 4 // redis.timeout takes a restart
	opened, err := openStore(cfg, opts.RedisURL, a.starved, a.log)
	if err != nil {
		a.lag.Close()
		a.stopBG()
		return nil, err
	}
	store, rs := opened.Store, opened.redis
	a.store, a.redis = store, rs
	if rs == nil {
		a.lag.Close() // no breaker to tell
	}
	adaptiveOpts, err := adaptiveOptions(rs, cfg.Redis.KeyPrefix)
	if err != nil {
		a.lag.Close()
		a.stopBG()
		store.Close()
		return nil, err
	}

	kind := metrics.ErrorKindFunc(nil)
	if rs != nil {
		kind = redisstore.ErrorKind
	}
	a.metrics = metrics.New(metrics.Options{ErrorKind: kind})
	if opts.Version != "" {
		a.metrics.SetVersion(opts.Version)
	}
	a.top = top.New()

	lo := limits.Options{
		Store:       store,
		Prefix:      cfg.Redis.KeyPrefix,
		Rules:       cfg.Rules,
		FailureMode: cfg.FailureMode,
		LocalShare:  cfg.LocalShare,
		Observer:    a.metrics,
	}
	var overrides policy.OverrideStore = policy.NewMemoryOverrides()
	var identities policy.IdentityStore = policy.NewMemoryIdentities()
	if rs != nil {
		a.wireRedis(cfg, rs, &lo)
		overrides = redisstore.NewOverrides(rs.Client(), cfg.Redis.KeyPrefix)
		identities = redisstore.NewIdentities(rs.Client(), cfg.Redis.KeyPrefix)
	} else {
		lo.Inspector = opened.memory
	}
	a.limiter = limits.New(lo)
	if lo.DenyCache != nil {
		a.metrics.ObserveDenyCache(lo.DenyCache)
	}
	a.metrics.ObserveMemoryEvictions(func() uint64 {
		var n uint64
		for _, m := range a.memoryStores() {
			n += m.Evictions()
		}
		return n
	})
	if lo.Leaser != nil {
		a.metrics.ObserveLeases(a.limiter)
		a.goBG(a.limiter.RunLeases)
	}

	a.rules = policy.NewManager(policy.ManagerOptions{
		Config: cfg, Limiter: a.limiter, Metrics: a.metrics, Overrides: overrides, Log: a.log,
		Adaptive:   adaptiveOpts,
		Identities: identities, MaxIdentities: cfg.IdentityOverrides.MaxEntries,
	})
	a.goBG(a.rules.Run)
	a.goBG(a.rules.RunAdaptive)
	a.goBG(a.rules.Identities().Run)
	exportAdaptive(a.metrics, a.rules)
	a.metrics.ObserveIdentities(a.identityCounts)
	if rs != nil {
		a.watchEpoch(rs, cfg.Redis.KeyPrefix, lo.DenyCache)
	}

	a.observer = observer{metrics: a.metrics, top: a.top}
	a.handler.Store(a.newHandler(cfg))
	var reloader admin.Reloader
	if opts.ConfigPath != "" {
		reloader = a
	}
	a.admin = admin.NewServer(admin.ServerOptions{
		Token: cfg.Admin.Token, Rules: a.rules, Limiter: a.limiter, Reloader: reloader,
		Metrics: a.metrics, Top: a.top, Log: a.log, Pprof: opts.Pprof, IPv6Prefix: cfg.Identity.IPv6Prefix,
		PathParams: cfg.Identity.PathParams,
	})

	if opts.Watch {
		if opts.ConfigPath == "" {
			a.log.Warn().Msg("-watch ignored: no config file in use")
		} else if err := policy.Watch(a.bg, opts.ConfigPath, a.log, func() { a.Reload("file watch") }); err != nil {
			a.log.Error().Err(err).Msg("cannot watch the config file; reload with SIGHUP or POST /v1/reload")
		} else {
			a.log.Info().Str("config", opts.ConfigPath).Msg("watching the config file: changes are reloaded")
		}
	}
	return a, nil
}

// wireRedis adds what a shared Redis store needs to the limiter's options:
// the breaker, the local fallback, the deny cache, and
// the background tasks and metrics that go with them.
func (a *App) wireRedis(cfg *config.Config, rs *redisstore.Store, lo *limits.Options) {
	m := a.metrics
	// A dead or frozen Redis must cost a request microseconds, not
	// redis.timeout: after consecutive failures the breaker answers at
	// once (failure_mode decides) and probes Redis in the background.
	a.breaker = limits.NewBreaker(rs.Ping, rs.Name(), limits.BreakerOptions{
		ProbeTimeout: cfg.Redis.Timeout, IsFailure: redisstore.IsStoreFailure, Logger: a.log,
		Starved: a.starved, IsTimeout: redisstore.IsTimeout,
	})
	m.AddGaugeFunc("rategate_scheduling_lag_seconds",
		"Worst delay of the last 250-500ms between a goroutine's wake-up time and its running: from a quarter of redis.timeout, timeouts do not open the store breaker.",
		func() float64 { return a.lag.Recent().Seconds() })
	m.AddCounterFunc("rategate_store_breaker_starved_total",
		"Failures that would have opened the store breaker but were timeouts while rategate was short of CPU.",
		func() float64 { return float64(a.breaker.Starved()) })
	m.AddGaugeFunc("rategate_store_breaker_state",
		"Circuit breaker in front of Redis: 0 closed (deciding), 1 open (failure_mode answers), 2 half-open (trying).",
		func() float64 { return float64(a.breaker.State()) })
	lo.Breaker = a.breaker
	// Rules with lease: true spend slices of their quota leased from
	// Redis (limits/lease.go).
	lo.Leaser = rs
	// The fallback decides a request the store could not: always when
	// one decision fails while Redis is up, and while it is down when
	// failure_mode is local.
	a.local = memstore.New()
	a.local.SetMaxKeys(cfg.MemoryMaxKeys)
	lo.Fallback = a.local
	lo.Inspector = rs

	if _, on := rs.Coalescing(); on {
		stat := func(f func(redisstore.CoalesceStats) uint64) func() float64 {
			return func() float64 { st, _ := rs.Coalescing(); return float64(f(st)) }
		}
		m.AddCounterFunc("rategate_redis_pipelines_total",
			"Pipelines sent to Redis; rategate_redis_pipelined_calls_total / this = decisions per round trip.",
			stat(func(st redisstore.CoalesceStats) uint64 { return st.Pipelines }))
		m.AddCounterFunc("rategate_redis_pipelined_calls_total",
			"Decisions (or a cluster decision's slots) sent in pipelines, one script call each or a batch in one decide_many call.",
			stat(func(st redisstore.CoalesceStats) uint64 { return st.Calls }))
		m.AddCounterFunc("rategate_redis_pipeline_expired_total",
			"Decisions (or slots) not sent because their deadline passed while queued.",
			stat(func(st redisstore.CoalesceStats) uint64 { return st.Expired }))
	}

	m.AddCounterFuncs("rategate_redis_refunds_total", "result", func() []metrics.LabeledValue {
		r := rs.Refunds()
		return []metrics.LabeledValue{{Label: "in_request", Value: float64(r.Refunded)},
			{Label: "background", Value: float64(r.Late)}, {Label: "lost", Value: float64(r.Lost)}}
	})
	m.AddCounterFuncs("rategate_redis_abandoned_decisions_total", "outcome", func() []metrics.LabeledValue {
		l := rs.Late()
		return []metrics.LabeledValue{{Label: "refunded", Value: float64(l.Refunded)},
			{Label: "clean", Value: float64(l.Clean)}, {Label: "unknown", Value: float64(l.Unknown)}}
	})

	// Identities Redis denied are answered here until their retry time.
	if cfg.DenyCache.Enabled {
		dc := limits.NewDenyCache(cfg.DenyCache.MaxEntries)
		lo.DenyCache = dc
		// A key reset on any instance (DELETE /v1/keys/...) reaches every
		// instance's cache through pub/sub.
		a.resets = redisstore.NewResets(rs.Client(), cfg.Redis.KeyPrefix, dc, a.log)
		a.goBG(a.resets.Run)
		// So does a refund: a denial Redis made between a commit and its
		// refund (a cluster decision that a later slot denied, a commit
		// whose caller gave up) counted the refunded units. Queued, not
		// sent from the request: one that cannot be sent becomes a clear
		// of every instance's cache (Resets).
		resets := a.resets
		rs.OnRefund(func(_ context.Context, key string) {
			dc.Forget(key)
			resets.Announce(key)
		})
		m.AddCounterFuncs("rategate_deny_cache_announcements_total", "result", func() []metrics.LabeledValue {
			st := resets.Stats()
			return []metrics.LabeledValue{{Label: "sent", Value: float64(st.Sent)}, {Label: "failed", Value: float64(st.Failed)}}
		})
		m.AddCounterFunc("rategate_deny_cache_clear_all_sent_total",
			"Messages sent that made every instance clear its deny cache, in place of key resets that could not be sent or queued.",
			func() float64 { return float64(resets.Stats().Clears) })
	}

	a.top.SetShared(redisstore.NewTop(rs.Client(), cfg.Redis.KeyPrefix))
	a.goBG(func(ctx context.Context) { a.top.RunPublisher(ctx, m.TopPublishFailed) })
	a.goBG(func(ctx context.Context) {
		rs.PollInfo(ctx, 5*time.Second, time.Second, func(info redisstore.Info, err error) {
			if err != nil {
				m.RedisDown()
				return
			}
			m.SetRedisInfo(metrics.RedisInfo(info))
		})
	})
}

// watchEpoch notices Redis losing its data by itself (FLUSHALL, a restart
// without persistence): cached denials derived from it are dropped, and
// the loss is logged once with what went with it.
func (a *App) watchEpoch(rs *redisstore.Store, prefix string, dc *limits.DenyCache) {
	epoch := rs.Epoch(prefix)
	a.goBG(func(ctx context.Context) {
		epoch.Run(ctx, epochEvery, func() {
			cleared := 0
			if dc != nil {
				cleared = dc.Len()
				dc.Clear()
			}
			// What the slices held was counted in the lost data: not
			// to be spent (nor given back into new counts).
			a.limiter.DropLeases()
			// The identity overrides' change counter may start again
			// and repeat numbers already applied: read them all.
			a.rules.Identities().Resync()
			a.log.Warn().Int("cached_denials_cleared", cleared).
				Msg("Redis lost its data (FLUSHALL, a restart without persistence, or a failover to an empty replica): counters start from zero, cached denials are dropped, and runtime overrides kept there are gone")
		})
	})
}

// newHandler builds the decision handler for cfg's identity settings and
// deny status. Reload builds a new one when those change and swaps it in.
func (a *App) newHandler(cfg *config.Config) *handler.Handler {
	id := cfg.Identity
	return handler.New(a.limiter, a.limiter, handler.Options{
		UserHeader:     id.UserHeader,
		IPHeader:       id.IPHeader,
		URIHeader:      id.URIHeader,
		URLHeader:      id.URLHeader,
		MethodHeader:   id.MethodHeader,
		HostHeader:     id.HostHeader,
		TrustedProxies: id.TrustedProxies,
		CostHeader:     id.CostHeader,
		MaxCost:        id.MaxCost,
		IPv6Prefix:     id.IPv6Prefix,
		PathParams:     id.PathParams,
		DenyStatus:     cfg.DenyStatus,
		Timeout:        cfg.Redis.Timeout,
		Logger:         a.log,
		Observer:       a.observer,
		Asked:          a.lag.Busy, // the lag monitor ticks while /auth requests come

		// NGINX's $request_id, quoted in denial log lines.
		RequestIDHeader: id.RequestIDHeader,
	})
}

// goBG runs f until the app closes.
func (a *App) goBG(f func(ctx context.Context)) {
	a.wg.Add(1)
	go func() {
		defer a.wg.Done()
		f(a.bg)
	}()
}

// Handler is the main listener's handler: /auth, /healthz, /readyz.
func (a *App) Handler() fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		// The handler goes with the rules (Reload swaps both at once):
		// deny_status and the identity settings are decided with the
		// rules they were loaded with.
		rs := a.limiter.RuleSet()
		h, _ := rs.Aux().(*handler.Handler)
		if h == nil {
			h = a.handler.Load()
		}
		h.ServeWith(ctx, rs)
	}
}

// AdminHandler is the admin listener's handler.
func (a *App) AdminHandler() fasthttp.RequestHandler { return a.admin.Serve }

// Limiter returns the limiter (tests and benchmarks).
func (a *App) Limiter() *limits.Limiter { return a.limiter }

// Rules returns the policy manager (tests).
func (a *App) Rules() *policy.Manager { return a.rules }

// Top returns the top-denied sketch (tests).
func (a *App) Top() *top.Top { return a.top }

// Metrics returns the metrics (tests and benchmarks).
func (a *App) Metrics() *metrics.Metrics { return a.metrics }

// StoreName describes the shared store.
func (a *App) StoreName() string { return a.store.Name() }

// starved reports whether this process has lately been too short of CPU
// for a timed-out decision to say anything about Redis: a goroutine
// waited a quarter of redis.timeout or more to run.
func (a *App) starved() bool { return a.lag.Recent() >= a.lagBound }

// memoryStores returns the in-memory stores: the store itself without
// Redis, the local fallback beside it.
func (a *App) memoryStores() []*memstore.Store {
	var out []*memstore.Store
	if m, ok := a.store.(*memstore.Store); ok {
		out = append(out, m)
	}
	if a.local != nil {
		out = append(out, a.local)
	}
	return out
}

// Run listens on the main and admin addresses and serves until ctx ends,
// then stops accepting, finishes in-flight requests (within 20 s) and
// returns. ready, when not nil, is called with both addresses once they
// listen.
func (a *App) Run(ctx context.Context, ready func(main, admin net.Addr)) error {
	cfg := a.config()
	listen := firstSet(a.opts.Listen, cfg.Listen, DefaultListen)
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return fmt.Errorf("listen %s: %w", listen, err)
	}
	adminAddr := firstSet(a.opts.AdminListen, cfg.Admin.Listen, DefaultAdminListen)
	adminLn, err := net.Listen("tcp", adminAddr)
	if err != nil {
		ln.Close()
		return fmt.Errorf("listen for the admin API on %s: %w", adminAddr, err)
	}
	if !isLoopback(adminLn.Addr()) {
		if msg := openAdminTokenProblem(cfg.Admin.Token); msg != "" {
			// Overrides, resets and reloads from anyone who can reach
			// (or guess their way into) the port: refuse rather than warn.
			ln.Close()
			adminLn.Close()
			return fmt.Errorf("%w: the admin API on %s would be reachable beyond this host %s: set admin.token (or RATEGATE_ADMIN_TOKEN) to a long random value (openssl rand -hex 16), or listen on 127.0.0.1", ErrUnsafe, adminLn.Addr(), msg)
		}
		// A reload must not make it so either (Reload).
		a.openAdmin.Store(adminLn.Addr().String())
	}
	// Timeouts, head size and connection limits against slow or hostile
	// clients; see handler.NewServer.
	srv := handler.NewServer(a.handler.Load(), handler.ServerOptions{Logger: a.log})
	srv.Handler = a.Handler()
	adminSrv := &fasthttp.Server{
		Handler:            a.AdminHandler(),
		Name:               "rategate-admin",
		ReadTimeout:        10 * time.Second,
		WriteTimeout:       30 * time.Second,
		IdleTimeout:        120 * time.Second,
		MaxRequestBodySize: admin.MaxBody,
		// Connections need no token to be held open: bounded, so that
		// idle ones cannot take every file descriptor (each is a 503
		// past the cap; the main listener has its own, handler.NewServer).
		Concurrency:           adminMaxConns,
		ErrorHandler:          admin.ErrorHandler,
		NoDefaultServerHeader: true,
		// A malformed request's raw head (its bearer token with it) is
		// neither logged nor echoed in the 400, as on the main listener.
		SecureErrorLogMessage: true,
		Logger:                handler.FasthttpLogger(a.log),
	}
	serveErr := make(chan error, 2)
	go func() { serveErr <- srv.Serve(handler.LingerListener(ln, acceptLogger(a.log, "main"))) }()
	// Lingering too: a client still sending a body over the limit reads
	// its 413 instead of a broken pipe.
	go func() { serveErr <- adminSrv.Serve(handler.LingerListener(adminLn, acceptLogger(a.log, "admin"))) }()
	a.log.Info().Str("admin_listen", adminLn.Addr().String()).Bool("admin_token", cfg.Admin.Token != "").
		Msg("admin API ready: /metrics, /v1/rules, /v1/reload, /v1/keys/{rule}, /v1/top")
	a.log.Info().Str("listen", ln.Addr().String()).Str("store", a.store.Name()).
		Msgf("rategate ready; try: curl -i -H 'X-Original-URI: /login' -H 'X-Original-Method: POST' -H 'X-Real-IP: 203.0.113.7' http://%s/auth", dialAddr(ln.Addr()))
	if ready != nil {
		ready(ln.Addr(), adminLn.Addr())
	}

	select {
	case err := <-serveErr:
		srv.Shutdown()
		adminSrv.Shutdown()
		return fmt.Errorf("listener stopped: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), shutdownGrace)
	defer cancel()
	err = srv.ShutdownWithContext(sctx)
	if aerr := adminSrv.ShutdownWithContext(sctx); err == nil {
		err = aerr
	}
	if err != nil {
		return fmt.Errorf("shutdown did not finish in time: %w", err)
	}
	return nil
}

// ErrUnsafe is Run's error for a configuration it refuses to serve.
var ErrUnsafe = errors.New("unsafe configuration")

// leaseReturnGrace bounds the return of leased slices at shutdown.
const leaseReturnGrace = 2 * time.Second

// Close stops the background tasks, gives back the leased slices this
// instance holds (so that the others can spend them), and closes the stores.
func (a *App) Close() {
	a.stopBG()
	a.wg.Wait()
	// Returns run even when no entry is held: an idle key's return that
	// failed (Redis down) waits for the sweeper's next try, which no longer
	// comes.
	keys, units := a.limiter.LeasesHeld()
	ctx, cancel := context.WithTimeout(context.Background(), leaseReturnGrace)
	back := a.limiter.ReturnLeases(ctx, 0)
	cancel()
	if keys > 0 || back > 0 {
		a.log.Info().Int("keys", keys).Int64("units_held", units).Int64("units_returned", back).
			Msg("leased slices given back")
	}
	if a.breaker != nil {
		a.breaker.Close()
		a.lag.Close()
	}
	if a.local != nil {
		a.local.Close()
	}
	a.store.Close()
}

// config returns the configuration in force.
func (a *App) config() *config.Config {
	a.cfgMu.Lock()
	defer a.cfgMu.Unlock()
	return a.cfg
}

// isLoopback reports whether a listener only accepts connections from this host.
func isLoopback(a net.Addr) bool {
	t, ok := a.(*net.TCPAddr)
	return ok && t.IP.IsLoopback()
}

// MinOpenAdminToken is the shortest admin token accepted on an admin
// listener reachable beyond this host: every wrong guess is a cheap 401,
// so the token is what keeps overrides, resets and reloads to their owner.
const MinOpenAdminToken = 16

// openAdminTokenProblem says why token cannot guard an admin listener
// reachable beyond this host ("" when it can).
func openAdminTokenProblem(token string) string {
	switch {
	case token == "":
		return "without a token"
	case len(token) < MinOpenAdminToken:
		return fmt.Sprintf("with a token of %d bytes (at least %d; a short one is guessed)", len(token), MinOpenAdminToken)
	}
	return ""
}

// firstSet returns the first non-empty value: flag/env, then file, then default.
func firstSet(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// dialAddr turns a listen address like [::]:8080 into one curl can use.
func dialAddr(a net.Addr) string {
	if t, ok := a.(*net.TCPAddr); ok && t.IP.IsUnspecified() {
		return fmt.Sprintf("127.0.0.1:%d", t.Port)
	}
	return a.String()
}
