package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/rategate/rategate/admin"
	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/policy"
)

// identityConfig: per-user is exact (sliding_log, no window boundary in
// a test) and matches every request; per-ip only /both, to see a request
// decided by two rules.
const identityConfig = `
redis:
  url: redis://%s/0
  key_prefix: %s
  timeout: 2s  # exact counts, not latency: no undecided answers on a loaded machine
admin:
  token: %s
rules:
  - name: per-user
    key: [user]
    algorithm: sliding_log
    limit: 3
    period: 1h
    exceptions:
      - match: {user: partner}
        limit: 6
        reason: contract
  - name: per-ip
    match: {path: /both}
    key: [ip]
    algorithm: sliding_log
    limit: 5
    period: 1h
`

// askAs sends /auth for user from ip on path and returns status and headers.
func (p *proc) askAs(path, ip, user string) (int, http.Header) {
	req, _ := http.NewRequest("GET", "http://"+p.main+"/auth", nil)
	req.Header.Set("X-Original-URI", path)
	req.Header.Set("X-Real-IP", ip)
	req.Header.Set("X-User-Id", user)
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, nil
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header
}

// keyView returns GET /v1/keys/{rule}?query.
func (p *proc) keyView(rule, query string) admin.KeyView {
	p.t.Helper()
	var v admin.KeyView
	if err := json.Unmarshal([]byte(p.api("GET", "/v1/keys/"+rule+"?"+query, "", 200)), &v); err != nil {
		p.t.Fatal(err)
	}
	return v
}

// decides returns how many decisions this process sent to the store.
func decides(fams map[string]*dto.MetricFamily) uint64 {
	m := metric(fams, "rategate_store_duration_seconds", "op", "decide")
	if m == nil || m.Histogram == nil {
		return 0
	}
	return m.GetHistogram().GetSampleCount()
}

