package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/limits"
)

// invalidCases maps each fixture in testdata/invalid to the exact problems
// Load must report, in order, without the "<path>: " prefix every message
// starts with.
var invalidCases = map[string][]string{
	"unknown_key_top.yaml": {
		`line 2: unknown key "rulez" (did you mean "rules"?)`,
	},
	"unknown_key_rule.yaml": {
		`rules[0] "login": line 6: unknown key "shadwo" (did you mean "shadow"?)`,
	},
	"unknown_key_nested.yaml": {
		`redis: line 3: unknown key "tiemout" (did you mean "timeout"?)`,
		`rules[0] "login": line 7: unknown key "paths" in match (did you mean "path"?)`,
	},
	"duplicate_name.yaml": {
		`rules[1] "login": duplicate rule name "login" (also rules[0])`,
	},
	"bad_name.yaml": {
		`rules[0] "Login Page": name must match ^[a-z0-9_-]{1,64}$, got "Login Page"`,
	},
	"missing_fields.yaml": {
		`rules[0]: name is required`,
		`rules[0]: algorithm is required (one of fixed_window, sliding_log, sliding_window, gcra, token_bucket)`,
		`rules[0]: limit is required (requests per period)`,
		`rules[0]: period is required (such as 1s, 1m, 1h, 1d)`,
	},
	"bad_algorithm.yaml": {
		`rules[0] "login": algorithm "leaky_bucket" is unknown; use one of fixed_window, sliding_log, sliding_window, gcra, token_bucket`,
	},
	"limit_zero.yaml": {
		`rules[0] "login": limit must be >= 1, got 0`,
	},
	"wrong_type.yaml": {
		`rules[0] "login": line 4: limit must be a whole number, got a list`,
	},
	"period_soon.yaml": {
		`rules[0] "login": line 5: period "soon" is not a duration (examples: 500ms, 1m, 1h30m, 7d)`,
	},
	"period_not_whole_ms.yaml": {
		`rules[0] "login": period must be a whole number of milliseconds, got 1.5ms`,
	},
	"period_without_unit.yaml": {
		`rules[0] "login": line 5: period must be a duration with a unit, such as "60s" or "60ms", got 60`,
	},
	"burst_on_fixed_window.yaml": {
		`rules[0] "login": burst is only for gcra and token_bucket, not fixed_window`,
	},
	"burst_zero_gcra.yaml": {
		`rules[0] "login": burst must be >= 1, got 0`,
	},
	"bucket_too_slow.yaml": {
		`rules[0] "archive": burst 1000 at 1 per 1d takes 1000.0 days to refill; burst*period/limit must be <= 400d to keep the Redis scripts' double arithmetic exact`,
	},
	"sliding_log_over_cap.yaml": {
		`rules[0] "search": limit must be <= 10000 for sliding_log, got 20000: the log keeps a Redis entry (about 110 bytes) per admitted request for a whole period; use sliding_window (O(1) per key, approximate) or gcra (exact, evenly spaced) for larger limits`,
	},
	"lease_sliding_log.yaml": {
		`rules[0] "search": lease cannot be exact for sliding_log: a leased unit is counted when its slice is taken and spent later, and sliding_log lets every admission leave the log exactly one period after its own time, so a unit spent after it was counted would leave before its request's period ended and some period could hold more than the limit; lease a fixed_window, sliding_window, gcra or token_bucket rule instead`,
	},
	"cost_over_burst.yaml": {
		`rules[0] "export": cost 6 is more than the burst (5): such a request could never be allowed`,
	},
	"bad_regex.yaml": {
		"rules[0] \"users\": match.path regex \"^/users/([0-9]+$\" does not compile: error parsing regexp: missing closing ): `^/users/([0-9]+$`",
	},
	"tls_not_enabled.yaml": {
		`redis.tls.ca_file: has no effect without redis.tls.enabled: true`,
	},
	"tls_cert_without_key.yaml": {
		`redis.tls: cert_file and key_file go together (a client certificate needs both), got only cert_file`,
	},
	"path_not_normalized.yaml": {
		`rules[0] "admin": match.path "/a/../admin//x" is not a normalized route and would never match; write "/admin/x"`,
	},
	"bad_match_header.yaml": {
		`rules[0] "free-plan": match.header "X Plan" is not a valid header name`,
	},
	"bad_key_header.yaml": {
		`rules[0] "per-tenant": key[1] "header:X Tenant": "X Tenant" is not a valid header name`,
	},
	"bad_key_part.yaml": {
		`rules[0] "per-cookie": key[0] "cookie" must be one of ip, user, route, method, host, header:<Name>`,
	},
	"duplicate_key_part.yaml": {
		`rules[0] "per-tenant": key[2] "header:X-Tenant" repeats key[0]`,
	},
	"bad_cidr.yaml": {
		`identity.trusted_proxies[1]: "10.0.0.300/8" is not an IP or CIDR`,
	},
	"two_redis_topologies.yaml": {
		`redis: use only one of url, cluster_addrs and sentinel, got url and cluster_addrs`,
	},
	"bad_redis_url.yaml": {
		`redis.url: scheme must be redis or rediss, got "http"`,
	},
	"timeout_without_unit.yaml": {
		`redis.timeout: line 2: must be a duration with a unit, such as "50s" or "50ms", got 50`,
	},
	"bad_deny_status.yaml": {
		`deny_status: must be 429 or 403, got 404`,
	},
	"bad_failure_mode.yaml": {
		`failure_mode: must be allow, deny or local, got "open"`,
	},
	// yaml.v3 reports the line where the broken block starts.
	"syntax_error.yaml": {
		`line 1: did not find expected '-' indicator`,
	},
	"two_documents.yaml": {
		`line 2: only one YAML document is allowed (found a second one after ---)`,
	},
	"several.yaml": {
		`failure_mode: must be allow, deny or local, got "open"`,
		`redis.timeout: must be > 0, got -1s`,
		`identity.trusted_proxies[1]: "10.0.0.300/8" is not an IP or CIDR`,
		`identity.max_cost: must be >= 1, got 0`,
		`rules[0] "login": limit must be >= 1, got 0`,
		`rules[0] "login": burst is only for gcra and token_bucket, not fixed_window`,
		`rules[1] "api": match.path must be a prefix starting with "/" or a regex starting with "~", got "api"`,
		`rules[1] "api": key[1] "user" repeats key[0]`,
		`rules[1] "api": burst must be >= 1, got 0`,
		`rules[1] "api": line 21: unknown key "colour"`,
		`rules[2] "login": duplicate rule name "login" (also rules[0])`,
		`rules[2] "login": period must be a whole number of milliseconds, got 1.5ms`,
	},
}

