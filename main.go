// Command rategate is a rate-limit decision service for NGINX auth_request.
// See README.md and docs/ for usage and the contract.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/admin"
	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/handler"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/metrics"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1
	exitInvalid = 2
)

// options are the command line and environment, before the config file.
type options struct {
	configPath  string
	listen      string
	adminListen string
	redisURL    string
	logLevel    string
	check       bool
	watch       bool
	pprof       bool
}

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// parseOptions reads flags, then fills what no flag set from the environment.
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("rategate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.configPath, "config", "", "YAML config `file` (env RATEGATE_CONFIG); none = built-in example policy")
	fs.StringVar(&o.listen, "listen", "", "decision listener `addr` (env RATEGATE_LISTEN; default :8080)")
	fs.StringVar(&o.adminListen, "admin-listen", "", "admin listener `addr` (env RATEGATE_ADMIN_LISTEN; default 127.0.0.1:9090)")
	fs.StringVar(&o.redisURL, "redis", "", "Redis `URL` redis://host:port/db (env RATEGATE_REDIS_URL); none = in-memory store")
	fs.StringVar(&o.logLevel, "log-level", "", "trace|debug|info|warn|error (env RATEGATE_LOG_LEVEL; default info)")
	fs.BoolVar(&o.check, "check", false, "validate the config, print the effective rules, exit 0 (valid) or 2 (invalid)")
	fs.BoolVar(&o.watch, "watch", false, "reload the config file whenever its content changes (env RATEGATE_WATCH=1)")
	fs.BoolVar(&o.pprof, "pprof", false, "serve Go profiles on the admin listener under /debug/pprof/ (env RATEGATE_PPROF=1)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	fill := func(dst *string, env string) {
		if *dst == "" {
			*dst = getenv(env)
		}
	}
	fill(&o.configPath, "RATEGATE_CONFIG")
	fill(&o.listen, "RATEGATE_LISTEN")
	fill(&o.adminListen, "RATEGATE_ADMIN_LISTEN")
	fill(&o.redisURL, "RATEGATE_REDIS_URL")
	fill(&o.logLevel, "RATEGATE_LOG_LEVEL")
	o.watch = o.watch || envTrue(getenv("RATEGATE_WATCH"))
	o.pprof = o.pprof || envTrue(getenv("RATEGATE_PPROF"))
	return o, nil
}

