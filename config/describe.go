package config

import (
	"fmt"
	"regexp/syntax"
	"strings"
	"time"

	"github.com/rategate/rategate/internal/redact"
	"github.com/rategate/rategate/limits"
)

// nginxWaitMargin is the longest redis.timeout that leaves rategate time
// to answer by the local fallback within the 250ms the shipped NGINX
// configs wait for it.
const nginxWaitMargin = 200 * time.Millisecond

// Describe returns the configuration as `rategate -check` prints it: the
// source, the store, the failure mode, the identity headers and one block per
// rule with every effective value (defaults filled in). Secrets (passwords,
// the admin token) are never printed.
func (c *Config) Describe() string {
	var b strings.Builder
	line := func(label, format string, args ...any) {
		fmt.Fprintf(&b, "%-14s %s\n", label+":", fmt.Sprintf(format, args...))
	}
	line("source", "%s", c.Source)
	if c.Listen != "" {
		line("listen", "%s", c.Listen)
	}
	if c.Admin.Listen != "" {
		line("admin listen", "%s", c.Admin.Listen)
	}
	if c.Admin.Token != "" {
		line("admin token", "set (admin calls need \"Authorization: Bearer <token>\")")
	}
	if c.LogLevel != "" {
		line("log level", "%s", c.LogLevel)
	}
	line("store", "%s", c.Redis.describe())
	if c.Redis.URL != "" || len(c.Redis.ClusterAddrs) > 0 || c.Redis.Sentinel.Master != "" {
		if c.Redis.Timeout > nginxWaitMargin {
			line("warning", "redis.timeout %s: the shipped NGINX configs wait 250ms for rategate (proxy_read_timeout), "+
				"so a slow Redis would let requests through NGINX as rategate unavailable before the local fallback answers; "+
				"keep it at %s or less, or raise proxy_read_timeout with it", FormatDuration(c.Redis.Timeout), FormatDuration(nginxWaitMargin))
		}
		line("coalesce", "%s", c.Redis.describeCoalesce())
		if c.Redis.Functions {
			line("scripts", "FCALL of the function library on servers that run Redis Functions, EVALSHA on the others")
		} else {
			line("scripts", "EVALSHA (redis.functions: false)")
		}
		if c.DenyCache.Enabled {
			line("deny cache", "up to %d identities denied by Redis answered locally until their retry time", c.DenyCache.MaxEntries)
		} else {
			line("deny cache", "off")
		}
	}
	mode := c.FailureMode.String()
	switch c.FailureMode {
	case limits.FailAllow:
		mode += " (store unreachable: admit every request)"
	case limits.FailDeny:
		mode += " (store unreachable: answer 503)"
	case limits.FailLocal:
		mode += fmt.Sprintf(" (store unreachable: per-process limits divided by local_share %d)", c.LocalShare)
	}
	line("failure mode", "%s", mode)
	line("deny status", "%d", c.DenyStatus)
	id := &c.Identity
	proxies := make([]string, len(id.TrustedProxies))
	for i, p := range id.TrustedProxies {
		proxies[i] = p.String()
	}
	trusted := strings.Join(proxies, ", ")
	if trusted == "" {
		trusted = "none"
	}
	anon := "keyed by client IP"
	if id.Anonymous == limits.AnonymousSkip {
		anon = "skip rules keyed on user"
	}
	ipv6 := fmt.Sprintf("each IPv6 client is its /%d", id.IPv6Prefix)
	if id.IPv6Prefix >= 128 {
		ipv6 = "each IPv6 address is its own client"
	}
	line("identity", "user %s, ip %s (trusted proxies: %s; %s), anonymous users: %s", id.UserHeader, id.IPHeader, trusted, ipv6, anon)
	if id.PathParams == limits.StripPathParams {
		line("routes", "path parameters stripped: /admin;jsessionid=1 and /x/..;/admin count as /admin")
	}
	cost := "off"
	if id.CostHeader != "" {
		cost = fmt.Sprintf("%s (at most %d)", id.CostHeader, id.MaxCost)
	}
	line("headers", "uri %s (else url %s), method %s, host %s, cost %s, request id %s",
		id.URIHeader, id.URLHeader, id.MethodHeader, id.HostHeader, cost, id.RequestIDHeader)
	line("overrides", "up to %d runtime identity overrides, all rules together (PUT /v1/rules/{rule}/identities)", c.IdentityOverrides.MaxEntries)
	switch {
	case !c.RulesListed:
		line("rules", "none: the file has no rules list (every request is allowed; a reload to this file is refused while rules run, \"rules: []\" is not)")
	case len(c.Rules) == 0:
		line("rules", "none (every request is allowed)")
	default:
		line("rules", "%d, every matching rule is evaluated", len(c.Rules))
	}
	for _, r := range c.Rules {
		b.WriteByte('\n')
		describeRule(&b, r)
	}
	return b.String()
}

