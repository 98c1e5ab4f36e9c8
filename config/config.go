// Package config loads rategate's YAML configuration (docs/configuration.md), fills in
// defaults, validates everything at once and compiles the rules into
// []*limits.Rule.
//
// Validation is pure (no network, no globals) and reports every problem in
// one go, each naming the file, the rule and the field:
//
//	rategate.yaml: rules[2] "login": burst must be >= 1, got 0
//	rategate.yaml: redis.timeout: must be > 0, got -1s
//
// Problems found while reading the YAML itself (syntax, unknown keys, a list
// where a number belongs) also carry the line:
//
//	rategate.yaml: rules[0] "login": line 9: unknown key "limt" (did you mean "limit"?)
package config

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"
	"unicode/utf8"

	"gopkg.in/yaml.v3"

	"github.com/rategate/rategate/limits"
)

// ExampleSource is the Source of the built-in example policy.
const ExampleSource = "built-in example policy"

// Config is a validated configuration. Fields the file leaves out hold their
// defaults, except Listen, LogLevel and Admin.Listen, which stay "" so that
// main can apply flag > env > file > default.
type Config struct {
	// Source is the file path as given to Load (the name given to Parse),
	// or ExampleSource.
	Source string
	// Listen is the top-level `listen:`; "" when the file does not set it.
	Listen string
	// LogLevel is `log_level:` (trace, debug, info, warn, error); "" when not set.
	LogLevel string
	Redis    Redis
	// FailureMode says what to do when the store is unreachable: allow
	// (default), deny (503) or local (per-process limits, see LocalShare).
	FailureMode limits.FailureMode
	// LocalShare divides each limit in failure_mode local, where every
	// instance counts on its own: set it to the number of instances. Default 1.
	LocalShare int
	// DenyStatus is the status of a denial: 429 (default) or 403.
	DenyStatus int
	// MemoryMaxKeys bounds the keys the in-memory store keeps (the store
	// without Redis, and the local fallback beside Redis): a new key in a
	// full store takes the place of one that expires soon. Default
	// 1,000,000 (memstore.DefaultMaxKeys).
	MemoryMaxKeys int
	DenyCache     DenyCache
	Admin         Admin
	Identity      Identity
	// IdentityOverrides bounds the runtime identity overrides.
	IdentityOverrides IdentityOverrides
	// Rules are the compiled rules in file order; never nil.
	Rules []*limits.Rule
	// RulesListed is true when the file has a rules list, even an empty
	// one ("rules: []"); false for an empty file, one without the key, or
	// "rules:" with nothing under it. A reload does not take the rules
	// away on a file that does not say so (app.Reload).
	RulesListed bool
}

// DenyCache is `deny_cache:`: an identity Redis denied is answered
// locally until its retry time (limits.DenyCache says why that is exact).
type DenyCache struct {
	// Enabled is true by default; it applies to a single Redis and
	// Sentinel, not to Redis Cluster or the in-memory store.
	Enabled bool
	// MaxEntries bounds the cache; default 100000.
	MaxEntries int
}

// Redis is the `redis:` block. At most one of URL, ClusterAddrs and
// Sentinel.Master is set; none means the in-memory store.
type Redis struct {
	// URL is redis:// or rediss://, possibly with credentials and /db.
	URL string
	// ClusterAddrs are Redis Cluster seed nodes, host:port.
	ClusterAddrs []string
	Sentinel     Sentinel
	// TLS encrypts the connections of every topology; a rediss:// URL turns
	// it on too.
	TLS TLS
	// Username and Password authenticate to Redis (cluster and sentinel
	// topologies; a URL may carry its own).
	Username string
	Password string
	// KeyPrefix starts every key; default "rg".
	KeyPrefix string
	// Timeout is the budget of one decision's Redis round trip; default 50ms.
	Timeout time.Duration
	// Coalesce gathers concurrent decisions into Redis pipelines.
	Coalesce Coalesce
	// Functions decides with FCALL of rategate's Redis Functions library
	// on servers that run functions (Redis >= 7.0, allowed by the ACL),
	// EVALSHA elsewhere; true by default. false: EVALSHA everywhere.
	Functions bool
}

