// Command rategate is a rate-limit decision service for NGINX auth_request.
// See README.md and docs/ for usage and the contract.
//
// main is flags, the environment, the config file, -check, -version, the
// logger and signals; package app wires and runs everything else.
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
	"runtime"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/rs/zerolog"

	"github.com/rategate/rategate/admincli"
	"github.com/rategate/rategate/app"
	"github.com/rategate/rategate/config"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3";
// without it the module's build info says.
var version = ""

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
	adminToken  string
	check       bool
	version     bool
	watch       bool
	pprof       bool
}

const usageText = `usage:
  rategate [-config FILE] [-listen ADDR] [-admin-listen ADDR] [-redis URL] [-log-level LEVEL] [-watch] [-pprof]
  rategate -check -config FILE     validate the config, print the effective rules, exit 0 (valid) or 2 (invalid)
  rategate -version                print the version and exit
  rategate admin [flags] COMMAND   the admin API's client: rules, override, identity, key, reset, top, reload
                                   ("rategate admin help" lists its commands and flags)

Flags (each also from the environment; a flag wins over the environment,
which wins over the config file):
`

func main() {
	os.Exit(run(os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}

// parseOptions reads flags, then fills what no flag set from the environment.
func parseOptions(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("rategate", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usageText)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.configPath, "config", "", "YAML config `file` (env RATEGATE_CONFIG); none = built-in example policy")
	fs.StringVar(&o.listen, "listen", "", "decision listener `addr` (env RATEGATE_LISTEN; default :8080)")
	fs.StringVar(&o.adminListen, "admin-listen", "", "admin listener `addr` (env RATEGATE_ADMIN_LISTEN; default 127.0.0.1:9090)")
	fs.StringVar(&o.redisURL, "redis", "", "Redis `URL` redis://host:port/db (env RATEGATE_REDIS_URL); none = in-memory store")
	fs.StringVar(&o.logLevel, "log-level", "", "trace|debug|info|warn|error (env RATEGATE_LOG_LEVEL; default info)")
	fs.BoolVar(&o.check, "check", false, "validate the config, print the effective rules, exit 0 (valid) or 2 (invalid)")
	fs.BoolVar(&o.version, "version", false, "print the version and exit")
	fs.BoolVar(&o.watch, "watch", false, "reload the config file whenever its content changes (env RATEGATE_WATCH=1)")
	fs.BoolVar(&o.pprof, "pprof", false, "serve Go profiles on the admin listener under /debug/pprof/ (env RATEGATE_PPROF=1)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q (the admin client is \"rategate admin COMMAND\")", fs.Arg(0))
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
	o.adminToken = getenv("RATEGATE_ADMIN_TOKEN")
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

// buildVersion is -ldflags' version, else the module's ("(devel)" for a
// plain go build), with the VCS revision when the build recorded one.
func buildVersion() string {
	v := version
	bi, ok := debug.ReadBuildInfo()
	if v == "" && ok {
		v = bi.Main.Version
	}
	if v == "" {
		v = "(devel)"
	}
	if ok {
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" && len(s.Value) >= 12 && !strings.Contains(v, s.Value[:12]) {
				v += "+" + s.Value[:12]
			}
		}
	}
	return v
}

func loadConfig(path string) (*config.Config, error) {
	if path == "" {
		return config.Example(), nil
	}
	return config.Load(path)
}

func run(args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	if len(args) > 0 && args[0] == "admin" {
		return admincli.Run(args[1:], getenv, stdout, stderr)
	}
	o, err := parseOptions(args, getenv, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		fmt.Fprintln(stderr, "rategate:", err)
		return exitInvalid
	}
	if o.version {
		fmt.Fprintf(stdout, "rategate %s (%s)\n", buildVersion(), runtime.Version())
		return exitOK
	}
	cfg, err := loadConfig(o.configPath)
	if err != nil {
		fmt.Fprintln(stderr, err)
		return exitInvalid
	}
	if o.check {
		fmt.Fprint(stdout, effective(cfg, o).Describe())
		return exitOK
	}

	level, err := zerolog.ParseLevel(firstSet(o.logLevel, cfg.LogLevel, "info"))
	if err != nil || level == zerolog.NoLevel {
		fmt.Fprintf(stderr, "rategate: -log-level: unknown level %q (want trace, debug, info, warn or error)\n", o.logLevel)
		return exitInvalid
	}
	log := newLogger(stderr, level)
	redis.SetLogger(app.NewRedisLogger(log))

	if o.configPath == "" {
		log.Info().Int("rules", len(cfg.Rules)).Msg("no config file given: running the built-in example policy printed below (use -config FILE)")
		fmt.Fprint(stdout, effective(cfg, o).Describe())
	} else {
		log.Info().Str("config", o.configPath).Int("rules", len(cfg.Rules)).Msg("config loaded")
	}
	a, err := app.New(cfg, app.Options{
		ConfigPath: o.configPath, Listen: o.listen, AdminListen: o.adminListen, RedisURL: o.redisURL,
		AdminToken: o.adminToken, LogLevelFixed: o.logLevel != "", Watch: o.watch, Pprof: o.pprof,
		Version: buildVersion(), Log: log,
	})
	if err != nil {
		log.Error().Err(err).Msg("cannot open the store")
		return exitInvalid
	}
	defer a.Close()

	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	defer signal.Stop(sigs)
	go func() {
		for sig := range sigs {
			if sig == syscall.SIGHUP {
				_, _ = a.Reload("SIGHUP") // logged by Reload
				continue
			}
			log.Info().Str("signal", sig.String()).Msg("shutting down: finishing in-flight requests")
			stop()
			return
		}
	}()
	err = a.Run(ctx, func(net.Addr, net.Addr) {})
	switch {
	case errors.Is(err, app.ErrUnsafe):
		log.Error().Err(err).Msg("refusing to start")
		return exitInvalid
	case err != nil:
		log.Error().Err(err).Msg("rategate stopped")
		return exitFailure
	}
	log.Info().Msg("stopped")
	return exitOK
}

// effective is cfg as the process will run it, for -check and the start-up
// description: the flags and environment that win over the file applied.
func effective(cfg *config.Config, o options) *config.Config {
	e := *cfg
	if o.redisURL != "" {
		e.Redis.URL, e.Redis.ClusterAddrs, e.Redis.Sentinel = o.redisURL, nil, config.Sentinel{}
	}
	e.Listen = firstSet(o.listen, e.Listen)
	e.Admin.Listen = firstSet(o.adminListen, e.Admin.Listen)
	e.Admin.Token = firstSet(o.adminToken, e.Admin.Token)
	return &e
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

// newLogger writes JSON, or a human console format when w is a terminal.
func newLogger(w io.Writer, level zerolog.Level) zerolog.Logger {
	if f, ok := w.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			w = zerolog.ConsoleWriter{Out: f, TimeFormat: time.RFC3339}
		}
	}
	return zerolog.New(w).Level(level).With().Timestamp().Logger()
}
