package config

import (
	"errors"
	"fmt"
	"math/bits"
	"net"
	"net/netip"
	"net/textproto"
	"net/url"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/rategate/rategate/limits"
)

// Bounds of the configuration.
const (
	// maxLimit bounds limit and burst.
	maxLimit = 1_000_000_000
	// maxSpan bounds a period, and the time a gcra or token_bucket bucket
	// takes to refill (burst*period/limit): 400 days in microseconds stays
	// far below 2^53, so the Redis scripts' double arithmetic is exact.
	maxSpan = 400 * 24 * time.Hour
	// maxCostLimit bounds identity.max_cost.
	maxCostLimit = 1_000_000
	maxTimeout   = 10 * time.Second

	// Bounds of redis.coalesce.
	maxPipelines = 256
	maxBatch     = 4096
)

// Defaults of the configuration.
const (
	defaultKeyPrefix    = "rg"
	defaultTimeout      = 50 * time.Millisecond
	defaultDenyStatus   = 429
	defaultUserHeader   = "X-User-Id"
	defaultIPHeader     = "X-Real-IP"
	defaultURIHeader    = "X-Original-URI"
	defaultURLHeader    = "X-Original-URL"
	defaultRequestID    = "X-Request-Id"
	defaultIPv6Prefix   = 64
	minIPv6Prefix       = 48
	defaultMethodHeader = "X-Original-Method"
	defaultHostHeader   = "X-Original-Host"
	defaultMaxCost      = 100
	defaultPipelines    = 2
	defaultOverlapAfter = time.Millisecond
	// defaultWait: a runner under load lingers up to this long for more
	// decisions (bench/README.md, "Lingering under load").
	defaultWait      = 50 * time.Microsecond
	defaultDenyCache = 100_000
	maxDenyCache     = 10_000_000
	// defaultMemoryKeys is memstore.DefaultMaxKeys (app's tests check).
	defaultMemoryKeys = 1_000_000
	maxMemoryKeys     = 100_000_000
	defaultMaxBatch   = 128
)

// defaultTrustedProxies returns the proxies trusted when identity.trusted_proxies is omitted.
func defaultTrustedProxies() []netip.Prefix {
	return []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}
}