// Coalesce is `redis.coalesce:`. Decisions still run one script each;
// only the round trips are shared.
type Coalesce struct {
	// Enabled is true by default.
	Enabled bool
	// Pipelines is how many pipelines may be in flight at once (one
	// connection each, one per node on a cluster); default 2.
	Pipelines int
	// MaxBatch bounds the decisions in one pipeline; default 128.
	MaxBatch int
	// Wait is how long to wait for more decisions before sending a pipeline
	// that is not full, while batches show load (two decisions or more on
	// average; an idle service sends at once); default 50µs (at most a
	// quarter of redis.timeout), 0: send what is queued.
	Wait time.Duration
	// OverlapAfter is how long every pipeline in flight must have waited
	// before another is sent alongside it (a full batch goes at once);
	// default 1ms (at most half of redis.timeout), 0: at once.
	OverlapAfter time.Duration
}

// Sentinel is `redis.sentinel:`; Master is "" when Sentinel is not used.
type Sentinel struct {
	Master string
	Addrs  []string
	// Username and Password authenticate to the sentinels themselves.
	Username string
	Password string
}

// TLS is `redis.tls:`.
type TLS struct {
	Enabled bool
	// CAFile is a PEM bundle of the CAs that sign the servers' certificates;
	// empty = the system roots.
	CAFile string
	// CertFile and KeyFile are a client certificate, for servers that
	// require one (tls-auth-clients).
	CertFile, KeyFile string
	// ServerName overrides the name checked in the server's certificate.
	ServerName string
	// InsecureSkipVerify turns off certificate checks: tests only.
	InsecureSkipVerify bool
}

// Admin is the `admin:` block.
type Admin struct {
	// Token, when set, is required as "Authorization: Bearer <token>".
	Token string
	// Listen is `admin.listen`; "" when the file does not set it.
	Listen string
}

// Identity is the `identity:` block: where the caller's identity comes from.
// Header names are canonical (net/textproto.CanonicalMIMEHeaderKey).
type Identity struct {
	UserHeader string // default X-User-Id
	// IPHeader is X-Real-IP (default) or X-Forwarded-For (walked right to
	// left past TrustedProxies), or any other header holding one IP.
	IPHeader string
	// TrustedProxies default to 127.0.0.0/8 and ::1/128. An explicit empty
	// list trusts no proxy.
	TrustedProxies []netip.Prefix
	// Anonymous is copied into every rule.
	Anonymous    limits.Anonymous
	URIHeader    string // default X-Original-URI
	MethodHeader string // default X-Original-Method
	HostHeader   string // default X-Original-Host
	// CostHeader carries a request's weight; "" (default) = off.
	CostHeader string
	// MaxCost bounds the cost header; default 100, at most 1e6.
	MaxCost int64
	// URLHeader (default X-Original-URL) holds the request as a full URL,
	// as ingress-nginx's auth-url sends it; read when URIHeader is absent.
	URLHeader string
	// RequestIDHeader (default X-Request-Id) carries NGINX's $request_id,
	// which denial log lines quote.
	RequestIDHeader string
	// IPv6Prefix is the network length an IPv6 client counts as (the `ip`
	// dimension); default 64, 48..128.
	IPv6Prefix int
	// PathParams says whether routes keep path parameters (";..." in a
	// segment; keep, the default, as NGINX routes them) or strip them, as
	// a Tomcat, Jetty or Spring MVC application serves the path.
	PathParams limits.PathParams
}

// Errors is every problem validation found, in file order. Parse and Load
// return it as their error.
type Errors []error

// Error joins the problems with newlines.
func (e Errors) Error() string {
	var b strings.Builder
	for i, err := range e {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(err.Error())
	}
	return b.String()
}