func TestLoadInvalid(t *testing.T) {
	for file, want := range invalidCases {
		t.Run(strings.TrimSuffix(file, ".yaml"), func(t *testing.T) {
			path := filepath.Join("testdata", "invalid", file)
			c, err := Load(path)
			if err == nil {
				t.Fatalf("Load(%q) = valid config, want errors:\n%s", path, strings.Join(want, "\n"))
			}
			if c != nil {
				t.Errorf("Load(%q) returned a config with its error", path)
			}
			var errs Errors
			if !errors.As(err, &errs) {
				t.Fatalf("Load(%q) error is %T, want Errors: %v", path, err, err)
			}
			got := make([]string, len(errs))
			for i, e := range errs {
				got[i] = e.Error()
			}
			for i := range want {
				want[i] = path + ": " + want[i]
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("Load(%q) problems:\n got: %s\nwant: %s", path, strings.Join(got, "\n      "), strings.Join(want, "\n      "))
			}
			if err.Error() != strings.Join(want, "\n") {
				t.Errorf("Error() = %q, want the problems joined by newlines", err.Error())
			}
		})
	}
}

// TestInvalidFixturesHaveCases keeps testdata/invalid and invalidCases in step.
func TestInvalidFixturesHaveCases(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "invalid", "*.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, f := range files {
		have[filepath.Base(f)] = true
		if _, ok := invalidCases[filepath.Base(f)]; !ok {
			t.Errorf("%s has no entry in invalidCases", f)
		}
	}
	for f := range invalidCases {
		if !have[f] {
			t.Errorf("invalidCases[%q] has no fixture file", f)
		}
	}
}

