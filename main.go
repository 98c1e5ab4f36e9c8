// Command rategate is a rate-limit decision service for NGINX auth_request.
// See README.md for usage and ../DESIGN.md for the contract.
package main

import (
	"context"
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

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/handler"
	"github.com/rategate/rategate/limits"
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
	return o, nil
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

	level, err := zerolog.ParseLevel(firstSet(o.logLevel, cfg.LogLevel, "info"))
	if err != nil || level == zerolog.NoLevel {
		fmt.Fprintf(stderr, "rategate: -log-level: unknown level %q (want trace, debug, info, warn or error)\n", o.logLevel)
		return exitInvalid
	}
	log := newLogger(stderr, level)

	store, err := openStore(cfg, o.redisURL, log)
	if err != nil {
		log.Error().Err(err).Msg("cannot open the store")
		return exitInvalid
	}
	defer store.Close()

	if o.configPath == "" {
		log.Info().Int("rules", len(cfg.Rules)).Msg("no config file given: running the built-in example policy printed below (use -config FILE)")
		fmt.Fprint(stdout, cfg.Describe())
	} else {
		log.Info().Str("config", o.configPath).Int("rules", len(cfg.Rules)).Msg("config loaded")
	}

	limiter := limits.NewLimiter(store, cfg.Redis.KeyPrefix, cfg.Rules)
	if cfg.FailureMode == "local" {
		if _, isMem := store.(*limits.MemoryStore); !isMem {
			local := limits.NewMemoryStore()
			defer local.Close()
			limiter.SetFallback(local, cfg.LocalShare)
		}
	}
	h := handler.New(limiter, store, handlerOptions(cfg, log))

	listen := firstSet(o.listen, cfg.Listen, ":8080")
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		log.Error().Err(err).Str("listen", listen).Msg("cannot listen")
		return exitFailure
	}
	srv := &fasthttp.Server{
		Handler:                       h.Serve,
		Name:                          "rategate",
		ReadTimeout:                   10 * time.Second,
		WriteTimeout:                  10 * time.Second,
		IdleTimeout:                   120 * time.Second,
		ReadBufferSize:                16 << 10,
		MaxRequestBodySize:            4 << 10,
		DisableHeaderNamesNormalizing: false,
		NoDefaultServerHeader:         true,
		NoDefaultContentType:          true,
		Logger:                        fasthttpLogger{log},
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
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
				reload(o.configPath, limiter, log)
				continue
			}
			log.Info().Str("signal", sig.String()).Msg("shutting down: finishing in-flight requests")
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			err := srv.ShutdownWithContext(ctx)
			cancel()
			if err != nil {
				log.Error().Err(err).Msg("shutdown did not finish in time")
				return exitFailure
			}
			log.Info().Msg("stopped")
			return exitOK
		}
	}
}

// reload re-reads the config file and swaps the rules atomically. An invalid
// file keeps the running rules.
func reload(path string, l *limits.Limiter, log zerolog.Logger) {
	if path == "" {
		log.Warn().Msg("reload requested but no config file is in use; keeping the built-in example policy")
		return
	}
	cfg, err := config.Load(path)
	if err != nil {
		log.Error().Str("config", path).Str("errors", err.Error()).Msg("reload failed: keeping the running rules; fix the file and reload again")
		return
	}
	l.SetRules(cfg.Rules)
	log.Info().Str("config", path).Int("rules", len(cfg.Rules)).Msg("config reloaded (rules only; redis, listeners and identity settings need a restart)")
}

func handlerOptions(cfg *config.Config, log zerolog.Logger) handler.Options {
	id := cfg.Identity
	return handler.Options{
		UserHeader:     id.UserHeader,
		IPHeader:       id.IPHeader,
		URIHeader:      id.URIHeader,
		MethodHeader:   id.MethodHeader,
		HostHeader:     id.HostHeader,
		TrustedProxies: id.TrustedProxies,
		CostHeader:     id.CostHeader,
		MaxCost:        id.MaxCost,
		DenyStatus:     cfg.DenyStatus,
		Timeout:        cfg.Redis.Timeout,
		FailureMode:    cfg.FailureMode,
		Logger:         log,
	}
}

// openStore connects to Redis when a URL, cluster or sentinel is configured
// (the -redis flag / RATEGATE_REDIS_URL wins over the file), else returns the
// in-memory store and says so.
func openStore(cfg *config.Config, redisURL string, log zerolog.Logger) (limits.Store, error) {
	rc := cfg.Redis
	var client limits.RedisClient
	var name string
	switch {
	case redisURL != "" || rc.URL != "":
		u := firstSet(redisURL, rc.URL)
		opt, err := redis.ParseURL(u)
		if err != nil {
			return nil, fmt.Errorf("redis url %q: %w", u, err)
		}
		if rc.Username != "" && opt.Username == "" {
			opt.Username = rc.Username
		}
		if rc.Password != "" && opt.Password == "" {
			opt.Password = rc.Password
		}
		opt.ContextTimeoutEnabled = true
		client, name = redis.NewClient(opt), "redis "+opt.Addr
	case len(rc.ClusterAddrs) > 0:
		client = redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: rc.ClusterAddrs, Username: rc.Username, Password: rc.Password, ContextTimeoutEnabled: true,
		})
		name = "redis cluster " + strings.Join(rc.ClusterAddrs, ",")
	case rc.Sentinel.Master != "":
		client = redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: rc.Sentinel.Master, SentinelAddrs: rc.Sentinel.Addrs, SentinelPassword: rc.Sentinel.Password,
			Username: rc.Username, Password: rc.Password, ContextTimeoutEnabled: true,
		})
		name = "redis sentinel " + rc.Sentinel.Master
	default:
		log.Info().Msg("no Redis configured: using the embedded in-memory store (limits are per process; set -redis redis://host:6379/0 to share them)")
		return limits.NewMemoryStore(), nil
	}
	store, err := limits.NewRedisStore(client, name)
	if err != nil {
		client.Close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := store.Ping(ctx); err != nil {
		log.Warn().Err(err).Str("store", name).Str("failure_mode", cfg.FailureMode).
			Msg("Redis does not answer yet; serving by failure_mode until it does")
	} else {
		log.Info().Str("store", name).Msg("connected to Redis")
	}
	return store, nil
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