// Unwrap lets errors.Is and errors.As look at each problem.
func (e Errors) Unwrap() []error { return e }

// MaxFileSize bounds the config file Load reads: 4 MiB, some 40,000
// one-line rules. yaml.v3 holds the whole file as a node tree, 35 to 90
// bytes of memory for each byte of a long list, so a file of any size (or
// -config /dev/zero) would cost a reload, or the start, what it likes.
const MaxFileSize = 4 << 20

// Load reads and validates the config file at path. Every error names path.
func Load(path string) (*Config, error) {
	f, err := os.Open(path)
	if err != nil {
		// *fs.PathError already names the path: "open x.yaml: no such file or directory".
		return nil, fmt.Errorf("load config: %w", err)
	}
	defer f.Close()
	tooBig := Errors{fmt.Errorf("%s: the file is over %d bytes (4 MiB), the most rategate reads of a config file: is it the right file?", path, MaxFileSize)}
	var buf bytes.Buffer
	if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
		if fi.Size() > MaxFileSize {
			return nil, tooBig
		}
		buf.Grow(int(fi.Size()) + 512)
	}
	// A device or a pipe says no size; one that grew since Stat is cut too.
	if _, err := buf.ReadFrom(io.LimitReader(f, MaxFileSize+1)); err != nil {
		return nil, fmt.Errorf("load config: %w", err)
	}
	if buf.Len() > MaxFileSize {
		return nil, tooBig
	}
	return Parse(path, buf.Bytes())
}

// Parse validates data, naming it name in every error. An empty document is
// a valid configuration with no rules. On failure the error is Errors.
func Parse(name string, data []byte) (*Config, error) {
	d := &decoder{}
	raw := &rawConfig{}
	if root := d.document(data); root != nil {
		d.fields(root, where{}, raw)
	}
	c := validate(d, raw)
	c.Source = name
	if errs := d.errors(name); errs != nil {
		return nil, errs
	}
	return c, nil
}

// document parses data into its root node; nil for an empty document or a
// syntax error (reported).
func (d *decoder) document(data []byte) *yaml.Node {
	if !utf8.Valid(data) {
		// The YAML decoder says "invalid leading UTF-8 octet", nowhere.
		i := 0
		for i < len(data) {
			r, n := utf8.DecodeRune(data[i:])
			if r == utf8.RuneError && n <= 1 {
				break
			}
			i += n
		}
		line := 1 + bytes.Count(data[:i], []byte{'\n'})
		d.add(line, "", "line %d: byte 0x%02X is not UTF-8 (a character pasted in another encoding?): write the file in UTF-8", line, data[i])
		return nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if !errors.Is(err, io.EOF) {
			d.syntax(err)
		}
		return nil
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case err == nil:
		d.add(next.Line, "", "line %d: only one YAML document is allowed (found a second one after ---)", next.Line)
	case !errors.Is(err, io.EOF):
		d.syntax(err)
	}
	if doc.Kind != yaml.DocumentNode || len(doc.Content) == 0 {
		return nil
	}
	return doc.Content[0]
}

// syntax reports a YAML parse error ("yaml: line 3: mapping values are not
// allowed in this context") without the "yaml: " prefix.
func (d *decoder) syntax(err error) {
	msg := strings.TrimPrefix(err.Error(), "yaml: ")
	line := 0
	fmt.Sscanf(msg, "line %d:", &line)
	d.add(line, "", "%s", msg)
}

//go:embed example.yaml
var exampleYAML []byte

// Example returns the built-in example policy, which rategate runs when no
// config file is given. The embedded file is valid (tested), so Example
// never fails in a released binary.
func Example() *Config {
	c, err := Parse(ExampleSource, exampleYAML)
	if err != nil {
		panic("config: the embedded example.yaml is invalid: " + err.Error())
	}
	return c
}