// TestParseInvalidInline covers the rarer problems, one small document each.
func TestParseInvalidInline(t *testing.T) {
	const rule = "\n    algorithm: gcra\n    limit: 10\n    period: 1m\n"
	tests := []struct {
		name string
		yaml string
		want []string
	}{
		{"top level is a list", "- a\n- b\n",
			[]string{`line 1: must be a mapping of keys to values, got a list`}},
		{"section is a scalar", "redis: localhost\n",
			[]string{`redis: line 1: must be a mapping of keys to values, got "localhost"`}},
		{"rules is a mapping", "rules: {name: a}\n",
			[]string{`rules: line 1: must be a list of rules (each starting with "- name: ..."), got a mapping`}},
		{"rule is a scalar", "rules: [login]\n",
			[]string{`rules[0]: line 1: a rule must be a mapping (name:, match:, key:, algorithm:, limit:, period:, ...), got "login"`}},
		{"repeated key", "rules:\n  - name: a" + rule + "    limit: 20\n",
			[]string{`rules[0] "a": line 6: key "limit" is repeated (first on line 4)`}},
		{"key is a list", "rules:\n  - name: a" + rule + "    key: ip\n",
			[]string{`rules[0] "a": line 6: key must be a list such as [a, b], got "ip"`}},
		{"shadow is not a bool", "rules:\n  - name: a" + rule + "    shadow: yes\n",
			[]string{`rules[0] "a": line 6: shadow must be true or false, got "yes"`}},
		{"lease is not a bool", "rules:\n  - name: a" + rule + "    lease: 1\n",
			[]string{`rules[0] "a": line 6: lease must be true or false, got 1`}},
		{"limit is a float", "rules:\n  - name: a\n    algorithm: gcra\n    limit: 1e3\n    period: 1m\n",
			[]string{`rules[0] "a": line 4: limit must be a whole number, got 1e3`}},
		{"limit overflows", "rules:\n  - name: a\n    algorithm: gcra\n    limit: 99999999999999999999\n    period: 1m\n",
			[]string{`rules[0] "a": line 4: limit is out of range, got 99999999999999999999`}},
		{"limit too large", "rules:\n  - name: a\n    algorithm: gcra\n    limit: 1000000001\n    period: 1m\n",
			[]string{`rules[0] "a": limit must be <= 1000000000, got 1000000001`}},
		{"period too long", "rules:\n  - name: a\n    algorithm: fixed_window\n    limit: 1\n    period: 401d\n",
			[]string{`rules[0] "a": period must be <= 400d, got 401d`}},
		{"period zero", "rules:\n  - name: a\n    algorithm: fixed_window\n    limit: 1\n    period: 0s\n",
			[]string{`rules[0] "a": period must be >= 1ms, got 0s`}},
		{"cost zero", "rules:\n  - name: a" + rule + "    cost: 0\n",
			[]string{`rules[0] "a": cost must be >= 1, got 0`}},
		{"cost over limit", "rules:\n  - name: a\n    algorithm: sliding_log\n    limit: 3\n    period: 1m\n    cost: 4\n",
			[]string{`rules[0] "a": cost 4 is more than the limit (3): such a request could never be allowed`}},
		{"cost over default burst", "rules:\n  - name: a" + rule + "    cost: 11\n",
			[]string{`rules[0] "a": cost 11 is more than the burst (10): such a request could never be allowed`}},
		{"path without slash", "rules:\n  - name: a" + rule + "    match: {path: login}\n",
			[]string{`rules[0] "a": match.path must be a prefix starting with "/" or a regex starting with "~", got "login"`}},
		{"path with an encoded slash", "rules:\n  - name: a" + rule + "    match: {path: \"/a%2Fb\"}\n",
			[]string{`rules[0] "a": match.path "/a%2Fb" is not a normalized route and would never match; write "/a/b"`}},
		{"path with an encoded dot segment", "rules:\n  - name: a" + rule + "    match: {path: \"/x/..%2fadmin\"}\n",
			[]string{`rules[0] "a": match.path "/x/..%2fadmin" is not a normalized route and would never match; write "/admin"`}},
		{"path with lower-case or needless escapes", "rules:\n  - name: a" + rule + "    match: {path: \"/caf%c3%a9/%7Eu%3B\"}\n",
			[]string{`rules[0] "a": match.path "/caf%c3%a9/%7Eu%3B" is not a normalized route and would never match; write "/caf%C3%A9/~u;"`}},
		{"empty regex", "rules:\n  - name: a" + rule + "    match: {path: \"~\"}\n",
			[]string{`rules[0] "a": match.path regex is empty (omit path to match every route)`}},
		{"bad method", "rules:\n  - name: a" + rule + "    match: {methods: [GET, \"PO ST\"]}\n",
			[]string{`rules[0] "a": match.methods[1] "PO ST" is not an HTTP method`}},
		{"bad host", "rules:\n  - name: a" + rule + "    match: {host: \"a b\"}\n",
			[]string{`rules[0] "a": match.host "a b" is not a host name`}},
		{"host with a port", "rules:\n  - name: a" + rule + "    match: {host: \"API.example.com:443\"}\n",
			[]string{`rules[0] "a": match.host "API.example.com:443" is not a host as /auth counts it (no port, no trailing dot, lower case); write "api.example.com"`}},
		{"host with a trailing dot", "rules:\n  - name: a" + rule + "    match: {host: \"api.example.com.\"}\n",
			[]string{`rules[0] "a": match.host "api.example.com." is not a host as /auth counts it (no port, no trailing dot, lower case); write "api.example.com"`}},
		{"header repeated in another case", "rules:\n  - name: a" + rule + "    match: {header: {X-Plan: a, x-plan: b}}\n",
			[]string{`rules[0] "a": match.header "x-plan" repeats "X-Plan"`}},
		{"header value padded with white space", "rules:\n  - name: a" + rule + "    match: {header: {X-Plan: \"free\\u00a0\"}}\n",
			[]string{`rules[0] "a": match.header "X-Plan" value "free\u00a0" starts or ends with white space, which rategate trims from a header value: no request sends this value`}},
		{"header value with a control byte", "rules:\n  - name: a" + rule + "    match: {header: {X-Plan: \"fr\\x01ee\"}}\n",
			[]string{`rules[0] "a": match.header "X-Plan" value "fr\x01ee" holds the control byte 0x01, which no header value carries: no request sends this value`}},
		{"header value is a list", "rules:\n  - name: a" + rule + "    match: {header: {X-Plan: [a]}}\n",
			[]string{`rules[0] "a": line 6: match.header "X-Plan" must be a string, got a list`}},
		{"match on the Host header", "rules:\n  - name: a" + rule + "    match: {header: {host: api.example}}\n",
			[]string{`rules[0] "a": match.header "host" is the upstream's name on the auth subrequest (NGINX's proxy_pass sets it), not the client's host: use match.host`}},
		{"match on a header proxy_pass drops", "rules:\n  - name: a" + rule + "    match: {header: {Upgrade: websocket}}\n",
			[]string{`rules[0] "a": match.header "Upgrade" never reaches rategate as the client sent it (NGINX's proxy_pass drops or rewrites it): pass it under another name in the auth location (proxy_set_header X-Client-Upgrade $http_upgrade;) and read that`}},
		{"key on the Host header", "rules:\n  - name: a" + rule + "    key: [\"header:HOST\"]\n",
			[]string{`rules[0] "a": key[0] "header:HOST": header is the upstream's name on the auth subrequest (NGINX's proxy_pass sets it), not the client's host: use key: [host]`}},
		{"key on a header proxy_pass rewrites", "rules:\n  - name: a" + rule + "    key: [\"header:Content-Length\"]\n",
			[]string{`rules[0] "a": key[0] "header:Content-Length": header never reaches rategate as the client sent it (NGINX's proxy_pass drops or rewrites it): pass it under another name in the auth location (proxy_set_header X-Client-Content-Length $http_content_length;) and read that`}},
		{"key on the request id", "rules:\n  - name: a" + rule + "    key: [\"header:x-request-id\"]\n",
			[]string{`rules[0] "a": key[0] "header:x-request-id": header is NGINX's $request_id (identity.request_id_header), a new value on every request: a rule on it never limits`}},
		{"match on the request id", "rules:\n  - name: a" + rule + "    match: {header: {X-Request-Id: abc}}\n",
			[]string{`rules[0] "a": match.header "X-Request-Id" is NGINX's $request_id (identity.request_id_header), a new value on every request: a rule on it never limits`}},
		{"empty header key", "rules:\n  - name: a" + rule + "    key: [\"header:\"]\n",
			[]string{`rules[0] "a": key[0] "header:": "" is not a valid header name`}},
		{"merge of a scalar", "rules:\n  - name: a" + rule + "    <<: 5\n",
			[]string{`rules[0] "a": line 6: << must merge a mapping or a list of mappings, got 5`}},
		{"bad listen", "listen: 8080\n",
			[]string{`listen: "8080" is not host:port (such as ":8080" or "127.0.0.1:8080")`}},
		{"bad admin port", "admin: {listen: \"127.0.0.1:99999\"}\n",
			[]string{`admin.listen: port must be a number from 0 to 65535, got "99999"`}},
		{"bad log level", "log_level: verbose\n",
			[]string{`log_level: must be one of trace, debug, info, warn, error; got "verbose"`}},
		{"local_share zero", "local_share: 0\n",
			[]string{`local_share: must be >= 1, got 0`}},
		{"memory_max_keys zero", "memory_max_keys: 0\n",
			[]string{`memory_max_keys: must be >= 1, got 0`}},
		{"memory_max_keys too many", "memory_max_keys: 100000001\n",
			[]string{`memory_max_keys: must be <= 100000000, got 100000001`}},
		{"redis url without scheme", "redis: {url: \"127.0.0.1:6379\"}\n",
			[]string{`redis.url: is not a URL: first path segment in URL cannot contain colon`}},
		{"redis url without host", "redis: {url: \"redis:///0\"}\n",
			[]string{`redis.url: has no host (redis://host:6379/0)`}},
		{"redis url bad database", "redis: {url: \"redis://:secret@h:6379/x\"}\n",
			[]string{`redis.url: database must be a number such as /0, got "/x"`}},
		{"cluster addr without port", "redis: {cluster_addrs: [\"10.0.0.1:7000\", \"10.0.0.2\"]}\n",
			[]string{`redis.cluster_addrs[1]: "10.0.0.2" is not host:port`}},
		{"sentinel without master", "redis: {sentinel: {addrs: [\"10.0.0.1:26379\"]}}\n",
			[]string{`redis.sentinel.master: is required when redis.sentinel is used`}},
		{"sentinel without addrs", "redis: {sentinel: {master: m}}\n",
			[]string{`redis.sentinel.addrs: needs at least one host:port when redis.sentinel is used`}},
		{"three topologies", "redis:\n  url: redis://h:6379\n  cluster_addrs: [\"h:7000\"]\n  sentinel: {master: m, addrs: [\"h:26379\"]}\n",
			[]string{`redis: use only one of url, cluster_addrs and sentinel, got url and cluster_addrs and sentinel`}},
		{"bad key prefix", "redis: {key_prefix: \"a:b\"}\n",
			[]string{`redis.key_prefix: must match ^[A-Za-z0-9_-]{1,32}$, got "a:b"`}},
		{"timeout too long", "redis: {timeout: 11s}\n",
			[]string{`redis.timeout: must be <= 10s, got 11s`}},
		{"coalesce pipelines out of range", "redis: {coalesce: {pipelines: 0, max_batch: 5000}}\n",
			[]string{`redis.coalesce.pipelines: must be between 1 and 256, got 0`,
				`redis.coalesce.max_batch: must be between 1 and 4096, got 5000`}},
		{"coalesce wait eats the budget", "redis: {timeout: 20ms, coalesce: {wait: 15ms}}\n",
			[]string{`redis.coalesce.wait: must be at most half of redis.timeout (20ms), got 15ms`}},
		{"coalesce overlap eats the budget", "redis: {timeout: 20ms, coalesce: {overlap_after: 11ms}}\n",
			[]string{`redis.coalesce.overlap_after: must be at most half of redis.timeout (20ms), got 11ms`}},
		{"coalesce overlap negative", "redis: {coalesce: {overlap_after: -1ms}}\n",
			[]string{`redis.coalesce.overlap_after: must be >= 0, got -1ms`}},
		{"coalesce wait and overlap eat the budget", "redis: {timeout: 50ms, coalesce: {wait: 20ms, overlap_after: 10ms}}\n",
			[]string{`redis.coalesce.overlap_after: plus wait (20ms) must be at most half of redis.timeout (50ms), got 10ms`}},
		{"deny cache bound", "deny_cache: {max_entries: 0}\n",
			[]string{`deny_cache.max_entries: must be >= 1, got 0`}},
		{"coalesce unknown key", "redis: {coalesce: {pipeline: 4}}\n",
			[]string{`redis.coalesce: line 1: unknown key "pipeline" (did you mean "pipelines"?)`}},
		{"bad identity header", "identity: {user_header: \"X User\"}\n",
			[]string{`identity.user_header: "X User" is not a valid header name`}},
		{"bad anonymous", "identity: {anonymous: deny}\n",
			[]string{`identity.anonymous: must be ip or skip, got "deny"`}},
		{"max_cost too large", "identity: {max_cost: 1000001}\n",
			[]string{`identity.max_cost: must be <= 1000000, got 1000001`}},
		{"ipv6_prefix too short", "identity: {ipv6_prefix: 32}\n",
			[]string{`identity.ipv6_prefix: must be between 48 and 128, got 32`}},
		{"ipv6_prefix too long", "identity: {ipv6_prefix: 129}\n",
			[]string{`identity.ipv6_prefix: must be between 48 and 128, got 129`}},
		{"bad path_parameters", "identity: {path_parameters: remove}\n",
			[]string{`identity.path_parameters: must be keep or strip, got "remove"`}},
		{"prefix with a parameter that is stripped", "identity: {path_parameters: strip}\nrules:\n  - {name: a, match: {path: \"/admin;x\"}, key: [ip], algorithm: fixed_window, limit: 1, period: 1s}\n",
			[]string{`rules[0] "a": match.path "/admin;x" is not a normalized route and would never match; write "/admin"`}},
		{"bad url header", "identity: {url_header: \"X:Url\"}\n",
			[]string{`identity.url_header: "X:Url" is not a valid header name`}},
		{"bad request id header", "identity: {request_id_header: \"\"}\n",
			[]string{`identity.request_id_header: "" is not a valid header name`}},
		{"zoned proxy", "identity: {trusted_proxies: [\"fe80::1%eth0\"]}\n",
			[]string{`identity.trusted_proxies[0]: "fe80::1%eth0" is not an IP or CIDR`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Parse("t.yaml", []byte(tt.yaml))
			want := make([]string, len(tt.want))
			for i, w := range tt.want {
				want[i] = "t.yaml: " + w
			}
			if err == nil {
				t.Fatalf("Parse = valid, want:\n%s", strings.Join(want, "\n"))
			}
			if got := err.Error(); got != strings.Join(want, "\n") {
				t.Errorf("Parse error:\n got: %s\nwant: %s", got, strings.Join(want, "\n"))
			}
		})
	}
}

