package app

import (
	"errors"
	"reflect"
	"slices"

	"github.com/rategate/rategate/admin"
	"github.com/rategate/rategate/config"
)

// Reload re-reads the config file and applies everything that can be
// swapped safely while requests run: the rules (with the runtime overrides
// on top, in one atomic swap), failure_mode, local_share, deny_status,
// admin.token and the identity settings (a new decision handler is swapped
// in). A changed setting that takes a restart (a listener, anything about
// the store, the deny cache, the log level) is named field by field in the
// result and the log, and keeps its old value. An invalid file changes
// nothing; the error is config.Errors with every problem.
func (a *App) Reload(trigger string) (admin.ReloadResult, error) {
	if a.opts.ConfigPath == "" {
		return admin.ReloadResult{}, admin.ErrNoConfigFile
	}
	a.cfgMu.Lock()
	defer a.cfgMu.Unlock()
	next, err := config.Load(a.opts.ConfigPath)
	if err != nil {
		a.metrics.Reloaded(false)
		ev := a.log.Error().Str("config", a.opts.ConfigPath).Str("trigger", trigger)
		var list config.Errors
		if errors.As(err, &list) {
			msgs := make([]string, len(list))
			for i, e := range list {
				msgs[i] = e.Error()
			}
			ev = ev.Strs("errors", msgs)
		} else {
			ev = ev.Strs("errors", []string{err.Error()})
		}
		ev.Msg("reload failed: keeping the running configuration; fix the file and reload again")
		return admin.ReloadResult{}, err
	}
	if a.opts.AdminToken != "" {
		next.Admin.Token = a.opts.AdminToken
	}
	prev := a.cfg
	res := admin.ReloadResult{Source: a.opts.ConfigPath, Rules: len(next.Rules)}
	res.NeedRestart = a.needRestart(prev, next)
	// What needs a restart keeps its running value in the config in force,
	// so that the next reload compares against what really runs.
	keepRunning(prev, next)

	res.Added, res.Removed, res.Changed = a.rules.SetFile(next.Rules, next.Source)
	if next.FailureMode != prev.FailureMode {
		a.limiter.SetFailureMode(next.FailureMode)
		res.Applied = append(res.Applied, "failure_mode")
	}
	if next.LocalShare != prev.LocalShare {
		a.limiter.SetLocalShare(next.LocalShare)
		res.Applied = append(res.Applied, "local_share")
	}
	if next.Admin.Token != prev.Admin.Token {
		a.admin.SetToken(next.Admin.Token)
		res.Applied = append(res.Applied, "admin.token")
	}
	if next.DenyStatus != prev.DenyStatus {
		res.Applied = append(res.Applied, "deny_status")
	}
	idChanged := identityChanges(prev.Identity, next.Identity)
	res.Applied = append(res.Applied, idChanged...)
	if next.DenyStatus != prev.DenyStatus || len(idChanged) > 0 {
		a.handler.Store(a.newHandler(next))
	}
	a.cfg = next
	a.metrics.Reloaded(true)

	ev := a.log.Info()
	msg := "config reloaded"
	if len(res.NeedRestart) > 0 {
		ev = a.log.Warn()
		msg = "config reloaded, except settings that take a restart: they keep their running values"
	}
	ev.Str("config", a.opts.ConfigPath).Str("trigger", trigger).Int("rules", res.Rules).
		Strs("added", res.Added).Strs("removed", res.Removed).Strs("changed", res.Changed).
		Strs("applied", res.Applied).Strs("need_restart", res.NeedRestart).Msg(msg)
	return res, nil
}

// needRestart lists the settings that differ between prev and next and a
// reload cannot apply. A value the command line or the environment sets
// (-listen, -redis, ...) is not the file's to change, so it is not listed.
func (a *App) needRestart(prev, next *config.Config) []string {
	var out []string
	diff := func(name string, p, n any) {
		if !reflect.DeepEqual(p, n) {
			out = append(out, name)
		}
	}
	if a.opts.Listen == "" {
		diff("listen", prev.Listen, next.Listen)
	}
	if a.opts.AdminListen == "" {
		diff("admin.listen", prev.Admin.Listen, next.Admin.Listen)
	}
	if !a.opts.LogLevelFixed {
		diff("log_level", prev.LogLevel, next.LogLevel)
	}
	pr, nr := prev.Redis, next.Redis
	if a.opts.RedisURL == "" {
		diff("redis.url", pr.URL, nr.URL)
		diff("redis.cluster_addrs", pr.ClusterAddrs, nr.ClusterAddrs)
		diff("redis.sentinel", pr.Sentinel, nr.Sentinel)
	}
	diff("redis.tls", pr.TLS, nr.TLS)
	diff("redis.username", pr.Username, nr.Username)
	diff("redis.password", pr.Password, nr.Password)
	diff("redis.key_prefix", pr.KeyPrefix, nr.KeyPrefix)
	diff("redis.timeout", pr.Timeout, nr.Timeout)
	for _, f := range structDiff(pr.Coalesce, nr.Coalesce) {
		out = append(out, "redis.coalesce."+f)
	}
	for _, f := range structDiff(prev.DenyCache, next.DenyCache) {
		out = append(out, "deny_cache."+f)
	}
	return out
}

// keepRunning copies into next the running values of everything a reload
// does not apply.
func keepRunning(prev, next *config.Config) {
	next.Listen, next.Admin.Listen, next.LogLevel = prev.Listen, prev.Admin.Listen, prev.LogLevel
	next.Redis = prev.Redis
	next.DenyCache = prev.DenyCache
}

// identityChanges names the identity fields that differ
// ("identity.user_header", ...).
func identityChanges(prev, next config.Identity) []string {
	var out []string
	for _, f := range structDiff(prev, next) {
		out = append(out, "identity."+f)
	}
	return out
}

// structDiff names the fields of two values of one struct type that
// differ, by their config-file name (the snake_case of the Go name).
func structDiff(a, b any) []string {
	va, vb := reflect.ValueOf(a), reflect.ValueOf(b)
	var out []string
	for i := 0; i < va.NumField(); i++ {
		if !reflect.DeepEqual(va.Field(i).Interface(), vb.Field(i).Interface()) {
			out = append(out, snake(va.Type().Field(i).Name))
		}
	}
	slices.Sort(out)
	return out
}

// snake turns a Go field name into its config key: MaxEntries ->
// max_entries, URIHeader -> uri_header, TrustedProxies -> trusted_proxies.
func snake(name string) string {
	var b []byte
	for i := 0; i < len(name); i++ {
		c := name[i]
		upper := 'A' <= c && c <= 'Z'
		if upper && i > 0 {
			prevLower := 'a' <= name[i-1] && name[i-1] <= 'z'
			nextLower := i+1 < len(name) && 'a' <= name[i+1] && name[i+1] <= 'z'
			if prevLower || nextLower && 'A' <= name[i-1] && name[i-1] <= 'Z' {
				b = append(b, '_')
			}
		}
		if upper {
			c += 'a' - 'A'
		}
		b = append(b, c)
	}
	return string(b)
}