// envTrue reports whether an environment switch is on.
func envTrue(v string) bool {
	switch strings.ToLower(v) {
	case "1", "true", "yes", "on":
		return true
	}
	return false
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

func loadConfig(path string) (*config.Config, error) {
	if path == "" {
		return config.Example(), nil
	}
	return config.Load(path)
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "admin" {
		return admin.RunCLI(args[1:], getenv, stdout, stderr)
	}
	o, err := parseOptions(args, getenv, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintln(stderr, "rategate:", err)
		return exitInvalid
	}
	cfg, err := loadConfig(o.configPath)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
	if o.check {
		fmt.Fprint(stdout, cfg.Describe())
		return exitOK
	}
	// A token from the environment (a Kubernetes Secret, a compose
	// variable) wins over the file's, so it need not sit in a ConfigMap.
	if t := getenv("RATEGATE_ADMIN_TOKEN"); t != "" {
		cfg.Admin.Token = t
	}

	level, err := zerolog.ParseLevel(firstSet(o.logLevel, cfg.LogLevel, "info"))
	if err != nil || level == zerolog.NoLevel {
		fmt.Fprintf(stderr, "rategate: -log-level: unknown level %q (want trace, debug, info, warn or error)\n", o.logLevel)
		return exitInvalid
	}
	log := newLogger(stderr, level)
	redis.SetLogger(redisLogger{log.Sample(&zerolog.BurstSampler{Burst: 1, Period: 10 * time.Second})})

	store, client, err := openStore(cfg, o.redisURL, log)
	if err != nil {
		log.Error().Err(err).Msg("cannot open the store")
		return exitInvalid
	}
	defer store.Close()
	// Every store call is timed and its errors counted by kind.
	m := metrics.New()
	if rs, ok := store.(*limits.RedisStore); ok {
		if _, on := rs.Coalescing(); on {
			stat := func(f func(limits.CoalesceStats) uint64) func() float64 {
				return func() float64 { st, _ := rs.Coalescing(); return float64(f(st)) }
			}
			m.AddCounterFunc("rategate_redis_pipelines_total",
				"Pipelines sent to Redis; rategate_redis_pipelined_calls_total / this = decisions per round trip.",
				stat(func(st limits.CoalesceStats) uint64 { return st.Pipelines }))
			m.AddCounterFunc("rategate_redis_pipelined_calls_total",
				"Script runs (decisions, or a cluster decision's slots) sent in pipelines.",
				stat(func(st limits.CoalesceStats) uint64 { return st.Calls }))
			m.AddCounterFunc("rategate_redis_pipeline_expired_total",
				"Script runs not sent because their decision's deadline passed while queued.",
				stat(func(st limits.CoalesceStats) uint64 { return st.Expired }))
		}
	}
	store = metrics.InstrumentStore(store, m)
	if client != nil {
		// A dead or frozen Redis must cost a request microseconds, not
		// redis.timeout: after consecutive failures the breaker answers at
		// once (failure_mode decides) and probes Redis in the background.
		breaker := limits.NewBreaker(store, limits.BreakerOptions{ProbeTimeout: cfg.Redis.Timeout, Logger: log})
		m.AddGaugeFunc("rategate_store_breaker_state",
			"Circuit breaker in front of Redis: 0 closed (deciding), 1 open (failure_mode answers), 2 half-open (trying).",
			func() float64 { return float64(breaker.State()) })
		store = breaker
	}

	if o.configPath == "" {
		log.Info().Int("rules", len(cfg.Rules)).Msg("no config file given: running the built-in example policy printed below (use -config FILE)")
		fmt.Fprint(stdout, cfg.Describe())
	} else {
		log.Info().Str("config", o.configPath).Int("rules", len(cfg.Rules)).Msg("config loaded")
	}

	limiter := limits.NewLimiter(store, cfg.Redis.KeyPrefix, cfg.Rules)
	if cfg.FailureMode == "local" {
		if _, isMem := metrics.Unwrap(store).(*limits.MemoryStore); !isMem {
			local := limits.NewMemoryStore()
			defer local.Close()
			limiter.SetFallback(local, cfg.LocalShare)
		}
	}

	// Operations: runtime overrides (in Redis when there is one), the
	// top-denied sketch, Redis health, the admin listener.
	bg, stopBG := context.WithCancel(context.Background())
	defer stopBG()

	// Identities Redis denied are answered here until their retry time.
	// Pointless on the in-memory store, which is already local.
	if cfg.DenyCache.Enabled && client != nil {
		dc := limits.NewDenyCache(cfg.DenyCache.MaxEntries)
		if err := limiter.SetDenyCache(dc); err != nil {
			log.Info().Err(err).Msg("deny cache off")
		} else {
			m.ObserveDenyCache(dc)
			// A key reset on any instance (DELETE /v1/keys/...) reaches
			// every instance's cache through pub/sub.
			go admin.NewRedisResets(client, cfg.Redis.KeyPrefix, dc, log).Run(bg)
		}
	}
	var overrides admin.OverrideStore = admin.NewMemoryOverrides()
	top := admin.NewTop()
	if client != nil {
		overrides = admin.NewRedisOverrides(client, cfg.Redis.KeyPrefix)
		top.SetShared(client, cfg.Redis.KeyPrefix)
		go m.PollRedis(bg, client, 5*time.Second, time.Second)
		go top.RunPublisher(bg, m.TopPublishFailed)
	}
	rules := admin.NewManager(admin.ManagerOptions{
		Path: o.configPath, Config: cfg, Limiter: limiter, Metrics: m, Overrides: overrides, Log: log,
	})
	go rules.Run(bg)
	if o.watch {
		if o.configPath == "" {
			log.Warn().Msg("-watch ignored: no config file in use")
		} else if err := admin.Watch(bg, o.configPath, log, func() { rules.Reload("file watch") }); err != nil {
			log.Error().Err(err).Msg("cannot watch the config file; reload with SIGHUP or POST /v1/reload")
		} else {
			log.Info().Str("config", o.configPath).Msg("watching the config file: changes are reloaded")
		}
	}

	hopts := handlerOptions(cfg, log)
	hopts.Observer = admin.Observer{Metrics: m, Top: top}
	h := handler.New(limiter, store, hopts)

	listen := firstSet(o.listen, cfg.Listen, ":8080")
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		log.Error().Err(err).Str("listen", listen).Msg("cannot listen")
		return exitFailure
	}
	// Timeouts, head size and connection limits against slow or hostile
	// clients; see handler.NewServer.
	srv := handler.NewServer(h, handler.ServerOptions{Logger: log})
	adminAddr := firstSet(o.adminListen, cfg.Admin.Listen, "127.0.0.1:9090")
	adminLn, err := net.Listen("tcp", adminAddr)
	if err != nil {
		ln.Close()
		log.Error().Err(err).Str("admin_listen", adminAddr).Msg("cannot listen for the admin API")
		return exitFailure
	}
	if cfg.Admin.Token == "" && !isLoopback(adminLn.Addr()) {
		// Overrides, resets and reloads from anyone who can reach the
		// port: refuse rather than warn.
		ln.Close()
		adminLn.Close()
		log.Error().Str("admin_listen", adminLn.Addr().String()).
			Msg("the admin API would be reachable beyond this host without a token: set admin.token (or RATEGATE_ADMIN_TOKEN), or listen on 127.0.0.1")
		return exitInvalid
	}
	adminSrv := &fasthttp.Server{
		Handler: admin.NewServer(admin.ServerOptions{
			Token: cfg.Admin.Token, Rules: rules, Limiter: limiter, Store: store, Metrics: m, Top: top, Log: log,
			Pprof: o.pprof,
		}).Serve,
		Name:                  "rategate-admin",
		ReadTimeout:           10 * time.Second,
		WriteTimeout:          30 * time.Second,
		IdleTimeout:           120 * time.Second,
		MaxRequestBodySize:    64 << 10,
		NoDefaultServerHeader: true,
		Logger:                fasthttpLogger{log},
	}

	serveErr := make(chan error, 2)
	go func() { serveErr <- srv.Serve(ln) }()
	go func() { serveErr <- adminSrv.Serve(adminLn) }()
	log.Info().Str("admin_listen", adminLn.Addr().String()).Bool("admin_token", cfg.Admin.Token != "").
		Msg("admin API ready: /metrics, /v1/rules, /v1/reload, /v1/keys/{rule}, /v1/top")
	log.Info().Str("listen", ln.Addr().String()).Str("store", store.Name()).
		Msgf("rategate ready; try: curl -i -H 'X-Original-URI: /login' -H 'X-Original-Method: POST' -H 'X-Real-IP: 203.0.113.7' http://%s/auth", dialAddr(ln.Addr()))

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	for {
		select {
		case err := <-serveErr:
			log.Error().Err(err).Msg("listener stopped")
			return exitFailure
		case sig := <-sigs:
			if sig == syscall.SIGHUP {
				rules.Reload("SIGHUP")
				continue
			}
			log.Info().Str("signal", sig.String()).Msg("shutting down: finishing in-flight requests")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err := srv.ShutdownWithContext(ctx)
			if aerr := adminSrv.ShutdownWithContext(ctx); err == nil {
				err = aerr
			}
			cancel()
			stopBG()
			if err != nil {
				log.Error().Err(err).Msg("shutdown did not finish in time")
				return exitFailure
			}
			log.Info().Msg("stopped")
			return exitOK
		}
	}
}