func (r *Redis) describe() string {
	switch {
	case r.URL != "":
		return fmt.Sprintf("redis %s, key prefix %q, timeout %s", redact.URL(r.URL), r.KeyPrefix, FormatDuration(r.Timeout))
	case len(r.ClusterAddrs) > 0:
		return fmt.Sprintf("redis cluster %s, key prefix %q, timeout %s", strings.Join(r.ClusterAddrs, ", "), r.KeyPrefix, FormatDuration(r.Timeout))
	case r.Sentinel.Master != "":
		return fmt.Sprintf("redis sentinel master %q via %s, key prefix %q, timeout %s", r.Sentinel.Master, strings.Join(r.Sentinel.Addrs, ", "), r.KeyPrefix, FormatDuration(r.Timeout))
	}
	return "in-memory (no redis configured: limits hold per process)"
}

// describeCoalesce says how decisions share round trips to Redis.
func (r *Redis) describeCoalesce() string {
	c := r.Coalesce
	if !c.Enabled {
		return "off (one round trip per decision)"
	}
	s := fmt.Sprintf("up to %d pipelines in flight, at most %d decisions each", c.Pipelines, c.MaxBatch)
	if c.Wait > 0 {
		s += ", under load waiting up to " + FormatDuration(c.Wait) + " for more"
	}
	if c.Pipelines > 1 && c.OverlapAfter > 0 {
		s += ", another alongside once those in flight have waited " + FormatDuration(c.OverlapAfter)
	}
	return s
}

func describeRule(b *strings.Builder, r *limits.Rule) {
	field := func(label, format string, args ...any) {
		fmt.Fprintf(b, "  %-11s %s\n", label+":", fmt.Sprintf(format, args...))
	}
	fmt.Fprintf(b, "rule %q\n", r.Name)
	field("match", "%s", r.Match.String())
	if len(r.Key) == 0 {
		field("key", "none (one global counter)")
	} else {
		parts := make([]string, len(r.Key))
		for i, p := range r.Key {
			parts[i] = p.String()
		}
		field("key", "%s", strings.Join(parts, ", "))
	}
	field("algorithm", "%s", r.Algorithm)
	field("limit", "%d per %s", r.Limit, FormatDuration(r.Period))
	if q, w, scaled := limits.PolicyWindow(r.Limit, r.Period); scaled {
		field("warning", "the period %s is not a whole number of seconds, which RateLimit-Policy needs: it says q=%d;w=%d (%d periods of %s: the same rate, stated over %ds)",
			FormatDuration(r.Period), q, w, q/r.Limit, FormatDuration(r.Period), w)
	}
	if re := r.Match.PathRegex; re != nil && !anchored(re.String()) {
		field("warning", "match.path regex %q is not anchored with ^: it runs along the whole of every route, and a client chooses routes of up to NGINX's 8 KB; "+
			"anchor it (\"~^/...\") where the route's start says enough, so most routes are refused at their first bytes", re.String())
	}
	if r.Algorithm.UsesBurst() {
		field("burst", "%d", r.Burst)
	} else {
		field("burst", "none (%s counts up to the limit)", r.Algorithm)
	}
	field("cost", "%d", r.Cost)
	if r.Shadow {
		field("shadow", "yes (evaluated and reported, never denies)")
	} else {
		field("shadow", "no")
	}
	if r.Adaptive != nil {
		describeAdaptive(field, r.Adaptive)
	}
	describeExceptions(b, r)
	if r.Lease {
		field("lease", "yes (each instance spends slices of the quota leased from the store, never over the limit)")
	}
}

// anchored reports whether the regex expr can only match at the start of
// the route (^ or \A first in every alternative), so that a route is
// refused once its first bytes do not fit.
func anchored(expr string) bool {
	re, err := syntax.Parse(expr, syntax.Perl)
	if err != nil {
		return false
	}
	return startsAnchored(re.Simplify())
}

func startsAnchored(re *syntax.Regexp) bool {
	switch re.Op {
	case syntax.OpBeginText:
		return true
	case syntax.OpConcat, syntax.OpCapture:
		return len(re.Sub) > 0 && startsAnchored(re.Sub[0])
	case syntax.OpAlternate:
		for _, s := range re.Sub {
			if !startsAnchored(s) {
				return false
			}
		}
		return true
	}
	return false
}