func TestLoadFull(t *testing.T) {
	c, err := Load(filepath.Join("testdata", "valid", "full.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	// The regex is compared by its source, then left out of the deep comparison.
	if len(c.Rules) == 0 || c.Rules[0].Match.PathRegex == nil {
		t.Fatal("rules[0] has no compiled path regex")
	}
	if got := c.Rules[0].Match.PathRegex.String(); got != "^/users/[0-9]+$" {
		t.Errorf("rules[0] regex = %q", got)
	}
	if !c.Rules[0].Match.PathRegex.MatchString("/users/42") || c.Rules[0].Match.PathRegex.MatchString("/users/42/x") {
		t.Error("rules[0] regex does not match as written")
	}
	c.Rules[0].Match.PathRegex = nil

	want := &Config{
		Source:   filepath.Join("testdata", "valid", "full.yaml"),
		Listen:   "127.0.0.1:8081",
		LogLevel: "debug",
		Redis: Redis{
			Sentinel: Sentinel{
				Master:   "mymaster",
				Addrs:    []string{"10.0.0.1:26379", "[::1]:26379"},
				Password: "sentinel-secret",
			},
			Username:  "rategate",
			Password:  "redis-secret",
			KeyPrefix: "rg-test",
			Timeout:   120 * time.Millisecond,
			Coalesce:  Coalesce{Enabled: false, Pipelines: 8, MaxBatch: 32, Wait: 20 * time.Microsecond, OverlapAfter: 0},
			Functions: false,
		},
		FailureMode:       limits.FailLocal,
		LocalShare:        4,
		DenyCache:         DenyCache{Enabled: false, MaxEntries: 5000},
		IdentityOverrides: IdentityOverrides{MaxEntries: 100_000},
		RulesListed:       true,
		DenyStatus:        403,
		MemoryMaxKeys:     50000,
		Admin:             Admin{Token: "s3cret", Listen: "127.0.0.1:9091"},
		Identity: Identity{
			UserHeader: "X-User",
			IPHeader:   "X-Forwarded-For",
			TrustedProxies: []netip.Prefix{
				netip.MustParsePrefix("10.0.0.0/8"),
				netip.MustParsePrefix("192.168.1.7/32"),
				netip.MustParsePrefix("2001:db8::/32"),
				netip.MustParsePrefix("10.0.0.0/8"), // 10.1.2.3/8, masked
			},
			Anonymous:       limits.AnonymousSkip,
			URIHeader:       "X-Uri",
			URLHeader:       "X-Url",
			MethodHeader:    "X-Method",
			HostHeader:      "X-Host",
			CostHeader:      "X-Ratelimit-Cost",
			MaxCost:         1000,
			RequestIDHeader: "X-Trace",
			IPv6Prefix:      56,
		},
		Rules: []*limits.Rule{
			{
				Name: "user-profile",
				Match: limits.Match{
					Methods: []string{"GET", "HEAD"}, // upper-cased, deduplicated
					Host:    "api.example.com",
					Headers: []limits.HeaderMatch{ // canonical, sorted by name
						{Name: "X-Api-Version", Value: []byte("2")},
						{Name: "X-Plan", Value: []byte("free")},
					},
				},
				Key: []limits.KeyPart{
					{Kind: limits.KeyUser},
					{Kind: limits.KeyHeader, Header: "X-Tenant"},
					{Kind: limits.KeyRoute},
				},
				Algorithm: limits.GCRA,
				Limit:     10,
				Period:    time.Second,
				Burst:     10, // default: limit
				Cost:      1,  // default
				Anonymous: limits.AnonymousSkip,
			},
			{
				Name:      "export_7d",
				Match:     limits.Match{PathPrefix: "/export"},
				Key:       []limits.KeyPart{{Kind: limits.KeyIP}, {Kind: limits.KeyMethod}, {Kind: limits.KeyHost}},
				Algorithm: limits.TokenBucket,
				Limit:     70,
				Period:    7 * 24 * time.Hour,
				Burst:     20,
				Cost:      5,
				Shadow:    true,
				Anonymous: limits.AnonymousSkip,
			},
			{
				Name:      "sliding-log",
				Algorithm: limits.SlidingLog,
				Limit:     50,
				Period:    36 * time.Hour,
				Burst:     50,
				Cost:      50,
				Anonymous: limits.AnonymousSkip,
			},
			{
				Name:      "sliding-window",
				Algorithm: limits.SlidingWindow,
				Limit:     1_000_000_000,
				Period:    400 * 24 * time.Hour,
				Burst:     1_000_000_000,
				Cost:      1,
				Lease:     true,
				Anonymous: limits.AnonymousSkip,
			},
		},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("Load(full.yaml):\n got %s\nwant %s", dump(c), dump(want))
	}
}

func dump(c *Config) string {
	top := *c
	top.Rules = nil
	s := fmt.Sprintf("%+v", top)
	for _, r := range c.Rules { // %+v of the pointers would show addresses
		s += fmt.Sprintf("\n  rule %+v", *r)
	}
	return s
}

func TestDefaults(t *testing.T) {
	c, err := Parse("empty.yaml", nil)
	if err != nil {
		t.Fatal(err)
	}
	want := &Config{
		Source: "empty.yaml",
		Redis: Redis{KeyPrefix: "rg", Timeout: 50 * time.Millisecond,
			Coalesce:  Coalesce{Enabled: true, Pipelines: 2, MaxBatch: 128, Wait: 50 * time.Microsecond, OverlapAfter: time.Millisecond},
			Functions: true},
		DenyCache:         DenyCache{Enabled: true, MaxEntries: 100_000},
		IdentityOverrides: IdentityOverrides{MaxEntries: 100_000},
		FailureMode:       limits.FailAllow,
		LocalShare:        1,
		DenyStatus:        429,
		MemoryMaxKeys:     1_000_000,
		Identity: Identity{
			UserHeader:      "X-User-Id",
			IPHeader:        "X-Real-IP",
			TrustedProxies:  []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")},
			Anonymous:       limits.AnonymousIP,
			URIHeader:       "X-Original-URI",
			URLHeader:       "X-Original-URL",
			MethodHeader:    "X-Original-Method",
			HostHeader:      "X-Original-Host",
			MaxCost:         100,
			RequestIDHeader: "X-Request-Id",
			IPv6Prefix:      64,
		},
		Rules: []*limits.Rule{},
	}
	if !reflect.DeepEqual(c, want) {
		t.Errorf("defaults:\n got %s\nwant %s", dump(c), dump(want))
	}
}

// TestOverlapDefaultFitsTimeout: overlap_after's default, 1ms, is cut to
// what half of redis.timeout leaves after wait, so that no timeout or wait
// the validator takes makes its default invalid.
func TestOverlapDefaultFitsTimeout(t *testing.T) {
	for redis, want := range map[string]time.Duration{
		// the default wait (50µs, at most a quarter of the timeout) comes
		// out of the half the two share
		"timeout: 50ms": time.Millisecond, "timeout: 2ms": 950 * time.Microsecond, "timeout: 1ms": 450 * time.Microsecond,
		"timeout: 2ms, coalesce: {wait: 0s}": time.Millisecond,
		// a wait of the whole half leaves no room: the hold-back is off
		"timeout: 50ms, coalesce: {wait: 25ms}": 0, "timeout: 50ms, coalesce: {wait: 24700us}": 300 * time.Microsecond,
	} {
		c, err := Parse("t.yaml", []byte("redis: {"+redis+"}\n"))
		if err != nil {
			t.Fatalf("%s: %v", redis, err)
		}
		if got := c.Redis.Coalesce.OverlapAfter; got != want {
			t.Errorf("%s: overlap_after %s, want %s", redis, got, want)
		}
	}
	// and the default wait gives way to an overlap_after set long: a config
	// that set only overlap_after was valid while wait defaulted to 0
	for redis, want := range map[string]time.Duration{
		"timeout: 2ms, coalesce: {overlap_after: 1ms}": 0, "timeout: 50ms, coalesce: {overlap_after: 25ms}": 0,
		"timeout: 50ms, coalesce: {overlap_after: 24980us}": 20 * time.Microsecond,
		"timeout: 50ms, coalesce: {overlap_after: 24ms}":    50 * time.Microsecond,
	} {
		c, err := Parse("t.yaml", []byte("redis: {"+redis+"}\n"))
		if err != nil {
			t.Fatalf("%s: %v", redis, err)
		}
		if got := c.Redis.Coalesce.Wait; got != want {
			t.Errorf("%s: wait %s, want %s", redis, got, want)
		}
	}
	// set both, they must fit together
	if _, err := Parse("t.yaml", []byte("redis: {timeout: 2ms, coalesce: {wait: 50us, overlap_after: 1ms}}\n")); err == nil ||
		!strings.Contains(err.Error(), "redis.coalesce.overlap_after") {
		t.Errorf("wait 50us + overlap_after 1ms over a 2ms timeout: %v, want overlap_after named", err)
	}
	c, err := Parse("t.yaml", []byte("redis: {url: \"redis://127.0.0.1:6379\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if d, s := c.Describe(), "up to 2 pipelines in flight, at most 128 decisions each, under load waiting up to 50µs for more, another alongside once those in flight have waited 1ms"; !strings.Contains(d, s) {
		t.Errorf("Describe() does not say %q:\n%s", s, d)
	}
}

func TestRuleDefaults(t *testing.T) {
	tests := []struct {
		name      string
		yaml      string
		wantBurst int64
		wantCost  int64
	}{
		{"gcra burst defaults to limit", "algorithm: gcra\n    limit: 7\n    period: 1s", 7, 1},
		{"token_bucket burst defaults to limit", "algorithm: token_bucket\n    limit: 8\n    period: 1s", 8, 1},
		{"window burst is the limit", "algorithm: fixed_window\n    limit: 9\n    period: 1s", 9, 1},
		{"explicit burst and cost", "algorithm: gcra\n    limit: 9\n    period: 1s\n    burst: 3\n    cost: 3", 3, 3},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Parse("t.yaml", []byte("rules:\n  - name: r\n    "+tt.yaml+"\n"))
			if err != nil {
				t.Fatal(err)
			}
			r := c.Rules[0]
			if r.Burst != tt.wantBurst || r.Cost != tt.wantCost {
				t.Errorf("burst, cost = %d, %d; want %d, %d", r.Burst, r.Cost, tt.wantBurst, tt.wantCost)
			}
			if r.Key != nil || r.Shadow || r.Anonymous != limits.AnonymousIP {
				t.Errorf("key, shadow, anonymous = %v, %v, %v; want none, false, ip", r.Key, r.Shadow, r.Anonymous)
			}
		})
	}
}

// TestGetMatchesHead: a rule on GET also matches HEAD, which applications
// answer with their GET handler; other methods are as written.
func TestGetMatchesHead(t *testing.T) {
	for _, tt := range []struct {
		methods string
		want    []string
	}{
		{"[get]", []string{"GET", "HEAD"}},
		{"[POST, GET]", []string{"POST", "GET", "HEAD"}},
		{"[HEAD, GET]", []string{"HEAD", "GET"}},
		{"[POST]", []string{"POST"}},
		{"[head]", []string{"HEAD"}},
	} {
		c, err := Parse("t.yaml", []byte("rules:\n  - name: r\n    match: {methods: "+tt.methods+"}\n    algorithm: fixed_window\n    limit: 1\n    period: 1s\n"))
		if err != nil {
			t.Fatal(err)
		}
		if got := c.Rules[0].Match.Methods; !reflect.DeepEqual(got, tt.want) {
			t.Errorf("methods %s: %v, want %v", tt.methods, got, tt.want)
		}
	}
}

// TestPathParameters: identity.path_parameters is keep unless set; strip
// makes match.path prefixes and an exception's route what /auth counts.
func TestPathParameters(t *testing.T) {
	c, err := Parse("t.yaml", []byte("rules: []\n"))
	if err != nil || c.Identity.PathParams != limits.KeepPathParams {
		t.Fatalf("default: %v, %v", c.Identity.PathParams, err)
	}
	rule := func(route string) string {
		return "rules:\n  - name: a\n    match: {path: /admin}\n    key: [route]\n    algorithm: fixed_window\n    limit: 1\n    period: 1s\n" +
			"    exceptions:\n      - {match: {route: \"" + route + "\"}, limit: 5}\n"
	}
	c, err = Parse("t.yaml", []byte("identity: {path_parameters: strip}\n"+rule("/admin;x/..;/admin/login;jsessionid=1")))
	if err != nil {
		t.Fatal(err)
	}
	plain, err := Parse("t.yaml", []byte(rule("/admin/login")))
	if err != nil {
		t.Fatal(err)
	}
	if c.Identity.PathParams != limits.StripPathParams {
		t.Fatalf("path_parameters: %v", c.Identity.PathParams)
	}
	if got, want := c.Rules[0].Exceptions[0].ID, plain.Rules[0].Exceptions[0].ID; got != want {
		t.Errorf("the exception's route, parameters stripped: identity %q, want %q", got, want)
	}
	if !strings.Contains(c.Describe(), "path parameters stripped") {
		t.Errorf("Describe does not say parameters are stripped:\n%s", c.Describe())
	}
	if strings.Contains(plain.Describe(), "path parameters") {
		t.Errorf("Describe speaks of parameters when they are kept")
	}
}

func TestTrustedProxiesEmptyListTrustsNone(t *testing.T) {
	c, err := Parse("t.yaml", []byte("identity: {trusted_proxies: []}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Identity.TrustedProxies) != 0 {
		t.Errorf("TrustedProxies = %v, want none", c.Identity.TrustedProxies)
	}
}

// TestTrustedProxiesIPv4Mapped: a proxy written IPv4-mapped (as NGINX
// shows a peer on a dual-stack listen) is its IPv4 address or range, as
// /auth reads every hop; kept IPv6 it matched no hop, and every client
// was counted as the proxy.
func TestTrustedProxiesIPv4Mapped(t *testing.T) {
	c, err := Parse("t.yaml", []byte(`identity: {trusted_proxies: ["::ffff:127.0.0.1", "::ffff:10.0.0.0/104", "::ffff:192.0.2.9/120", "2001:db8::/32"]}`+"\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("127.0.0.1/32"), netip.MustParsePrefix("10.0.0.0/8"),
		netip.MustParsePrefix("192.0.2.0/24"), netip.MustParsePrefix("2001:db8::/32")}
	if !slices.Equal(c.Identity.TrustedProxies, want) {
		t.Errorf("TrustedProxies = %v, want %v", c.Identity.TrustedProxies, want)
	}
}

func TestValidFixtures(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "valid", "*.yaml"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no valid fixtures: %v", err)
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			c, err := Load(f)
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range c.Rules {
				if err := CheckRule(r); err != nil {
					t.Errorf("rule %q fails CheckRule: %v", r.Name, err)
				}
			}
		})
	}
}

