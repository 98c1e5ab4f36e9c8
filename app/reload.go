package app

import (
	"errors"
	"fmt"
	"math/big"
	"reflect"
	"slices"

	"github.com/rategate/rategate/admin"
	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
)

// Reload re-reads the config file and applies everything that can be
// swapped safely while requests run: the rules (with the runtime overrides
// on top, in one atomic swap), failure_mode, local_share, memory_max_keys,
// deny_status, admin.token and the identity settings (a new decision
// handler is swapped in). A changed setting that takes a restart (a listener, anything about
// the store, the deny cache, the log level) is named field by field in the
// result and the log, and keeps its old value. An invalid file changes
// nothing; the error is config.Errors with every problem. So does a file
// without a rules list (an empty one, say) while rules run: it takes
// "rules: []" to remove them all.
func (a *App) Reload(trigger string) (admin.ReloadResult, error) {
	if a.opts.ConfigPath == "" {
		return admin.ReloadResult{}, admin.ErrNoConfigFile
	}
	a.cfgMu.Lock()
	defer a.cfgMu.Unlock()
	next, err := config.Load(a.opts.ConfigPath)
	if err == nil && !next.RulesListed && len(a.cfg.Rules) > 0 {
		// A file being written looks like this for a moment (an editor or
		// a tool that truncates, then writes): taken as is, it would stop
		// limiting everyone. Removing every rule has to be said.
		err = config.Errors{fmt.Errorf("%s: rules: missing (an empty file, or \"rules:\" with nothing under it) while %d rules run; "+
			"write \"rules: []\" to remove every rule", a.opts.ConfigPath, len(a.cfg.Rules))}
	}
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
	if addr, _ := a.openAdmin.Load().(string); addr != "" {
		if msg := openAdminTokenProblem(next.Admin.Token); msg != "" {
			// A file being rewritten, a template gone wrong: taken as
			// is, it would open overrides, resets and reloads to anyone
			// who reaches the port. Start refuses the same.
			err = config.Errors{fmt.Errorf("%s: admin.token: the admin API on %s is reachable beyond this host and would be left %s; keep a token of at least %d bytes (or set RATEGATE_ADMIN_TOKEN)",
				a.opts.ConfigPath, addr, msg, MinOpenAdminToken)}
		}
	}
	if err != nil {
		a.metrics.Reloaded(false)
		a.log.Error().Str("config", a.opts.ConfigPath).Str("trigger", trigger).Strs("errors", []string{err.Error()}).
			Msg("reload failed: keeping the running configuration; fix the file and reload again")
		return admin.ReloadResult{}, err
	}
	prev := a.cfg
	res := admin.ReloadResult{Source: a.opts.ConfigPath, Rules: len(next.Rules)}
	res.NeedRestart = a.needRestart(prev, next)
	// What needs a restart keeps its running value in the config in force,
	// so that the next reload compares against what really runs.
	keepRunning(prev, next)

	if fresh := freshCounts(prev.Rules, next.Rules); len(fresh) > 0 {
		a.log.Warn().Str("config", a.opts.ConfigPath).Strs("rules", fresh).
			Msg("reload starts these rules' counts from zero: every identity gets a fresh quota once (add the new rule beside the old one to avoid it; docs/algorithms.md)")
	}
	if mixed := disagreeingNumbers(prev.Rules, next.Rules); len(mixed) > 0 {
		a.log.Warn().Str("config", a.opts.ConfigPath).Strs("rules", mixed).
			Msg("reload changes these rules' numbers: until every instance runs the same file, instances with the old and the new numbers can together admit more than either (gcra, token_bucket, sliding_log); change them with PUT /v1/rules/{name}/override first (docs/algorithms.md, \"While instances disagree\")")
	}
	if p, n := prev.Identity.IPv6Prefix, next.Identity.IPv6Prefix; p != n {
		a.log.Warn().Str("config", a.opts.ConfigPath).Int("from", p).Int("to", n).
			Msg("identity.ipv6_prefix changed: IPv6 clients are other networks now, so their counts start from zero and their identity overrides stop applying (GET /v1/rules/{rule}/identities lists them)")
	}
	if p, n := prev.Identity.PathParams, next.Identity.PathParams; p != n {
		a.log.Warn().Str("config", a.opts.ConfigPath).Stringer("from", p).Stringer("to", n).
			Msg("identity.path_parameters changed: a route that carries path parameters (;...) is another route now, so its counts start from zero")
	}
	idChanged := identityChanges(prev.Identity, next.Identity)
	// Before the rules: their identity tables are built under it.
	a.rules.Identities().SetIPv6Prefix(next.Identity.IPv6Prefix)
	if next.DenyStatus != prev.DenyStatus || len(idChanged) > 0 {
		// A new decision handler, swapped in with the rules: a request
		// sees the old rules with the old settings or the new with the new.
		h := a.newHandler(next)
		res.Added, res.Removed, res.Changed = a.rules.SetFileWith(next.Rules, next.Source, h)
		a.handler.Store(h)
		a.admin.SetIPv6Prefix(next.Identity.IPv6Prefix)
		a.admin.SetPathParams(next.Identity.PathParams)
	} else {
		res.Added, res.Removed, res.Changed = a.rules.SetFile(next.Rules, next.Source)
	}
	if next.FailureMode != prev.FailureMode {
		a.limiter.SetFailureMode(next.FailureMode)
		res.Applied = append(res.Applied, "failure_mode")
	}
	if next.LocalShare != prev.LocalShare {
		a.limiter.SetLocalShare(next.LocalShare)
		res.Applied = append(res.Applied, "local_share")
	}
	if next.MemoryMaxKeys != prev.MemoryMaxKeys {
		for _, m := range a.memoryStores() {
			m.SetMaxKeys(next.MemoryMaxKeys)
		}
		res.Applied = append(res.Applied, "memory_max_keys")
	}
	if next.Admin.Token != prev.Admin.Token {
		a.admin.SetToken(next.Admin.Token)
		res.Applied = append(res.Applied, "admin.token")
	}
	if next.DenyStatus != prev.DenyStatus {
		res.Applied = append(res.Applied, "deny_status")
	}
	if next.IdentityOverrides != prev.IdentityOverrides {
		a.rules.Identities().SetMax(next.IdentityOverrides.MaxEntries)
		res.Applied = append(res.Applied, "identity_overrides.max_entries")
	}
	res.Applied = append(res.Applied, idChanged...)
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
	diff("redis.functions", pr.Functions, nr.Functions)
	pc, nc := pr.Coalesce, nr.Coalesce
	diff("redis.coalesce.enabled", pc.Enabled, nc.Enabled)
	diff("redis.coalesce.pipelines", pc.Pipelines, nc.Pipelines)
	diff("redis.coalesce.max_batch", pc.MaxBatch, nc.MaxBatch)
	diff("redis.coalesce.wait", pc.Wait, nc.Wait)
	diff("redis.coalesce.overlap_after", pc.OverlapAfter, nc.OverlapAfter)
	diff("deny_cache.enabled", prev.DenyCache.Enabled, next.DenyCache.Enabled)
	diff("deny_cache.max_entries", prev.DenyCache.MaxEntries, next.DenyCache.MaxEntries)
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
func identityChanges(p, n config.Identity) []string {
	var out []string
	for _, f := range []struct {
		name string
		same bool
	}{
		{"user_header", p.UserHeader == n.UserHeader},
		{"ip_header", p.IPHeader == n.IPHeader},
		{"trusted_proxies", slices.Equal(p.TrustedProxies, n.TrustedProxies)},
		{"anonymous", p.Anonymous == n.Anonymous},
		{"uri_header", p.URIHeader == n.URIHeader},
		{"url_header", p.URLHeader == n.URLHeader},
		{"method_header", p.MethodHeader == n.MethodHeader},
		{"host_header", p.HostHeader == n.HostHeader},
		{"cost_header", p.CostHeader == n.CostHeader},
		{"max_cost", p.MaxCost == n.MaxCost},
		{"request_id_header", p.RequestIDHeader == n.RequestIDHeader},
		{"ipv6_prefix", p.IPv6Prefix == n.IPv6Prefix},
		{"path_parameters", p.PathParams == n.PathParams},
	} {
		if !f.same {
			out = append(out, "identity."+f.name)
		}
	}
	if reflect.DeepEqual(p, n) != (len(out) == 0) {
		// A field this list does not know changed: say so rather than
		// apply it silently or not at all.
		out = append(out, "identity (a field this version cannot name)")
	}
	return out
}

// disagreeingNumbers names the rules a reload changes (algorithm and key
// kept) such that, while some instances still run the old numbers, the
// two sides together admit more than either alone: a sliding_log rule
// whose limit or period changes (the shorter period trims entries the
// longer one counts), and a gcra or token_bucket rule whose new numbers
// cross the old ones (a faster rate with a smaller burst, or a slower rate
// with a larger one: the fleet then admits up to the larger burst at the
// faster rate). A bucket's other changes hold: both sides read the record
// in units.
func disagreeingNumbers(prev, next []*limits.Rule) []string {
	var out []string
	for _, n := range next {
		if n.Algorithm == limits.FixedWindow || n.Algorithm == limits.SlidingWindow {
			continue
		}
		for _, p := range prev {
			if p.Name != n.Name || p.Algorithm != n.Algorithm || !slices.Equal(p.Key, n.Key) {
				continue
			}
			if p.Limit == n.Limit && p.Period == n.Period {
				continue
			}
			if n.Algorithm.UsesBurst() {
				// rates compared as limit/period, by cross-multiplying
				nr := new(big.Int).Mul(big.NewInt(n.Limit), big.NewInt(int64(p.Period)))
				pr := new(big.Int).Mul(big.NewInt(p.Limit), big.NewInt(int64(n.Period)))
				faster := nr.Cmp(pr)
				if !(faster > 0 && n.Burst < p.Burst || faster < 0 && n.Burst > p.Burst) {
					continue
				}
			}
			out = append(out, fmt.Sprintf("%s (%s %d/%v burst %d -> %d/%v burst %d)", n.Name, n.Algorithm, p.Limit, p.Period, p.Burst, n.Limit, n.Period, n.Burst))
		}
	}
	return out
}

// freshCounts names the rules that keep their name through a reload but
// not their keys: a new algorithm or key list starts their counts again.
func freshCounts(prev, next []*limits.Rule) []string {
	var out []string
	for _, n := range next {
		for _, p := range prev {
			if p.Name != n.Name {
				continue
			}
			if p.Algorithm != n.Algorithm {
				out = append(out, fmt.Sprintf("%s (algorithm %s -> %s)", n.Name, p.Algorithm, n.Algorithm))
			} else if !slices.Equal(p.Key, n.Key) {
				out = append(out, fmt.Sprintf("%s (key %v -> %v)", n.Name, p.Key, n.Key))
			}
		}
	}
	return out
}