var (
	ruleNameRE  = regexp.MustCompile(`^[a-z0-9_-]{1,64}$`)
	keyPrefixRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,32}$`)
	logLevels   = []string{"trace", "debug", "info", "warn", "error"}
)

// validate checks everything decoded into raw, reporting to d, and returns
// the compiled configuration (meaningful only when d has no problems).
func validate(d *decoder, raw *rawConfig) *Config {
	c := &Config{
		FailureMode:   limits.FailAllow,
		LocalShare:    1,
		DenyStatus:    defaultDenyStatus,
		MemoryMaxKeys: defaultMemoryKeys,
		DenyCache:     DenyCache{Enabled: true, MaxEntries: defaultDenyCache},
		Rules:         []*limits.Rule{},
	}
	if v := &raw.Listen; v.ok() {
		c.Listen = v.V
		if msg := checkListen(v.V); msg != "" {
			d.add(v.Line, "listen", "%s", msg)
		}
	}
	if v := &raw.LogLevel; v.ok() {
		c.LogLevel = strings.ToLower(v.V)
		if !slices.Contains(logLevels, c.LogLevel) {
			d.add(v.Line, "log_level", "must be one of %s; got %q", strings.Join(logLevels, ", "), v.V)
		}
	}
	validateRedis(d, &raw.Redis, &c.Redis)
	if v := &raw.FailureMode; v.ok() {
		m, ok := limits.ParseFailureMode(v.V)
		if !ok {
			d.add(v.Line, "failure_mode", "must be allow, deny or local, got %q", v.V)
		}
		c.FailureMode = m
	}
	if v := &raw.LocalShare; v.ok() {
		c.LocalShare = int(v.V)
		if msg := between(v.V, 1, maxLimit); msg != "" {
			d.add(v.Line, "local_share", "%s", msg)
		}
	}
	if v := &raw.MemoryKeys; v.ok() {
		c.MemoryMaxKeys = int(v.V)
		if msg := between(v.V, 1, maxMemoryKeys); msg != "" {
			d.add(v.Line, "memory_max_keys", "%s", msg)
		}
	}
	if v := &raw.DenyStatus; v.ok() {
		c.DenyStatus = int(v.V)
		if v.V != 429 && v.V != 403 {
			d.add(v.Line, "deny_status", "must be 429 or 403, got %d", v.V)
		}
	}
	if v := &raw.DenyCache.Enabled; v.ok() {
		c.DenyCache.Enabled = v.V
	}
	if v := &raw.DenyCache.MaxEntries; v.ok() {
		c.DenyCache.MaxEntries = int(v.V)
		if msg := between(v.V, 1, maxDenyCache); msg != "" {
			d.add(v.Line, "deny_cache.max_entries", "%s", msg)
		}
	}
	if v := &raw.Admin.Token; v.ok() {
		// The admin API trims the credential a client sends: a token
		// with white space around it (a newline from a file) would match
		// none, and the white space would count toward its length.
		c.Admin.Token = strings.TrimSpace(v.V)
	}
	if v := &raw.Admin.Listen; v.ok() {
		c.Admin.Listen = v.V
		if msg := checkListen(v.V); msg != "" {
			d.add(v.Line, "admin.listen", "%s", msg)
		}
	}
	validateIdentity(d, &raw.Identity, &c.Identity)
	validateIdentityOverrides(d, &raw.IdentityOvr, &c.IdentityOverrides)
	c.RulesListed = raw.Rules.V != nil
	if raw.Rules.ok() {
		names := map[string]int{}
		for i := range raw.Rules.V {
			rr := &raw.Rules.V[i]
			if rr.Bad {
				continue
			}
			r := compileRule(d, rr, i, names, &c.Identity)
			compileExceptions(d, rr, r, c.Identity)
			c.Rules = append(c.Rules, r)
		}
	}
	return c
}

func validateRedis(d *decoder, r *rawRedis, out *Redis) {
	out.KeyPrefix = defaultKeyPrefix
	out.Timeout = defaultTimeout
	var topologies []string
	if v := &r.URL; v.ok() && v.V != "" {
		topologies = append(topologies, "url")
		out.URL = v.V
		if msg := checkRedisURL(v.V); msg != "" {
			d.add(v.Line, "redis.url", "%s", msg)
		}
	}
	if v := &r.ClusterAddrs; v.ok() && len(v.V) > 0 {
		topologies = append(topologies, "cluster_addrs")
		out.ClusterAddrs = v.V
		checkAddrs(d, v, "redis.cluster_addrs")
	}
	if s := &r.Sentinel; !s.Bad && (s.Master.V != "" || len(s.Addrs.V) > 0 || s.Password.V != "") {
		topologies = append(topologies, "sentinel")
		out.Sentinel = Sentinel{Master: s.Master.V, Addrs: s.Addrs.V, Username: s.Username.V, Password: s.Password.V}
		if s.Master.V == "" && !s.Master.Bad {
			d.add(s.Line, "redis.sentinel.master", "is required when redis.sentinel is used")
		}
		if len(s.Addrs.V) == 0 && !s.Addrs.Bad {
			d.add(s.Line, "redis.sentinel.addrs", "needs at least one host:port when redis.sentinel is used")
		}
		checkAddrs(d, &s.Addrs, "redis.sentinel.addrs")
	}
	if len(topologies) > 1 {
		d.add(r.Line, "redis", "use only one of url, cluster_addrs and sentinel, got %s", strings.Join(topologies, " and "))
	}
	validateTLS(d, &r.TLS, &out.TLS)
	out.Username = r.Username.V
	out.Password = r.Password.V
	if v := &r.KeyPrefix; v.ok() {
		out.KeyPrefix = v.V
		if !keyPrefixRE.MatchString(v.V) {
			d.add(v.Line, "redis.key_prefix", "must match %s, got %q", keyPrefixRE, v.V)
		}
	}
	if v := &r.Timeout; v.ok() {
		out.Timeout = v.V
		switch {
		case v.V <= 0:
			d.add(v.Line, "redis.timeout", "must be > 0, got %s", FormatDuration(v.V))
		case v.V > maxTimeout:
			d.add(v.Line, "redis.timeout", "must be <= %s, got %s", FormatDuration(maxTimeout), FormatDuration(v.V))
		}
	}
	validateCoalesce(d, &r.Coalesce, &out.Coalesce, out.Timeout)
	out.Functions = true
	if v := &r.Functions; v.ok() {
		out.Functions = v.V
	}
}

// validateCoalesce checks redis.coalesce. Its wait and overlap_after are
// spent inside every decision's budget, so they must leave most of
// redis.timeout for Redis.
func validateCoalesce(d *decoder, c *rawCoalesce, out *Coalesce, timeout time.Duration) {
	half := timeout / 2
	wait := min(defaultWait, timeout/4)
	*out = Coalesce{Enabled: true, Pipelines: defaultPipelines, MaxBatch: defaultMaxBatch,
		Wait: wait, OverlapAfter: overlapDefault(half, wait)}
	if c.Bad {
		return
	}
	if v := &c.Enabled; v.ok() {
		out.Enabled = v.V
	}
	if v := &c.Pipelines; v.ok() {
		out.Pipelines = int(v.V)
		if v.V < 1 || v.V > maxPipelines {
			d.add(v.Line, "redis.coalesce.pipelines", "must be between 1 and %d, got %d", maxPipelines, v.V)
		}
	}
	if v := &c.MaxBatch; v.ok() {
		out.MaxBatch = int(v.V)
		if v.V < 1 || v.V > maxBatch {
			d.add(v.Line, "redis.coalesce.max_batch", "must be between 1 and %d, got %d", maxBatch, v.V)
		}
	}
	// Both are spent inside a decision's budget, one after the other (a
	// call may wait out a stalled pipeline, then the linger): each, and
	// their sum, at most half of redis.timeout. A default gives way to
	// the other one set long (a config that set only overlap_after, valid
	// while wait defaulted to 0, stays valid).
	okWait := inBudget(d, &c.Wait, &out.Wait, "redis.coalesce.wait", timeout)
	if !c.Overlap.Set {
		out.OverlapAfter = overlapDefault(half, out.Wait)
		return
	}
	okOverlap := inBudget(d, &c.Overlap, &out.OverlapAfter, "redis.coalesce.overlap_after", timeout)
	switch {
	case !okWait || !okOverlap:
		// reported by inBudget
	case !c.Wait.Set:
		// the default wait gives way to a long overlap_after
		out.Wait = max(min(out.Wait, half-out.OverlapAfter), 0)
	case out.Wait+out.OverlapAfter > half:
		d.add(c.Overlap.Line, "redis.coalesce.overlap_after", "plus wait (%s) must be at most half of redis.timeout (%s), got %s",
			FormatDuration(out.Wait), FormatDuration(timeout), FormatDuration(out.OverlapAfter))
	}
}

// overlapDefault is overlap_after when unset: its default, or less where
// wait leaves less of half of redis.timeout.
func overlapDefault(half, wait time.Duration) time.Duration {
	return max(min(defaultOverlapAfter, half-wait), 0)
}

// inBudget takes a wait spent inside a decision's budget into out, when
// set: at least 0, at most half of redis.timeout. It reports whether the
// value (set or not) is valid.
func inBudget(d *decoder, v *opt[time.Duration], out *time.Duration, field string, timeout time.Duration) bool {
	if v.Bad {
		return false
	}
	if !v.Set {
		return true
	}
	*out = v.V
	switch {
	case v.V < 0:
		d.add(v.Line, field, "must be >= 0, got %s", FormatDuration(v.V))
	case v.V > timeout/2:
		d.add(v.Line, field, "must be at most half of redis.timeout (%s), got %s", FormatDuration(timeout), FormatDuration(v.V))
	default:
		return true
	}
	return false
}

// validateTLS checks redis.tls. Files are named, not read: validation stays
// pure, and main reports a file it cannot load with the field's name.
func validateTLS(d *decoder, t *rawTLS, out *TLS) {
	if t.Bad {
		return
	}
	*out = TLS{Enabled: t.Enabled.V, CAFile: t.CAFile.V, CertFile: t.CertFile.V, KeyFile: t.KeyFile.V,
		ServerName: t.ServerName.V, InsecureSkipVerify: t.InsecureSkipVerify.V}
	if !out.Enabled {
		for _, f := range []struct {
			name string
			set  bool
			line int
		}{
			{"ca_file", out.CAFile != "", t.CAFile.Line}, {"cert_file", out.CertFile != "", t.CertFile.Line},
			{"key_file", out.KeyFile != "", t.KeyFile.Line}, {"server_name", out.ServerName != "", t.ServerName.Line},
			{"insecure_skip_verify", out.InsecureSkipVerify, t.InsecureSkipVerify.Line},
		} {
			if f.set {
				d.add(f.line, "redis.tls."+f.name, "has no effect without redis.tls.enabled: true")
			}
		}
		return
	}
	if (out.CertFile == "") != (out.KeyFile == "") {
		d.add(t.Line, "redis.tls", "cert_file and key_file go together (a client certificate needs both), got only %s",
			map[bool]string{true: "cert_file", false: "key_file"}[out.CertFile != ""])
	}
}

func checkAddrs(d *decoder, v *opt[[]string], path string) {
	for i, a := range v.V {
		if msg := checkHostPort(a); msg != "" {
			d.add(v.Line, fmt.Sprintf("%s[%d]", path, i), "%s", msg)
		}
	}
}

// checkRedisURL checks a redis:// URL the way go-redis will read it. The
// message never repeats the URL: it may hold a password.
func checkRedisURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Sprintf("is not a URL: %v", err)
	}
	switch u.Scheme {
	case "redis", "rediss":
	case "":
		return "must start with redis:// or rediss://"
	default:
		return fmt.Sprintf("scheme must be redis or rediss, got %q", u.Scheme)
	}
	if u.Hostname() == "" {
		return "has no host (redis://host:6379/0)"
	}
	if p := u.Port(); p != "" {
		if msg := checkPort(p, 1); msg != "" {
			return msg
		}
	}
	if db := strings.TrimPrefix(u.Path, "/"); db != "" {
		if n, err := strconv.Atoi(db); err != nil || n < 0 {
			return fmt.Sprintf("database must be a number such as /0, got %q", u.Path)
		}
	}
	return ""
}

// checkHostPort checks a Redis node address.
func checkHostPort(s string) string {
	host, port, err := net.SplitHostPort(s)
	if err != nil || host == "" {
		return fmt.Sprintf("%q is not host:port", s)
	}
	return checkPort(port, 1)
}

// checkListen checks a listen address; ":8080" and port 0 are fine.
func checkListen(s string) string {
	_, port, err := net.SplitHostPort(s)
	if err != nil || port == "" {
		return fmt.Sprintf("%q is not host:port (such as \":8080\" or \"127.0.0.1:8080\")", s)
	}
	return checkPort(port, 0)
}

func checkPort(p string, lowest int) string {
	n, err := strconv.Atoi(p)
	if err != nil || n < lowest || n > 65535 {
		return fmt.Sprintf("port must be a number from %d to 65535, got %q", lowest, p)
	}
	return ""
}

func validateIdentity(d *decoder, id *rawIdentity, out *Identity) {
	out.UserHeader = header(d, &id.UserHeader, "identity.user_header", defaultUserHeader, false)
	out.IPHeader = header(d, &id.IPHeader, "identity.ip_header", defaultIPHeader, false)
	out.URIHeader = header(d, &id.URIHeader, "identity.uri_header", defaultURIHeader, false)
	out.MethodHeader = header(d, &id.MethodHeader, "identity.method_header", defaultMethodHeader, false)
	out.HostHeader = header(d, &id.HostHeader, "identity.host_header", defaultHostHeader, false)
	out.CostHeader = header(d, &id.CostHeader, "identity.cost_header", "", true)
	out.URLHeader = header(d, &id.URLHeader, "identity.url_header", defaultURLHeader, false)
	out.RequestIDHeader = header(d, &id.RequestID, "identity.request_id_header", defaultRequestID, false)
	out.IPv6Prefix = defaultIPv6Prefix
	if v := &id.IPv6Prefix; v.ok() {
		out.IPv6Prefix = int(v.V)
		if v.V < minIPv6Prefix || v.V > 128 {
			out.IPv6Prefix = defaultIPv6Prefix
			d.add(v.Line, "identity.ipv6_prefix", "must be between %d and 128, got %d", minIPv6Prefix, v.V)
		}
	}
	if v := &id.TrustedProxies; v.ok() {
		out.TrustedProxies = make([]netip.Prefix, 0, len(v.V))
		for i, s := range v.V {
			p, ok := parsePrefix(s)
			if !ok {
				d.add(v.Line, fmt.Sprintf("identity.trusted_proxies[%d]", i), "%q is not an IP or CIDR", s)
				continue
			}
			out.TrustedProxies = append(out.TrustedProxies, p)
		}
	} else {
		out.TrustedProxies = defaultTrustedProxies()
	}
	if v := &id.PathParams; v.ok() {
		p, ok := limits.ParsePathParams(v.V)
		if !ok {
			d.add(v.Line, "identity.path_parameters", "must be keep or strip, got %q", v.V)
		}
		out.PathParams = p
	}
	if v := &id.Anonymous; v.ok() {
		switch v.V {
		case "ip":
			out.Anonymous = limits.AnonymousIP
		case "skip":
			out.Anonymous = limits.AnonymousSkip
		default:
			d.add(v.Line, "identity.anonymous", "must be ip or skip, got %q", v.V)
		}
	}
	out.MaxCost = defaultMaxCost
	if v := &id.MaxCost; v.ok() {
		out.MaxCost = v.V
		if msg := between(v.V, 1, maxCostLimit); msg != "" {
			d.add(v.Line, "identity.max_cost", "%s", msg)
		}
	}
}

// header validates and canonicalizes a header-name setting.
func header(d *decoder, v *opt[string], path, def string, emptyOK bool) string {
	if !v.ok() || (emptyOK && v.V == "") {
		return def
	}
	if !validToken(v.V) {
		d.add(v.Line, path, "%q is not a valid header name", v.V)
		return def
	}
	return textproto.CanonicalMIMEHeaderKey(v.V)
}

// parsePrefix reads a CIDR or a bare IP (a /32 or /128). An IPv4-mapped
// one (::ffff:198.51.100.7, ::ffff:10.0.0.0/104) is its IPv4 range, as
// /auth reads an IPv4-mapped client or hop as its IPv4 address: kept as
// an IPv6 range it would match none (a trusted proxy never trusted, every
// client counted as the proxy). After masking, an address can only be
// IPv4-mapped when the range is /96 or narrower.
func parsePrefix(s string) (netip.Prefix, bool) {
	var p netip.Prefix
	if strings.Contains(s, "/") {
		var err error
		if p, err = netip.ParsePrefix(s); err != nil {
			return netip.Prefix{}, false
		}
		p = p.Masked()
	} else {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return netip.Prefix{}, false
		}
		p = netip.PrefixFrom(a, a.BitLen())
	}
	if a := p.Addr(); a.Is4In6() {
		p = netip.PrefixFrom(a.Unmap(), p.Bits()-96)
	}
	return p, true
}

// validToken reports whether s is an RFC 9110 token (a header name or a method).
func validToken(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// compileRule validates rules[i] and builds it. names maps the names seen so
// far to their index.
func compileRule(d *decoder, rr *rawRule, i int, names map[string]int, id *Identity) *limits.Rule {
	at := func(line int, format string, args ...any) { d.add(line, rr.label, format, args...) }
	r := &limits.Rule{Name: rr.Name.V, Cost: 1, Shadow: rr.Shadow.V, Anonymous: id.Anonymous}

	switch v := &rr.Name; {
	case !v.Set:
		at(rr.Line, "name is required")
	case v.Bad:
	case !ruleNameRE.MatchString(v.V):
		at(v.Line, "name must match %s, got %q", ruleNameRE, v.V)
	default:
		if j, dup := names[v.V]; dup {
			at(v.Line, "duplicate rule name %q (also rules[%d])", v.V, j)
		} else {
			names[v.V] = i
		}
	}

	compileMatch(&rr.Match, &r.Match, id, at)

	seen := map[limits.KeyPart]int{}
	for j, s := range rr.Key.V {
		p, msg := parseKeyPart(s, id.RequestIDHeader)
		if msg != "" {
			at(rr.Key.Line, "key[%d] %q%s", j, s, msg)
			continue
		}
		if k, dup := seen[p]; dup {
			at(rr.Key.Line, "key[%d] %q repeats key[%d]", j, s, k)
			continue
		}
		seen[p] = j
		r.Key = append(r.Key, p)
	}

	algOK := false
	switch v := &rr.Algorithm; {
	case !v.Set:
		at(rr.Line, "algorithm is required (one of %s)", algorithmList())
	case v.Bad:
	case !limits.Algorithm(v.V).Valid():
		at(v.Line, "algorithm %q is unknown; use one of %s", v.V, algorithmList())
	default:
		r.Algorithm, algOK = limits.Algorithm(v.V), true
	}

	limitOK := false
	switch v := &rr.Limit; {
	case !v.Set:
		at(rr.Line, "limit is required (requests per period)")
	case v.Bad:
	default:
		r.Limit = v.V
		if msg := checkLimit(v.V); msg != "" {
			at(v.Line, "%s", msg)
		} else {
			limitOK = true
		}
	}

	periodOK := false
	switch v := &rr.Period; {
	case !v.Set:
		at(rr.Line, "period is required (such as 1s, 1m, 1h, 1d)")
	case v.Bad:
	default:
		r.Period = v.V
		if msg := checkPeriod(v.V); msg != "" {
			at(v.Line, "%s", msg)
		} else {
			periodOK = true
		}
	}

	r.Burst = r.Limit
	burstOK := limitOK
	if v := &rr.Burst; v.Set {
		burstOK = false
		switch {
		case algOK && !r.Algorithm.UsesBurst():
			at(v.Line, "burst is only for gcra and token_bucket, not %s", r.Algorithm)
		case v.Bad:
		default:
			r.Burst = v.V
			if msg := checkBurst(v.V); msg != "" {
				at(v.Line, "%s", msg)
			} else {
				burstOK = true
			}
		}
	}
	if algOK && limitOK {
		if msg := checkAlgorithmLimit(r.Algorithm, r.Limit); msg != "" {
			at(rr.Limit.Line, "%s", msg)
		}
	}
	if algOK && r.Algorithm.UsesBurst() && limitOK && periodOK && burstOK {
		line := rr.Period.Line
		if rr.Burst.Set {
			line = rr.Burst.Line
		}
		if msg := checkFill(r.Burst, r.Period, r.Limit); msg != "" {
			at(line, "%s", msg)
		}
	}

	if v := &rr.Lease; v.ok() && v.V {
		r.Lease = true
		if algOK {
			if msg := checkLease(r.Algorithm); msg != "" {
				at(v.Line, "%s", msg)
			}
		}
	}

	if v := &rr.Cost; v.ok() {
		r.Cost = v.V
		capOK := algOK && burstOK // for window algorithms Burst == Limit
		if msg := checkCost(v.V, r.Algorithm, r.Burst, capOK); msg != "" {
			at(v.Line, "%s", msg)
		}
	}
	r.Adaptive = compileAdaptive(&rr.Adaptive, r, at)
	return r
}

func compileMatch(m *rawMatch, out *limits.Match, id *Identity, at func(line int, format string, args ...any)) {
	pp := id.PathParams
	if v := &m.Path; v.ok() && v.V != "" {
		switch {
		case strings.HasPrefix(v.V, "~"):
			expr := v.V[1:]
			if expr == "" {
				at(v.Line, "match.path regex is empty (omit path to match every route)")
				break
			}
			re, err := regexp.Compile(expr)
			if err != nil {
				at(v.Line, "match.path regex %q does not compile: %v", expr, err)
				break
			}
			out.PathRegex = re
		case strings.HasPrefix(v.V, "/"):
			// Routes are normalized before matching, so a prefix that is not
			// itself normalized could never match: say what to write instead.
			if n := string(pp.Normalize(nil, []byte(v.V))); n != v.V {
				at(v.Line, "match.path %q is not a normalized route and would never match; write %q", v.V, n)
				break
			}
			out.PathPrefix = v.V
		default:
			at(v.Line, "match.path must be a prefix starting with \"/\" or a regex starting with \"~\", got %q", v.V)
		}
	}
	for i, s := range m.Methods.V {
		meth := strings.ToUpper(s)
		if !validToken(meth) {
			at(m.Methods.Line, "match.methods[%d] %q is not an HTTP method", i, s)
			continue
		}
		if !slices.Contains(out.Methods, meth) {
			out.Methods = append(out.Methods, meth)
		}
	}
	// HEAD is GET without the body, and applications answer it with their
	// GET handler: a limit on GET that HEAD walked past would be no limit.
	// (NGINX's limit_except does the same.)
	if slices.Contains(out.Methods, "GET") && !slices.Contains(out.Methods, "HEAD") {
		out.Methods = append(out.Methods, "HEAD")
	}
	if v := &m.Host; v.ok() && v.V != "" {
		// as /auth writes a request's host (strings.ToLower would make
		// "İ" the ASCII "i", another host to NGINX and to the key)
		out.Host = string(limits.AppendHost(nil, []byte(v.V)))
		if strings.ContainsFunc(v.V, func(c rune) bool { return c <= ' ' || c == 0x7f || c == '/' }) {
			at(v.Line, "match.host %q is not a host name", v.V)
		} else if msg := limits.HostProblem(strings.ToLower(v.V)); msg != "" {
			at(v.Line, "match.host %q %s", v.V, msg)
		}
	}
	first := map[string]string{}
	for _, h := range m.Header.V {
		if !validToken(h.Name) {
			at(h.Line, "match.header %q is not a valid header name", h.Name)
			continue
		}
		name := textproto.CanonicalMIMEHeaderKey(h.Name)
		if msg := unpassedHeader(name, "match.host", id.RequestIDHeader); msg != "" {
			at(h.Line, "match.header %q %s", h.Name, msg)
			continue
		}
		if prev, dup := first[name]; dup {
			at(h.Line, "match.header %q repeats %q", h.Name, prev)
			continue
		}
		first[name] = h.Name
		if msg := limits.HeaderValueProblem(h.Value); msg != "" {
			at(h.Line, "match.header %q value %q %s: no request sends this value", h.Name, h.Value, msg)
			continue
		}
		out.Headers = append(out.Headers, limits.HeaderMatch{Name: name, Value: []byte(h.Value)})
	}
	sort.Slice(out.Headers, func(i, j int) bool { return out.Headers[i].Name < out.Headers[j].Name })
}

// parseKeyPart reads one `key:` element; msg completes `key[1] "x"` on failure.
func parseKeyPart(s, requestID string) (p limits.KeyPart, msg string) {
	switch s {
	case "ip":
		return limits.KeyPart{Kind: limits.KeyIP}, ""
	case "user":
		return limits.KeyPart{Kind: limits.KeyUser}, ""
	case "route":
		return limits.KeyPart{Kind: limits.KeyRoute}, ""
	case "method":
		return limits.KeyPart{Kind: limits.KeyMethod}, ""
	case "host":
		return limits.KeyPart{Kind: limits.KeyHost}, ""
	}
	if name, ok := strings.CutPrefix(s, "header:"); ok {
		if !validToken(name) {
			return p, fmt.Sprintf(": %q is not a valid header name", name)
		}
		canon := textproto.CanonicalMIMEHeaderKey(name)
		if msg := unpassedHeader(canon, "key: [host]", requestID); msg != "" {
			return p, ": header " + msg
		}
		return limits.KeyPart{Kind: limits.KeyHeader, Header: canon}, ""
	}
	return p, " must be one of ip, user, route, method, host, header:<Name>"
}

// unpassedHeader says why a rule cannot read the client's header name
// (canonical), or "" when it can. NGINX's proxy_pass, which carries the
// auth subrequest, sends Host as the upstream's name and drops or rewrites
// the hop-by-hop and framing headers whatever the client sent: a rule
// matching on one would never match (a limit that never applies), one
// keyed on it would give every client one counter. hostRule names what
// reads the client's host instead. requestID is identity.request_id_header,
// which NGINX sets to $request_id: new on every request, a rule on it
// would never limit.
func unpassedHeader(name, hostRule, requestID string) string {
	switch name {
	case requestID:
		return "is NGINX's $request_id (identity.request_id_header), a new value on every request: a rule on it never limits"
	case "Host":
		return "is the upstream's name on the auth subrequest (NGINX's proxy_pass sets it), not the client's host: use " + hostRule
	case "Connection", "Content-Length", "Transfer-Encoding", "Te", "Keep-Alive", "Expect", "Upgrade":
		return "never reaches rategate as the client sent it (NGINX's proxy_pass drops or rewrites it): pass it under another name " +
			"in the auth location (proxy_set_header X-Client-" + name + " $http_" + strings.ToLower(strings.ReplaceAll(name, "-", "_")) + ";) and read that"
	}
	return ""
}

func algorithmList() string {
	names := make([]string, len(limits.Algorithms))
	for i, a := range limits.Algorithms {
		names[i] = string(a)
	}
	return strings.Join(names, ", ")
}

// between returns "" when lo <= v <= hi, else the problem.
func between(v, lo, hi int64) string {
	if v < lo {
		return fmt.Sprintf("must be >= %d, got %d", lo, v)
	}
	if v > hi {
		return fmt.Sprintf("must be <= %d, got %d", hi, v)
	}
	return ""
}

// The check functions below return "" or a complete problem naming the
// field; Parse and CheckRule share them so file and runtime overrides obey
// the same bounds.

func checkLimit(v int64) string {
	if msg := between(v, 1, maxLimit); msg != "" {
		return "limit " + msg
	}
	return ""
}

// checkAlgorithmLimit applies the algorithm table's own bound on a limit
// (sliding_log: limits.MaxSlidingLogLimit).
func checkAlgorithmLimit(alg limits.Algorithm, limit int64) string {
	info, ok := alg.Info()
	if !ok || info.MaxLimit == 0 || limit <= info.MaxLimit {
		return ""
	}
	why := ""
	if alg == limits.SlidingLog {
		why = ": the log keeps a Redis entry (about 110 bytes) per admitted request for a whole period; use sliding_window (O(1) per key, approximate) or gcra (exact, evenly spaced) for larger limits"
	}
	return fmt.Sprintf("limit must be <= %d for %s, got %d%s", info.MaxLimit, alg, limit, why)
}

// checkLease says why a rule of the algorithm cannot be leased, or "".
func checkLease(alg limits.Algorithm) string {
	if alg.Leasable() {
		return ""
	}
	return fmt.Sprintf("lease cannot be exact for %s: a leased unit is counted when its slice is taken and spent later, and %s lets every admission leave the log exactly one period after its own time, so a unit spent after it was counted would leave before its request's period ended and some period could hold more than the limit; lease a fixed_window, sliding_window, gcra or token_bucket rule instead",
		alg, alg)
}

func checkBurst(v int64) string {
	if msg := between(v, 1, maxLimit); msg != "" {
		return "burst " + msg
	}
	return ""
}

func checkPeriod(p time.Duration) string {
	switch {
	case p < time.Millisecond:
		return "period must be >= 1ms, got " + FormatDuration(p)
	case p%time.Millisecond != 0:
		return "period must be a whole number of milliseconds, got " + FormatDuration(p)
	case p > maxSpan:
		return "period must be <= " + FormatDuration(maxSpan) + ", got " + FormatDuration(p)
	}
	return ""
}

// checkFill bounds the time a full bucket takes to refill, burst*period/limit.
func checkFill(burst int64, period time.Duration, limit int64) string {
	// burst*period <= maxSpan*limit, in 128 bits: both sides overflow int64.
	hi1, lo1 := bits.Mul64(uint64(burst), uint64(period))
	hi2, lo2 := bits.Mul64(uint64(maxSpan), uint64(limit))
	if hi1 < hi2 || (hi1 == hi2 && lo1 <= lo2) {
		return ""
	}
	days := float64(burst) / float64(limit) * period.Hours() / 24
	return fmt.Sprintf("burst %d at %d per %s takes %.1f days to refill; burst*period/limit must be <= %s to keep the Redis scripts' double arithmetic exact",
		burst, limit, FormatDuration(period), days, FormatDuration(maxSpan))
}

// checkCost checks a rule's default cost against what its bucket can hold:
// burst for gcra and token_bucket, limit (== burst) for the window
// algorithms. capOK is false when that bound is itself invalid.
func checkCost(cost int64, alg limits.Algorithm, burst int64, capOK bool) string {
	if cost < 1 {
		return fmt.Sprintf("cost must be >= 1, got %d", cost)
	}
	if capOK && cost > burst {
		what := "limit"
		if alg.UsesBurst() {
			what = "burst"
		}
		return fmt.Sprintf("cost %d is more than the %s (%d): such a request could never be allowed", cost, what, burst)
	}
	return ""
}

// CheckRule checks a compiled rule's algorithm and numbers (limit, period,
// burst, cost) against the bounds Parse enforces, so that a runtime override
// can never make a rule the file could not. For the window algorithms Burst
// must equal Limit, as Parse leaves it. The error is Errors of messages such
// as "burst must be >= 1, got 0", without file or rule.
func CheckRule(r *limits.Rule) error {
	var errs Errors
	add := func(msg string) {
		if msg != "" {
			errs = append(errs, errors.New(msg))
		}
	}
	algOK := r.Algorithm.Valid()
	if !algOK {
		add(fmt.Sprintf("algorithm %q is unknown; use one of %s", r.Algorithm, algorithmList()))
	}
	limitMsg, periodMsg := checkLimit(r.Limit), checkPeriod(r.Period)
	add(limitMsg)
	add(periodMsg)
	if limitMsg == "" {
		add(checkAlgorithmLimit(r.Algorithm, r.Limit))
	}
	capOK := algOK && limitMsg == ""
	if r.Algorithm.UsesBurst() {
		burstMsg := checkBurst(r.Burst)
		add(burstMsg)
		capOK = burstMsg == ""
		if limitMsg == "" && periodMsg == "" && burstMsg == "" {
			add(checkFill(r.Burst, r.Period, r.Limit))
		}
	} else if algOK && r.Burst != r.Limit {
		add(fmt.Sprintf("burst must equal limit (%d) for %s, got %d", r.Limit, r.Algorithm, r.Burst))
		capOK = false
	}
	add(checkCost(r.Cost, r.Algorithm, r.Burst, capOK))
	if r.Lease && algOK {
		add(checkLease(r.Algorithm))
	}
	if errs == nil {
		return nil
	}
	return errs
}