// isLoopback reports whether a listener only accepts connections from this host.
func isLoopback(a net.Addr) bool {
	t, ok := a.(*net.TCPAddr)
	return ok && t.IP.IsLoopback()
}

func handlerOptions(cfg *config.Config, log zerolog.Logger) handler.Options {
	id := cfg.Identity
	opts := handler.Options{
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
		DenyStatus:     cfg.DenyStatus,
		Timeout:        cfg.Redis.Timeout,
		FailureMode:    cfg.FailureMode,
		Logger:         log,
	}
	opts.RequestIDHeader = id.RequestIDHeader
	return opts
}

// openStore connects to Redis when a URL, cluster or sentinel is configured
// (the -redis flag / RATEGATE_REDIS_URL wins over the file), else returns the
// in-memory store and says so. The Redis client is returned too (nil for the
// memory store): overrides, the top-denied sketch and INFO use it.
func openStore(cfg *config.Config, redisURL string, log zerolog.Logger) (limits.Store, redis.UniversalClient, error) {
	rc := cfg.Redis
	o := limits.RedisOptions{Username: rc.Username, Password: rc.Password, Coalesce: limits.CoalesceOptions{
		Disabled:  !rc.Coalesce.Enabled,
		Pipelines: rc.Coalesce.Pipelines,
		MaxBatch:  rc.Coalesce.MaxBatch,
		Wait:      rc.Coalesce.Wait,
	}}
	tlsConf, err := redisTLS(rc.TLS)
	if err != nil {
		return nil, nil, err
	}
	o.TLS = tlsConf
	switch {
	case redisURL != "" || rc.URL != "":
		// redis://host:port/db, or go-redis's cluster (?addr=) and
		// Sentinel (?master_name=) URL forms.
		o.URL = firstSet(redisURL, rc.URL)
	case len(rc.ClusterAddrs) > 0:
		o.ClusterAddrs = rc.ClusterAddrs
	case rc.Sentinel.Master != "":
		o.SentinelMaster, o.SentinelAddrs = rc.Sentinel.Master, rc.Sentinel.Addrs
		o.SentinelUsername, o.SentinelPassword = rc.Sentinel.Username, rc.Sentinel.Password
	default:
		log.Info().Msg("no Redis configured: using the embedded in-memory store (limits are per process; set -redis redis://host:6379/0 to share them)")
		return limits.NewMemoryStore(), nil, nil
	}
	store, err := limits.OpenRedis(o)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := store.Ping(ctx); err != nil {
		log.Warn().Err(err).Str("store", store.Name()).Str("topology", string(store.Topology())).Str("failure_mode", cfg.FailureMode).
			Msg("Redis does not answer yet; serving by failure_mode until it does")
	} else {
		// Load the scripts everywhere now, so the first decisions fit redis.timeout.
		if err := store.Warm(ctx); err != nil {
			log.Warn().Err(err).Str("store", store.Name()).Msg("could not preload the scripts; the first decisions will load them")
		}
		log.Info().Str("store", store.Name()).Str("topology", string(store.Topology())).Msg("connected to Redis")
	}
	return store, store.Client(), nil
}

