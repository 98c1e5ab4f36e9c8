package app

import (
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/admin"
	"github.com/rategate/rategate/handler"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/metrics"
	"github.com/rategate/rategate/policy"
	"github.com/rategate/rategate/top"
)

const identityAPIConfig = `
identity_overrides: {max_entries: 2}
rules:
  - name: api
    key: [user]
    algorithm: gcra
    limit: 3
    period: 1h
    burst: 3
    exceptions:
      - match: {user: vip}
        limit: 30
  - name: global
    match: {path: /global}
    algorithm: gcra
    limit: 3
    period: 1h
  - name: multi
    match: {path: /multi}
    key: [ip, header:X-Plan]
    algorithm: fixed_window
    limit: 3
    period: 1h
`

// TestIdentityAPIBadInput: every bad request is a 4xx that says why, and
// nothing is stored.
func TestIdentityAPIBadInput(t *testing.T) {
	s := newStack(t, identityAPIConfig, "")
	for _, c := range []struct {
		method, uri, body string
		status            int
		want              []string
	}{
		{"PUT", "/v1/rules/nope/identities?user=a", `{"limit":5}`, 404, []string{`no such rule \"nope\"`}},
		{"PUT", "/v1/rules/api/identities", `{"limit":5}`, 400, []string{"user: rule \\\"api\\\" is keyed on user; give ?user="}},
		{"PUT", "/v1/rules/api/identities?usr=a", `{"limit":5}`, 400, []string{`usr: not a dimension of rule \"api\", which is keyed on [user]`}},
		{"PUT", "/v1/rules/api/identities?user=a&user=b", `{"limit":5}`, 400, []string{"user: given twice"}},
		{"PUT", "/v1/rules/api/identities?user=a&ip=192.0.2.1", `{"limit":5}`, 400, []string{"give ?user= or ?ip=, not both"}},
		{"PUT", "/v1/rules/multi/identities?ip=192.0.2.1", `{"limit":5}`, 400, []string{"header.X-Plan: rule"}},
		{"PUT", "/v1/rules/multi/identities?ip=nope&header.x-plan=gold", `{"limit":5}`, 400, []string{`ip: \"nope\" is not an IP address`}},
		{"PUT", "/v1/rules/multi/identities?ip=192.0.2.1&header.X-Plan=a&header.x-plan=b", `{"limit":5}`, 400, []string{"header.X-Plan: given twice"}},
		{"PUT", "/v1/rules/api/identities?user=a", `{"exempt":true,"block":true}`, 400, []string{"exempt, block: give one of them, not both"}},
		{"PUT", "/v1/rules/api/identities?user=a", `{"exempt":true,"limit":5}`, 400, []string{"limit: cannot go with exempt"}},
		{"PUT", "/v1/rules/api/identities?user=a", `{"burst":2000000000}`, 400, []string{"burst: must be <= 1000000000"}},
		{"PUT", "/v1/rules/api/identities?user=a", `{"limit":1,"period":"400d","burst":3}`, 400, []string{"takes 1200.0 days to refill"}},
		{"PUT", "/v1/rules/multi/identities?ip=192.0.2.1&header.X-Plan=a", `{"burst":5}`, 400, []string{"burst: is only for gcra and token_bucket, not fixed_window"}},
		{"PUT", "/v1/rules/api/identities?user=a", `{"block":true,"ttl":"401d"}`, 400, []string{"ttl: must be >= 1ms and <= 400d, got 401d"}},
		{"PUT", "/v1/rules/api/identities?user=a", `{"block":true,"ttl":"0s"}`, 400, []string{"ttl: must be >= 1ms"}},
		{"PUT", "/v1/rules/api/identities?user=a", `{"block":true,"ttl":"999us"}`, 400, []string{"ttl: must be >= 1ms"}},
		{"PUT", "/v1/rules/api/identities?user=a", `{"limit":"5"}`, 400, []string{"limit: must be a whole number"}},
		{"PUT", "/v1/rules/api/identities?user=a", `{"limit":5,` + strings.Repeat(" ", 65<<10) + `}`, 413, []string{"more than the 65536 an identity override may have"}},
		{"PUT", "/v1/rules/api/identities?user=a", ``, 400, []string{"body: must be a JSON object"}},
		{"DELETE", "/v1/rules/api/identities?user=a", ``, 404, []string{"no runtime identity override for a under rule"}},
		{"GET", "/v1/rules/api/identities?user=a", ``, 404, []string{"has no identity override or exception for user=a"}},
		{"GET", "/v1/rules/api/identities?n=0", ``, 400, []string{"n: must be a whole number from 1 to 10000"}},
		{"GET", "/v1/rules/api/identities?n=10001", ``, 400, []string{"n: must be a whole number from 1 to 10000"}},
		{"GET", "/v1/rules/api/identities?bogus=1", ``, 400, []string{"bogus: unknown parameter"}},
		{"POST", "/v1/rules/api/identities?user=a", `{}`, 405, []string{"use GET or PUT or DELETE"}},
		{"PUT", "/v1/rules/global/identities", `{"limit":5}`, 400, []string{"global\\\" is keyed on nothing", "PUT /v1/rules/global/override"}},
		// Identities no request can have: HTTP trims a header value, and
		// /auth refuses a control byte in one.
		{"PUT", "/v1/rules/api/identities?user=%20acme", `{"limit":5}`, 400, []string{`user: \" acme\" starts or ends with white space`}},
		{"PUT", "/v1/rules/api/identities?user=acme%09", `{"limit":5}`, 400, []string{`starts or ends with white space`}},
		{"PUT", "/v1/rules/api/identities?user=a%00b", `{"limit":5}`, 400, []string{`holds the control byte 0x00`}},
		{"PUT", "/v1/rules/multi/identities?ip=192.0.2.1&header.X-Plan=gold%20", `{"limit":5}`, 400, []string{`header.X-Plan: \"gold \" starts or ends`}},
		// An IPv6 client's network is accepted only as keys write it.
		{"PUT", "/v1/rules/multi/identities?ip=2001:db8::/48&header.X-Plan=a", `{"limit":5}`, 400, []string{`ip: \"2001:db8::/48\" is a network`, "its /64"}},
		{"PUT", "/v1/rules/multi/identities?ip=10.0.0.0/8&header.X-Plan=a", `{"limit":5}`, 400, []string{`is a network`}},
		{"PUT", "/v1/rules/multi/identities?ip=2001:db8::1/64&header.X-Plan=a", `{"limit":5}`, 400, []string{`is a network`}},
	} {
		code, out := call(t, s.admin, c.method, c.uri, c.body)
		if code != c.status {
			t.Errorf("%s %s: %d, want %d: %s", c.method, c.uri[:min(len(c.uri), 80)], code, c.status, out)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(out, w) {
				t.Errorf("%s %s: answer lacks %q: %s", c.method, c.uri[:min(len(c.uri), 80)], w, out[:min(len(out), 400)])
			}
		}
	}
	var l policy.IdentityList
	s.api("GET", "/v1/rules/api/identities", "", 200, &l)
	if l.Runtime != 0 || len(l.Identities) != 1 || l.Identities[0].ID != "vip" {
		t.Fatalf("after bad requests: %+v", l)
	}
	// The cap (2): a third identity is a 409, a change of a stored one is not.
	s.api("PUT", "/v1/rules/api/identities?user=a", `{"limit":5}`, 200, nil)
	s.api("PUT", "/v1/rules/multi/identities?ip=192.0.2.1&header.X-Plan=gold", `{"exempt":true}`, 200, nil)
	out := s.api("PUT", "/v1/rules/api/identities?user=b", `{"limit":5}`, 409, nil)
	if !strings.Contains(out, "identity_overrides.max_entries") {
		t.Fatalf("cap answer: %s", out)
	}
	s.api("PUT", "/v1/rules/api/identities?user=a", `{"limit":6}`, 200, nil)
	s.api("GET", "/v1/rules/api/identities", "", 200, &l)
	if l.Runtime != 1 || l.Max != 2 {
		t.Fatalf("after the cap: %+v", l)
	}
}