func TestMergeKeys(t *testing.T) {
	c, err := Load(filepath.Join("testdata", "valid", "merge.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if len(c.Rules) != 2 {
		t.Fatalf("%d rules, want 2", len(c.Rules))
	}
	r := c.Rules[1]
	if r.Name != "per-ip-strict" || r.Limit != 2 || r.Period != time.Minute || r.Algorithm != limits.SlidingWindow || len(r.Key) != 1 {
		t.Errorf("merged rule = %+v", *r)
	}
}

func TestExample(t *testing.T) {
	c := Example()
	if c.Source != ExampleSource {
		t.Errorf("Source = %q", c.Source)
	}
	if c.Redis.URL != "" || len(c.Redis.ClusterAddrs) != 0 || c.Redis.Sentinel.Master != "" {
		t.Errorf("example configures redis: %+v", c.Redis)
	}
	type ruleSummary struct {
		name   string
		prefix string
		meths  []string
		key    []limits.KeyPart
		alg    limits.Algorithm
		limit  int64
		period time.Duration
	}
	want := []ruleSummary{
		{"login-per-ip", "/login", []string{"POST"}, []limits.KeyPart{{Kind: limits.KeyIP}}, limits.GCRA, 5, time.Minute},
		{"api-per-user", "/api/", nil, []limits.KeyPart{{Kind: limits.KeyUser}}, limits.SlidingWindow, 100, time.Minute},
		{"global", "", nil, nil, limits.FixedWindow, 1000, time.Second},
	}
	var got []ruleSummary
	for _, r := range c.Rules {
		got = append(got, ruleSummary{r.Name, r.Match.PathPrefix, r.Match.Methods, r.Key, r.Algorithm, r.Limit, r.Period})
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("example rules:\n got %+v\nwant %+v", got, want)
	}
	desc := c.Describe()
	for _, s := range []string{ExampleSource, "in-memory", "allow", "login-per-ip", "api-per-user", "global", "5 per 1m", "1000 per 1s"} {
		if !strings.Contains(desc, s) {
			t.Errorf("Describe() does not mention %q:\n%s", s, desc)
		}
	}
}

func TestDescribe(t *testing.T) {
	c, err := Load(filepath.Join("testdata", "valid", "full.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	desc := c.Describe()
	for _, s := range []string{
		"full.yaml", `redis sentinel master "mymaster"`, "local_share 4", "deny status:   403",
		`rule "user-profile"`, "path ~^/users/[0-9]+$; methods GET, HEAD; host api.example.com",
		`header X-Plan: "free"`, "user, header:X-Tenant, route", "gcra", "10 per 1s", "burst:      10",
		`rule "export_7d"`, "70 per 7d", "burst:      20", "cost:       5", "shadow:     yes",
		`rule "sliding-log"`, "50 per 36h", "none (one global counter)",
		`rule "sliding-window"`, "1000000000 per 400d", "lease:      yes (each instance spends slices",
		"each IPv6 client is its /56", "uri X-Uri (else url X-Url)", "request id X-Trace",
	} {
		if !strings.Contains(desc, s) {
			t.Errorf("Describe() does not mention %q:\n%s", s, desc)
		}
	}
	for _, secret := range []string{"s3cret", "redis-secret", "sentinel-secret"} {
		if strings.Contains(desc, secret) {
			t.Errorf("Describe() shows the secret %q:\n%s", secret, desc)
		}
	}
	c, err = Load(filepath.Join("testdata", "valid", "redis_url.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if desc := c.Describe(); strings.Contains(desc, "pa55") || !strings.Contains(desc, "rediss://:xxxxx@redis.example.com:6380/2") {
		t.Errorf("Describe() of a URL with a password:\n%s", desc)
	}
	// go-redis's Sentinel URL carries the servers' password in its query
	c, err = Parse("t.yaml", []byte("redis:\n  url: redis://su:sp55@10.0.0.1:26379?addr=10.0.0.2:26379&master_name=m&password=pa55\nrules: []\n"))
	if err != nil {
		t.Fatal(err)
	}
	if desc := c.Describe(); strings.Contains(desc, "pa55") || strings.Contains(desc, "sp55") || !strings.Contains(desc, "password=xxxxx") {
		t.Errorf("Describe() of a Sentinel URL with a password:\n%s", desc)
	}
}

// TestDescribeWarnsAboutSubSecondPolicies: -check says how a period that is
// not whole seconds is advertised, and says nothing for the others.
func TestDescribeWarnsAboutSubSecondPolicies(t *testing.T) {
	c, err := Parse("t.yaml", []byte(`rules:
  - {name: burst, algorithm: gcra, limit: 10, period: 500ms}
  - {name: slow, algorithm: fixed_window, limit: 7, period: 1500ms}
  - {name: minute, algorithm: fixed_window, limit: 5, period: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	desc := c.Describe()
	for _, want := range []string{
		"warning:    the period 500ms is not a whole number of seconds, which RateLimit-Policy needs: it says q=20;w=1 (2 periods of 500ms: the same rate, stated over 1s)",
		"warning:    the period 1.5s is not a whole number of seconds, which RateLimit-Policy needs: it says q=14;w=3 (2 periods of 1.5s: the same rate, stated over 3s)",
	} {
		if !strings.Contains(desc, want) {
			t.Errorf("Describe() does not say %q:\n%s", want, desc)
		}
	}
	if n := strings.Count(desc, "warning:"); n != 2 {
		t.Errorf("%d warnings, want 2 (none for 5 per 1m):\n%s", n, desc)
	}
}

// TestDescribeWarnsAboutLongTimeout: a redis.timeout past what the shipped
// NGINX configs wait for rategate gets a warning; the default none.
func TestDescribeWarnsAboutLongTimeout(t *testing.T) {
	for timeout, want := range map[string]int{"": 0, "200ms": 0, "300ms": 1, "2s": 1} {
		y := "redis:\n  url: redis://127.0.0.1:6379/0\n"
		if timeout != "" {
			y += "  timeout: " + timeout + "\n"
		}
		c, err := Parse("t.yaml", []byte(y+"rules:\n  - {name: minute, algorithm: fixed_window, limit: 5, period: 1m}\n"))
		if err != nil {
			t.Fatal(err)
		}
		desc := c.Describe()
		if n := strings.Count(desc, "warning:"); n != want || (want == 1 && !strings.Contains(desc, "redis.timeout "+timeout+": the shipped NGINX configs wait 250ms")) {
			t.Errorf("timeout %q: %d warnings, want %d:\n%s", timeout, n, want, desc)
		}
	}
}

func TestLoadMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "nope.yaml")
	_, err := Load(path)
	if err == nil {
		t.Fatal("Load of a missing file succeeded")
	}
	if !strings.Contains(err.Error(), path) || !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("Load error = %v; want one naming %s and wrapping fs.ErrNotExist", err, path)
	}
}

func TestLoadNamesFileInEveryError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rategate.yaml")
	if err := os.WriteFile(path, []byte("rules:\n  - name: login\n    algorithm: gcra\n    limit: 5\n    period: 1m\n    burst: 0\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Load(path)
	want := path + `: rules[0] "login": burst must be >= 1, got 0`
	if err == nil || err.Error() != want {
		t.Errorf("Load error = %v, want %s", err, want)
	}
}

func TestParseDuration(t *testing.T) {
	const day = 24 * time.Hour
	tests := []struct {
		in      string
		want    time.Duration
		wantErr bool
	}{
		{"50ms", 50 * time.Millisecond, false},
		{"1m", time.Minute, false},
		{"1h30m", 90 * time.Minute, false},
		{"1d", day, false},
		{"7d", 7 * day, false},
		{"1d12h", 36 * time.Hour, false},
		{"-1s", -time.Second, false},
		{"1.5d", 0, true},
		{"1d-1h", 0, true},
		{"d", 0, true},
		{"soon", 0, true},
		{"60", 0, true},
		{"", 0, true},
		{"100001d", 0, true},
	}
	for _, tt := range tests {
		got, err := ParseDuration(tt.in)
		if (err != nil) != tt.wantErr || got != tt.want {
			t.Errorf("ParseDuration(%q) = %v, %v; want %v, error %v", tt.in, got, err, tt.want, tt.wantErr)
		}
	}
}

func TestFormatDuration(t *testing.T) {
	tests := []struct {
		in   time.Duration
		want string
	}{
		{time.Second, "1s"},
		{time.Minute, "1m"},
		{time.Hour, "1h"},
		{90 * time.Minute, "1h30m"},
		{24 * time.Hour, "1d"},
		{36 * time.Hour, "36h"},
		{1500 * time.Microsecond, "1.5ms"},
		{0, "0s"},
	}
	for _, tt := range tests {
		got := FormatDuration(tt.in)
		if got != tt.want {
			t.Errorf("FormatDuration(%v) = %q, want %q", tt.in, got, tt.want)
		}
		if back, err := ParseDuration(got); err != nil || back != tt.in {
			t.Errorf("ParseDuration(FormatDuration(%v)) = %v, %v", tt.in, back, err)
		}
	}
}

func TestCheckRule(t *testing.T) {
	ok := limits.Rule{Name: "r", Algorithm: limits.GCRA, Limit: 10, Period: time.Minute, Burst: 10, Cost: 1}
	tests := []struct {
		name   string
		change func(r *limits.Rule)
		want   string // "" = valid
	}{
		{"valid", func(r *limits.Rule) {}, ""},
		{"limit 0", func(r *limits.Rule) { r.Limit = 0 }, "limit must be >= 1, got 0"},
		{"burst 0", func(r *limits.Rule) { r.Burst = 0 }, "burst must be >= 1, got 0"},
		{"period 1500us", func(r *limits.Rule) { r.Period = 1500 * time.Microsecond }, "period must be a whole number of milliseconds, got 1.5ms"},
		{"slow refill", func(r *limits.Rule) { r.Limit, r.Period, r.Burst = 1, 400*24*time.Hour, 2 },
			"burst 2 at 1 per 400d takes 800.0 days to refill; burst*period/limit must be <= 400d to keep the Redis scripts' double arithmetic exact"},
		{"huge burst does not overflow", func(r *limits.Rule) { r.Limit, r.Period, r.Burst = 1, 400*24*time.Hour, 1_000_000_000 },
			"burst 1000000000 at 1 per 400d takes 400000000000.0 days to refill; burst*period/limit must be <= 400d to keep the Redis scripts' double arithmetic exact"},
		{"cost over burst", func(r *limits.Rule) { r.Cost = 11 }, "cost 11 is more than the burst (10): such a request could never be allowed"},
		{"unknown algorithm", func(r *limits.Rule) { r.Algorithm = "leaky" },
			`algorithm "leaky" is unknown; use one of fixed_window, sliding_log, sliding_window, gcra, token_bucket`},
		{"window burst differs", func(r *limits.Rule) { r.Algorithm = limits.FixedWindow; r.Burst = 5 },
			"burst must equal limit (10) for fixed_window, got 5"},
		{"sliding_log at its cap", func(r *limits.Rule) { r.Algorithm, r.Limit, r.Burst = limits.SlidingLog, 10_000, 10_000 }, ""},
		{"sliding_log over its cap", func(r *limits.Rule) { r.Algorithm, r.Limit, r.Burst = limits.SlidingLog, 10_001, 10_001 },
			"limit must be <= 10000 for sliding_log, got 10001: the log keeps a Redis entry (about 110 bytes) per admitted request for a whole period; use sliding_window (O(1) per key, approximate) or gcra (exact, evenly spaced) for larger limits"},
		{"sliding_window over the sliding_log cap", func(r *limits.Rule) { r.Algorithm, r.Limit, r.Burst = limits.SlidingWindow, 20_000, 20_000 }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ok
			tt.change(&r)
			err := CheckRule(&r)
			got := ""
			if err != nil {
				got = err.Error()
			}
			if got != tt.want {
				t.Errorf("CheckRule = %q, want %q", got, tt.want)
			}
		})
	}
}

// FuzzParse checks that no input panics, that every problem names the file,
// and that an accepted config holds only rules CheckRule accepts.
func FuzzParse(f *testing.F) {
	for _, dir := range []string{"valid", "invalid"} {
		files, _ := filepath.Glob(filepath.Join("testdata", dir, "*.yaml"))
		for _, file := range files {
			data, err := os.ReadFile(file)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
	f.Add([]byte("a: &a [*a]\nrules: &r [*r]\n"))
	f.Add([]byte("rules:\n  - &x {<<: *x}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Parse("f.yaml", data)
		if err != nil {
			var errs Errors
			if !errors.As(err, &errs) || len(errs) == 0 {
				t.Fatalf("error %T %v is not Errors", err, err)
			}
			for _, e := range errs {
				if !strings.HasPrefix(e.Error(), "f.yaml: ") {
					t.Fatalf("problem %q does not name the file", e)
				}
			}
			return
		}
		for _, r := range c.Rules {
			if err := CheckRule(r); err != nil {
				t.Fatalf("accepted rule %q fails CheckRule: %v", r.Name, err)
			}
		}
		_ = c.Describe()
	})
}

// TestDescribeWarnsAboutUnanchoredPathRegex: a match.path regex that is
// not anchored at the route's start is tried at every position of every
// route, and a client chooses routes of up to NGINX's 8 KB: twenty such
// rules on a 7 KB route cost an /auth request up to 300 times an ordinary
// one, and an answer slower than NGINX's 250 ms lets the request through.
// -check says so for each such rule, and nothing for anchored ones.
func TestDescribeWarnsAboutUnanchoredPathRegex(t *testing.T) {
	c, err := Parse("t.yaml", []byte(`rules:
  - {name: a, match: {path: "~(?i)/admin(/|$)"}, algorithm: fixed_window, limit: 5, period: 1m}
  - {name: b, match: {path: "~^/api/.*/export"}, algorithm: fixed_window, limit: 5, period: 1m}
  - {name: c, match: {path: "~(?i)^/login(/|$)"}, algorithm: fixed_window, limit: 5, period: 1m}
  - {name: d, match: {path: "~\\.php$"}, algorithm: fixed_window, limit: 5, period: 1m}
  - {name: e, match: {path: "~^/x|^/y"}, algorithm: fixed_window, limit: 5, period: 1m}
`))
	if err != nil {
		t.Fatal(err)
	}
	desc := c.Describe()
	for _, want := range []string{
		`warning:    match.path regex "(?i)/admin(/|$)" is not anchored with ^`,
		`warning:    match.path regex "\\.php$" is not anchored with ^`,
	} {
		if !strings.Contains(desc, want) {
			t.Errorf("Describe() does not say %q:\n%s", want, desc)
		}
	}
	if n := strings.Count(desc, "warning:"); n != 2 {
		t.Errorf("%d warnings, want 2 (none for ^/api/.*/export, (?i)^/login, ^/x|^/y):\n%s", n, desc)
	}
}