// redisTLS builds the TLS settings of redis.tls, or nil when it is off.
// Errors name the field whose file could not be used.
func redisTLS(t config.TLS) (*tls.Config, error) {
	if !t.Enabled {
		return nil, nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName, InsecureSkipVerify: t.InsecureSkipVerify}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("redis.tls.ca_file: %w", err)
		}
		c.RootCAs = x509.NewCertPool()
		if !c.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis.tls.ca_file: no PEM certificate in %q", t.CAFile)
		}
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("redis.tls.cert_file/key_file: %w", err)
		}
		c.Certificates = []tls.Certificate{cert}
	}
	return c, nil
}

// newLogger writes JSON, or a human console format when w is a terminal.
func newLogger(w io.Writer, level zerolog.Level) zerolog.Logger {
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			w = zerolog.ConsoleWriter{Out: f, TimeFormat: time.RFC3339}
		}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}

// redisLogger routes go-redis's own messages (failed dials, pool events)
// into the log as sampled warnings, instead of one unstructured stderr line
// per failed request while Redis is down.
type redisLogger struct{ log zerolog.Logger }

func (l redisLogger) Printf(_ context.Context, format string, args ...any) {
	l.log.Warn().Str("component", "go-redis").Msgf(format, args...)
}

// fasthttpLogger routes fasthttp's own messages (e.g. malformed requests)
// to zerolog at debug level: they are about clients, not about rategate.
type fasthttpLogger struct{ log zerolog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	l.log.Debug().Msgf(format, args...)
}

// dialAddr turns a listen address like [::]:8080 into one curl can use.
func dialAddr(a net.Addr) string {
	t, ok := a.(*net.TCPAddr)
	if !ok || t.IP.IsUnspecified() {
		if ok {
			return fmt.Sprintf("127.0.0.1:%d", t.Port)
		}
	}
	return a.String()
}