// TestIdentityAPI: set, see, use and delete an identity override through
// the admin API on both stores; GET /v1/keys shows it, the headers state
// the identity's own policy, top marks a blocked identity, the metrics
// count decisions under overrides per rule.
func TestIdentityAPI(t *testing.T) {
	stores(t, func(t *testing.T, redisAddr string) {
		s := newStack(t, strings.Replace(identityAPIConfig, "max_entries: 2", "max_entries: 10", 1), redisAddr)
		var v policy.IdentityView
		s.api("PUT", "/v1/rules/api/identities?user=acme", `{"limit":5,"reason":"trial","ttl":"1h"}`, 200, &v)
		if v.Action != "limit" || v.Effective == nil || v.Effective.Limit != 5 || v.Effective.Burst != 5 || v.Reason != "trial" || v.ExpiresAt == nil ||
			v.Key != s.limiter.Prefix()+":{api:acme}:gc2" || !strings.HasPrefix(v.SetBy, "127.0.0.1:") {
			t.Fatalf("PUT answer: %+v", v)
		}
		ask := func(u string) (int, string) {
			code, _ := call(t, s.auth, "GET", "/auth", "", "X-Original-URI", "/x", "X-Real-IP", "192.0.2.1", "X-User-Id", u)
			return code, ""
		}
		req := fasthttp.AcquireRequest()
		defer fasthttp.ReleaseRequest(req)
		resp := fasthttp.AcquireResponse()
		defer fasthttp.ReleaseResponse(resp)
		req.SetRequestURI("http://" + s.auth.Addr + "/auth")
		req.Header.Set("X-Original-URI", "/x")
		req.Header.Set("X-Real-IP", "192.0.2.1")
		req.Header.Set("X-User-Id", "acme")
		if err := s.auth.Do(req, resp); err != nil {
			t.Fatal(err)
		}
		if pol := string(resp.Header.Peek("RateLimit-Policy")); resp.StatusCode() != 204 || pol != `"api";q=5;w=3600` || string(resp.Header.Peek("X-RateLimit-Limit")) != "5" {
			t.Fatalf("acme's first answer: %d, RateLimit-Policy %q", resp.StatusCode(), pol)
		}
		allowed := 1
		for i := 0; i < 6; i++ {
			if code, _ := ask("acme"); code == 204 {
				allowed++
			}
		}
		if allowed != 5 {
			t.Fatalf("acme: %d of 7 allowed, want its own 5", allowed)
		}
		var k admin.KeyView
		s.api("GET", "/v1/keys/api?user=acme", "", 200, &k)
		if k.Limit != 5 || k.Remaining != 0 || k.IdentityOverride == nil || k.IdentityOverride.Reason != "trial" {
			t.Fatalf("key view: %+v", k)
		}
		s.api("GET", "/v1/keys/api?user=vip", "", 200, &k)
		if k.Limit != 30 || k.IdentityOverride == nil || k.IdentityOverride.Source != "config" {
			t.Fatalf("key view of an exception: %+v", k)
		}
		// Block: denied with Retry-After from the block, marked in top.
		s.api("PUT", "/v1/rules/api/identities?user=mallory", `{"block":true,"ttl":"90s"}`, 200, nil)
		for i := 0; i < 3; i++ {
			req.Header.Set("X-User-Id", "mallory")
			resp.Reset()
			if err := s.auth.Do(req, resp); err != nil {
				t.Fatal(err)
			}
			// the block's time left: 90 s, less what a slow machine took
			// since the PUT
			ra := string(resp.Header.Peek("Retry-After"))
			left, _ := strconv.Atoi(ra)
			if resp.StatusCode() != 429 || left < 75 || left > 90 || string(resp.Header.Peek("X-RateLimit-Rule")) != "api" {
				t.Fatalf("mallory: %d Retry-After %q, want the 90s block's time left", resp.StatusCode(), ra)
			}
		}
		// A block without an end: no Retry-After, and the body says why.
		s.api("PUT", "/v1/rules/api/identities?user=eve", `{"block":true}`, 200, nil)
		req.Header.Set("X-User-Id", "eve")
		resp.Reset()
		if err := s.auth.Do(req, resp); err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode() != 429 || len(resp.Header.Peek("Retry-After")) != 0 || string(resp.Body()) != "blocked by rule \"api\"\n" {
			t.Fatalf("eve: %d Retry-After %q body %q", resp.StatusCode(), resp.Header.Peek("Retry-After"), resp.Body())
		}
		var tv top.TopView
		s.api("GET", "/v1/top?rule=api", "", 200, &tv)
		marked := map[string]bool{}
		for _, d := range tv.Rules[0].Top {
			marked[d.Identity] = d.Blocked
		}
		if !marked["mallory"] || marked["acme"] {
			t.Fatalf("top: %+v", tv.Rules[0].Top)
		}
		// Delete: the rule's own numbers again (acme used 5 of 3).
		s.api("DELETE", "/v1/rules/api/identities?user=acme", "", 200, nil)
		if code, _ := ask("acme"); code != 429 {
			t.Fatalf("acme after the delete: %d, want 429", code)
		}
		out := s.api("GET", "/metrics", "", 200, nil)
		for _, want := range []string{
			`rategate_identity_decisions_total{rule="api",action="limit"} 7`,
			`rategate_identity_decisions_total{rule="api",action="block"} 4`,
			`rategate_identity_decisions_total{rule="multi",action="exempt"} 0`,
			`rategate_identity_overrides{rule="api",source="runtime"} 2`,
			`rategate_identity_overrides{rule="api",source="config"} 1`,
		} {
			if !strings.Contains(out, want) {
				t.Errorf("metrics lack %s", want)
			}
		}
	})
}