// TestIdentityOverridesAcrossProcesses: two rategate processes share a
// real Redis. An identity override set through one is enforced by the
// other within 1 s; own numbers, exempt and block behave as documented
// (exempt still decided by the other rules, block asks Redis nothing);
// a TTL ends an override on both; overrides survive a restart of both;
// 200 concurrent requests of an overridden identity across both admit
// exactly its limit; the CLI sets, shows, lists and clears them.
func TestIdentityOverridesAcrossProcesses(t *testing.T) {
	t.Parallel()
	rs := testredis.Start(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rategate.yaml")
	prefix := uniquePrefix(t)
	writeFile(t, cfg, fmt.Sprintf(identityConfig, rs.Addr, prefix, "tok"))
	a := startRategate(t, "a", cfg, "tok")
	b := startRategate(t, "b", cfg, "tok")
	both := []*proc{a, b}
	count := func(path, ip, user string, n int) int {
		got := 0
		for i := 0; i < n; i++ {
			if code, _ := both[i%2].askAs(path, ip, user); code == 204 {
				got++
			}
		}
		return got
	}

	// Own numbers: set through a, enforced by b within 1 s, on the key
	// acme had (its 2 earlier requests count).
	if got := count("/x", "192.0.2.1", "acme", 2); got != 2 {
		t.Fatalf("acme before: %d of 2", got)
	}
	a.api("PUT", "/v1/rules/per-user/identities?user=acme", `{"limit":10,"reason":"trial"}`, 200)
	took := within(t, time.Second, "b applies acme's override", func() error {
		if v := b.keyView("per-user", "user=acme"); v.Limit != 10 || v.IdentityOverride == nil {
			return fmt.Errorf("b: limit %d, override %v", v.Limit, v.IdentityOverride)
		}
		return nil
	})
	t.Logf("identity override enforced by the other process after %v", took)
	code, h := b.askAs("/x", "192.0.2.1", "acme")
	if code != 204 || h.Get("RateLimit-Policy") != `"per-user";q=10;w=3600` || h.Get("X-RateLimit-Remaining") != "7" {
		t.Fatalf("acme on b: %d, RateLimit-Policy %q, remaining %q", code, h.Get("RateLimit-Policy"), h.Get("X-RateLimit-Remaining"))
	}
	if got := count("/x", "192.0.2.1", "acme", 9); got != 7 {
		t.Fatalf("acme: %d more admitted, want 7 (10, 3 used)", got)
	}
	if got := count("/x", "192.0.2.1", "someone", 5); got != 3 {
		t.Fatalf("another user: %d of 5, want the rule's 3", got)
	}
	if got := count("/x", "192.0.2.1", "partner", 8); got != 6 {
		t.Fatalf("the config exception: %d of 8, want 6", got)
	}

	// Exempt: per-user counts nothing for health; per-ip still decides.
	b.api("PUT", "/v1/rules/per-user/identities?user=health", `{"exempt":true}`, 200)
	within(t, time.Second, "a applies the exemption", func() error {
		if v := a.keyView("per-user", "user=health"); v.IdentityOverride == nil || v.IdentityOverride.Action != "exempt" {
			return fmt.Errorf("a: %+v", v.IdentityOverride)
		}
		return nil
	})
	if got := count("/both", "198.51.100.1", "health", 8); got != 5 {
		t.Fatalf("exempt from per-user on /both: %d of 8 admitted, want per-ip's 5", got)
	}
	if got := count("/x", "198.51.100.1", "health", 10); got != 10 {
		t.Fatalf("exempt on /x: %d of 10", got)
	}
	if v := a.keyView("per-user", "user=health"); v.Remaining != 3 {
		t.Fatalf("health's per-user key: %d remaining, want 3 (counted nothing)", v.Remaining)
	}

	// Block: denied on both with Retry-After from the block, Redis is not
	// asked, per-ip consumes nothing; then it ends by itself on both.
	a.api("PUT", "/v1/rules/per-user/identities?user=mallory", `{"block":true,"ttl":"3s","reason":"abuse"}`, 200)
	within(t, time.Second, "b applies the block", func() error {
		if code, _ := b.askAs("/x", "203.0.113.9", "mallory"); code != 429 {
			return fmt.Errorf("b answers %d", code)
		}
		return nil
	})
	before := [2]uint64{decides(a.scrape()), decides(b.scrape())}
	for i := 0; i < 6; i++ {
		code, h := both[i%2].askAs("/both", "203.0.113.9", "mallory")
		if code != 429 || h.Get("X-RateLimit-Rule") != "per-user" {
			t.Fatalf("mallory: %d rule %q", code, h.Get("X-RateLimit-Rule"))
		}
		if ra := h.Get("Retry-After"); ra != "3" && ra != "2" && ra != "1" {
			t.Fatalf("mallory: Retry-After %q, want the block's time left", ra)
		}
	}
	if after := [2]uint64{decides(a.scrape()), decides(b.scrape())}; after != before {
		t.Fatalf("store decisions %v -> %v: a blocked request asked Redis", before, after)
	}
	if v := b.keyView("per-ip", "ip=203.0.113.9"); v.Remaining != 5 {
		t.Fatalf("mallory's per-ip key: %d remaining, want 5", v.Remaining)
	}
	m := b.scrape()
	if got := value(m, "rategate_identity_decisions_total", "rule", "per-user", "action", "block"); got < 3 {
		t.Fatalf("b counted %v blocked decisions", got)
	}
	if got := value(m, "rategate_identity_overrides", "rule", "per-user", "source", "runtime"); got != 3 {
		t.Fatalf("b's runtime overrides of per-user: %v, want 3", got)
	}
	within(t, 5*time.Second, "the block ends on both", func() error {
		for _, p := range both {
			if code, _ := p.askAs("/x", "203.0.113.9", "mallory"); code != 204 {
				return fmt.Errorf("%s answers %d", p.name, code)
			}
		}
		return nil
	})
	c := rs.Client(t)
	within(t, 2*time.Second, "the expired block leaves Redis", func() error {
		if ok, _ := c.HExists(testredis.Ctx(t), prefix+":{identities}", "per-user mallory").Result(); ok {
			return fmt.Errorf("still stored")
		}
		return nil
	})

	// Restart: both come back with the overrides.
	a.api("PUT", "/v1/rules/per-user/identities?user=keeper", `{"limit":7}`, 200)
	a.restart()
	b.restart()
	for _, p := range both {
		if v := p.keyView("per-user", "user=keeper"); v.Limit != 7 {
			t.Fatalf("%s after restart: keeper's limit %d", p.name, v.Limit)
		}
	}
	if got := count("/x", "192.0.2.5", "keeper", 9); got != 7 {
		t.Fatalf("after restart: keeper %d of 9, want 7", got)
	}

	// Exact under concurrency with the override active, across both.
	b.api("PUT", "/v1/rules/per-user/identities?user=conc", `{"limit":37}`, 200)
	within(t, time.Second, "a applies conc's override", func() error {
		if v := a.keyView("per-user", "user=conc"); v.Limit != 37 {
			return fmt.Errorf("a: %d", v.Limit)
		}
		return nil
	})
	var admitted, failed atomic.Int64
	var wg sync.WaitGroup
	gate := make(chan struct{})
	for i := 0; i < 200; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			<-gate
			switch code, _ := both[i%2].askAs("/x", fmt.Sprintf("10.0.%d.%d", i/250, i%250), "conc"); code {
			case 204:
				admitted.Add(1)
			case 429:
			default:
				failed.Add(1)
			}
		}(i)
	}
	close(gate)
	wg.Wait()
	if admitted.Load() != 37 || failed.Load() != 0 {
		t.Fatalf("200 concurrent requests of conc: %d admitted, %d failed; want exactly 37 admitted", admitted.Load(), failed.Load())
	}

	// A body over 64 KiB through the real listener: 413 with the reason, nothing stored.
	out := a.api("PUT", "/v1/rules/per-user/identities?user=huge", `{"limit":5,`+strings.Repeat(" ", 70<<10)+`}`, 413)
	if !strings.Contains(out, "request body over 65536 bytes") {
		t.Fatalf("413 answer: %s", out)
	}
	b.api("GET", "/v1/rules/per-user/identities?user=huge", "", 404)

	// The CLI.
	run := adminCLI(t, a.admin, "tok")
	mustContain(t, run(0, "identity", "per-user", "user=cli", "limit=4", "ttl=30d", "reason=big customer"), "set", "4/1h", "big customer", "until")
	mustContain(t, run(0, "identity", "per-user", "user=cli"), "4/1h", "big customer", "set by")
	mustContain(t, run(0, "identity", "per-user", "user=bot", "block", "ttl=1h"), "blocked")
	mustContain(t, run(0, "identity", "per-user", "user=probe", "exempt"), "exempt")
	mustContain(t, run(0, "identity", "per-user", "list"), "IDENTITY", "user=cli", "user=bot", "blocked", "user=partner", "config", "contract", "6/1h")
	mustContain(t, run(1, "identity", "per-user", "user=x", "exempt", "limit=3"), "limit: cannot go with exempt", "400")
	mustContain(t, run(1, "identity", "per-user", "usr=x", "limit=3"), "not a dimension", "400")
	mustContain(t, run(1, "identity", "nosuch", "user=x", "limit=3"), "no such rule", "404")
	mustContain(t, run(2, "identity", "per-user", "user=x", "exempt", "block"), "give one of exempt, block, clear, list")
	for i := 0; i < 3; i++ {
		a.askAs("/x", "192.0.2.9", "bot")
	}
	within(t, 5*time.Second, "top marks the blocked identity", func() error {
		out := run(0, "top", "per-user")
		if !strings.Contains(out, "bot (blocked)") {
			return fmt.Errorf("top:\n%s", out)
		}
		return nil
	})
	mustContain(t, run(0, "key", "per-user", "user=cli"), "identity override", "4/1h")
	mustContain(t, run(0, "identity", "per-user", "user=cli", "clear"), "deleted", "the rule's own numbers apply")
	mustContain(t, run(1, "identity", "per-user", "user=cli", "clear"), "no runtime identity override", "404")
	var l policy.IdentityList
	if err := json.Unmarshal([]byte(b.api("GET", "/v1/rules/per-user/identities", "", 200)), &l); err != nil {
		t.Fatal(err)
	}
	if l.Runtime != 6 || !l.Shared { // acme, health, keeper, conc, bot, probe
		t.Fatalf("b lists %d runtime overrides (shared %v), want 6", l.Runtime, l.Shared)
	}

	// A reload applies a new cap and new exceptions.
	next := strings.Replace(fmt.Sprintf(identityConfig, rs.Addr, prefix, "tok"), "rules:\n",
		"identity_overrides: {max_entries: 6}\nrules:\n", 1)
	next = strings.Replace(next, "        reason: contract\n", "        reason: contract\n      - match: {user: newbie}\n        exempt: true\n", 1)
	writeFile(t, cfg, next)
	out = a.api("POST", "/v1/reload", "", 200)
	if !strings.Contains(out, "identity_overrides.max_entries") || !strings.Contains(out, `"changed": [
    "per-user"`) {
		t.Fatalf("reload answer: %s", out)
	}
	if !strings.Contains(a.api("PUT", "/v1/rules/per-user/identities?user=seventh", `{"limit":2}`, 409), "6 identity overrides are stored") {
		t.Fatal("the reloaded cap is not applied")
	}
	exempted := 0
	for i := 0; i < 5; i++ {
		if code, _ := a.askAs("/x", "192.0.2.77", "newbie"); code == 204 {
			exempted++
		}
	}
	if exempted != 5 {
		t.Fatalf("newbie after the reload: %d of 5 admitted, want the new exception's exemption", exempted)
	}
}