// TestObservedIdentityAllocs: a request of an overridden identity through
// the handler, observed by the metrics (identity counters included) and
// the top sketch, allocates no more than the plain observed request
// (observedAllocs).
func TestObservedIdentityAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector makes sync.Pool drop items on purpose; run without -race")
	}
	m := metrics.New()
	mem := memstore.New()
	defer mem.Close()
	base := &limits.Rule{Name: "per-ip", Key: []limits.KeyPart{{Kind: limits.KeyIP}}, Algorithm: limits.FixedWindow, Limit: 10, Period: time.Minute, Burst: 10, Cost: 1}
	own := base.Derive(limits.IdentityLimit)
	own.Limit, own.Burst = 1<<40, 1<<40
	tb := limits.NewIdentityTable(map[string]limits.IdentityEntry{"192.0.2.7": {Rule: own, ExpiresUS: time.Now().Add(time.Hour).UnixMicro()}}, nil)
	for i := 0; i < 100_000; i++ {
		tb.Set(fmt.Sprintf("10.%d.%d.%d", i>>16, (i>>8)&255, i&255), limits.IdentityEntry{Rule: own})
	}
	l := limits.New(limits.Options{Store: mem, Prefix: "rg", Rules: []*limits.Rule{base.WithIdentities(tb)}, Observer: m})
	m.SetRules([]metrics.RuleInfo{{Name: "per-ip"}})
	h := handler.New(l, l, handler.Options{Observer: observer{metrics: m, top: top.New()}})
	var ctx fasthttp.RequestCtx
	ctx.Request.SetRequestURI("/auth")
	ctx.Request.Header.Set("X-Original-URI", "/api/v1/items?page=2")
	ctx.Request.Header.Set("X-Real-IP", "192.0.2.7")
	serve := func() {
		ctx.Response.Reset()
		h.Serve(&ctx)
	}
	serve()
	if got := string(ctx.Response.Header.PeekCanonical([]byte("X-RateLimit-Limit"))); ctx.Response.StatusCode() != 204 || got != "1099511627776" {
		t.Fatalf("status %d, X-RateLimit-Limit %q: the identity's own limit", ctx.Response.StatusCode(), got)
	}
	n := testing.AllocsPerRun(2000, serve)
	t.Logf("allocations per observed /auth request of an overridden identity: %v", n)
	if n > observedAllocs {
		t.Errorf("%v allocations, want <= %d", n, observedAllocs)
	}
	var sb strings.Builder
	m.WritePrometheus(&sb)
	if !strings.Contains(sb.String(), `rategate_identity_decisions_total{rule="per-ip",action="limit"} 2002`) {
		t.Errorf("identity decisions not counted:\n%s", grepLines(sb.String(), "identity"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestIPv6PrefixReloadFlagsOverrides: an identity override of an IPv6
// client names its network under identity.ipv6_prefix. A reload that
// changes the prefix leaves it naming no client /auth makes: the list must
// say so (as for a change of the rule's key), not show it as in force
// while it no longer applies. IPv4 overrides are untouched.
func TestIPv6PrefixReloadFlagsOverrides(t *testing.T) {
	const rules = `rules:
  - name: ipr
    key: [ip]
    algorithm: fixed_window
    limit: 3
    period: 1h
`
	a, write := fileApp(t, rules, zerolog.Nop())
	s := &stack{t: t, app: a, rules: a.Rules(), limiter: a.Limiter(), auth: serveOn(t, a.Handler()), admin: serveOn(t, a.AdminHandler())}
	ask := func(ip string) int {
		code, _ := call(t, s.auth, "GET", "/auth", "", "X-Original-URI", "/x", "X-Real-IP", ip)
		return code
	}
	s.api("PUT", "/v1/rules/ipr/identities?ip=2001:db8:aa:bb::1", `{"block":true}`, 200, nil)
	s.api("PUT", "/v1/rules/ipr/identities?ip=192.0.2.9", `{"block":true}`, 200, nil)
	if c4, c6 := ask("192.0.2.9"), ask("2001:db8:aa:bb::2"); c4 != 429 || c6 != 429 {
		t.Fatalf("before the reload: IPv4 %d, IPv6 %d; want both blocked", c4, c6)
	}
	list := func() map[string]string {
		var l struct {
			Identities []policy.IdentityView `json:"identities"`
		}
		s.api("GET", "/v1/rules/ipr/identities", "", 200, &l)
		errs := map[string]string{}
		for _, v := range l.Identities {
			errs[v.ID] = v.Error
		}
		return errs
	}
	if errs := list(); len(errs) != 2 || errs["2001:db8:aa:bb::/64"] != "" || errs["192.0.2.9"] != "" {
		t.Fatalf("list before the reload: %v", errs)
	}
	// The network as keys and the list write it names the same identity.
	var v policy.IdentityView
	s.api("GET", "/v1/rules/ipr/identities?ip=2001:db8:aa:bb::/64", "", 200, &v)
	if v.ID != "2001:db8:aa:bb::/64" || v.Action != "block" {
		t.Fatalf("GET by the /64: %+v", v)
	}
	write("identity: {ipv6_prefix: 56}\n" + rules)
	if _, err := a.Reload("test"); err != nil {
		t.Fatal(err)
	}
	errs := list()
	if e := errs["2001:db8:aa:bb::/64"]; !strings.Contains(e, "ipv6_prefix was 64, it is now 56") {
		t.Fatalf("the /64 override after the prefix became 56: error %q, want it flagged (list %v)", e, errs)
	}
	if errs["192.0.2.9"] != "" {
		t.Fatalf("the IPv4 override after the prefix changed: %q", errs["192.0.2.9"])
	}
	if c := ask("192.0.2.9"); c != 429 {
		t.Fatalf("IPv4 after the reload: %d, want still blocked", c)
	}
	// Set again under the new prefix, it applies to the /56.
	s.api("PUT", "/v1/rules/ipr/identities?ip=2001:db8:aa:bb::1", `{"block":true}`, 200, nil)
	if c := ask("2001:db8:aa:ff::1"); c != 429 {
		t.Fatalf("an address of the blocked /56: %d, want 429", c)
	}
	if e := list()["2001:db8:aa::/56"]; e != "" {
		t.Fatalf("the override set under /56: error %q", e)
	}
	s.api("GET", "/v1/rules/ipr/identities?ip=2001:db8:aa::/56", "", 200, &v)
	// The flagged one can still be read and removed by the network it names;
	// a PUT of it would name no request.
	s.api("PUT", "/v1/rules/ipr/identities?ip=2001:db8:aa:bb::/64", `{"block":true}`, 400, nil)
	s.api("GET", "/v1/rules/ipr/identities?ip=2001:db8:aa:bb::/64", "", 200, &v)
	if v.ID != "2001:db8:aa:bb::/64" || !strings.Contains(v.Error, "ipv6_prefix") {
		t.Fatalf("GET of the flagged /64: %+v", v)
	}
	s.api("DELETE", "/v1/rules/ipr/identities?ip=2001:db8:aa:bb::/64", "", 200, nil)
	if errs := list(); len(errs) != 2 || errs["192.0.2.9"] != "" || errs["2001:db8:aa::/56"] != "" {
		t.Fatalf("list after deleting the flagged /64: %v, want the IPv4 and the /56 overrides only", errs)
	}
	s.api("GET", "/v1/rules/ipr/identities?ip=2001:db8::/40", "", 400, nil)
}
