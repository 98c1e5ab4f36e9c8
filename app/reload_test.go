package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"
)

// TestNeedRestartNamesEveryCoalesceField: a reload keeps the running
// redis.coalesce (the store is built once), so a change to any of its
// fields must be named as needing a restart, not dropped in silence. The
// fields are walked by reflection: a new one without its line in
// needRestart fails here.
func TestNeedRestartNamesEveryCoalesceField(t *testing.T) {
	needRestartForEachField(t, "redis.coalesce.", func(c *config.Config) reflect.Value { return reflect.ValueOf(&c.Redis.Coalesce).Elem() })
}

// TestMemoryMaxKeys: memory_max_keys bounds the in-memory store, a reload
// moves the bound at once, and its default is the store's own.
func TestMemoryMaxKeys(t *testing.T) {
	if got := memstore.DefaultMaxKeys; got != 1_000_000 {
		t.Fatalf("memstore.DefaultMaxKeys %d, want config's default 1,000,000", got)
	}
	c, err := config.Parse("t.yaml", []byte("rules: []\n"))
	if err != nil || c.MemoryMaxKeys != memstore.DefaultMaxKeys {
		t.Fatalf("default memory_max_keys %d (%v), want %d", c.MemoryMaxKeys, err, memstore.DefaultMaxKeys)
	}
	const rules = `rules:
  - name: per-route
    key: [route]
    algorithm: fixed_window
    limit: 5
    period: 1h
`
	file := func(maxKeys int) string { return fmt.Sprintf("memory_max_keys: %d\n%s", maxKeys, rules) }
	a, write := fileApp(t, file(640), zerolog.Nop())
	mem := a.memoryStores()
	if len(mem) != 1 {
		t.Fatalf("%d memory stores without Redis, want 1", len(mem))
	}
	flood := func(from, to int) {
		var d limits.Decision
		for i := from; i < to; i++ {
			req := limits.Request{Route: []byte("/r/" + strconv.Itoa(i)), IP: []byte("192.0.2.1")}
			if err := a.Limiter().Decide(context.Background(), &req, &d); err != nil || !d.Admitted {
				t.Fatalf("request %d: admitted %v, %v", i, d.Admitted, err)
			}
		}
	}
	flood(0, 5000)
	if n := mem[0].Len(); n > 640 {
		t.Fatalf("%d keys after 5,000 routes with memory_max_keys 640", n)
	}
	write(file(6400))
	res, err := a.Reload("test")
	if err != nil || !slices.Contains(res.Applied, "memory_max_keys") {
		t.Fatalf("reload: %+v, %v; want memory_max_keys applied", res, err)
	}
	flood(5000, 10000)
	if n := mem[0].Len(); n <= 640 || n > 6400 {
		t.Fatalf("%d keys after 5,000 more routes with memory_max_keys 6400, want more than 640 and at most 6400", n)
	}
}

// TestReloadKeepsRulesOnAFileWithoutThem: a file with no rules list (empty,
// comments only, "---", or "rules:" with nothing under it) is what a file
// being truncated and rewritten looks like for a moment. A reload of it
// must keep the running rules, not stop limiting everyone; "rules: []"
// removes them, said in so many words.
func TestReloadKeepsRulesOnAFileWithoutThem(t *testing.T) {
	const rules = `rules:
  - name: per-ip
    key: [ip]
    algorithm: fixed_window
    limit: 2
    period: 1h
`
	a, write := fileApp(t, rules, zerolog.Nop())
	admitted := func() bool {
		var d limits.Decision
		req := limits.Request{Route: []byte("/"), IP: []byte("192.0.2.1")}
		if err := a.Limiter().Decide(context.Background(), &req, &d); err != nil {
			t.Fatal(err)
		}
		return d.Admitted
	}
	for i := range 2 {
		if !admitted() {
			t.Fatalf("request %d of 2 denied", i+1)
		}
	}
	for _, empty := range []string{"", "\n", "# being rewritten\n", "---\n", "rules:\n", "log_level: info\n"} {
		write(empty)
		_, err := a.Reload("test")
		var list config.Errors
		if !errors.As(err, &list) || !strings.Contains(err.Error(), `"rules: []"`) {
			t.Fatalf("reload of %q: %v, want config.Errors saying how to remove every rule", empty, err)
		}
		if admitted() {
			t.Fatalf("after the refused reload of %q, a third request was admitted", empty)
		}
	}
	write("rules: []\n")
	if res, err := a.Reload("test"); err != nil || res.Rules != 0 {
		t.Fatalf(`reload of "rules: []": %+v, %v; want every rule removed`, res, err)
	}
	if !admitted() {
		t.Fatal(`after "rules: []" a request was denied`)
	}
	// With no rules running, a file without them changes nothing to refuse.
	write("")
	if _, err := a.Reload("test"); err != nil {
		t.Fatalf("reload of an empty file with no rules running: %v", err)
	}
}

// TestReloadWarnsOfFreshCounts: a reload that keeps a rule's name but
// changes its algorithm or key starts its counts from zero (a new key); the
// log says so, naming the rule, and a change of numbers alone does not.
func TestReloadWarnsOfFreshCounts(t *testing.T) {
	rule := func(algo, key string, limit int) string {
		return fmt.Sprintf("rules:\n  - name: r\n    key: %s\n    algorithm: %s\n    limit: %d\n    period: 1h\n", key, algo, limit)
	}
	var logs syncBuffer
	a, write := fileApp(t, rule("fixed_window", "[user]", 5), zerolog.New(&logs))
	const msg = "from zero"
	reloadWarns(t, a, write, &logs, msg, []reloadWarning{
		{rule("fixed_window", "[user]", 9), ""},
		{rule("gcra", "[user]", 9), "r (algorithm fixed_window -> gcra)"},
		{rule("gcra", "[user, route]", 9), "r (key [user] -> [user route])"},
		{"identity: {ipv6_prefix: 56}\n" + rule("gcra", "[user, route]", 9), "identity.ipv6_prefix changed"},
		{"identity: {ipv6_prefix: 56, path_parameters: strip}\n" + rule("gcra", "[user, route]", 9), "identity.path_parameters changed"},
	})
}

// reloadWarning is a file to reload and the one warning line (containing
// want) it must log with the message msg, or none (want "").
type reloadWarning struct{ yaml, want string }

// reloadWarns reloads each file in turn and checks the warnings it logs.
func reloadWarns(t *testing.T, a *App, write func(string), logs *syncBuffer, msg string, cases []reloadWarning) {
	t.Helper()
	for _, c := range cases {
		before := logs.lines(msg)
		write(c.yaml)
		if _, err := a.Reload("test"); err != nil {
			t.Fatal(err)
		}
		switch got := logs.lines(msg) - before; {
		case c.want == "" && got != 0:
			t.Fatalf("%q: %d warnings %q, want none", c.yaml, got, msg)
		case c.want != "" && (got != 1 || logs.lines(c.want) == 0):
			t.Fatalf("%q: %d warnings, want one naming %q", c.yaml, got, c.want)
		}
	}
}

// TestReloadWarnsOfDisagreeingNumbers: a reload that changes the numbers
// of a sliding_log rule, or crosses a gcra or token_bucket rule's (a
// faster rate with a smaller burst, or the reverse), warns that instances
// with the old and the new numbers together admit more than either until
// all run the new file (docs/algorithms.md, "While instances disagree");
// the window algorithms and a bucket's other changes, which hold across
// such a fleet, do not warn, nor does a reload that changes no number.
func TestReloadWarnsOfDisagreeingNumbers(t *testing.T) {
	rule := func(algo string, limit, burst int) string {
		y := fmt.Sprintf("rules:\n  - name: r\n    key: [user]\n    algorithm: %s\n    limit: %d\n    period: 1h\n", algo, limit)
		if burst > 0 {
			y += fmt.Sprintf("    burst: %d\n", burst)
		}
		return y
	}
	var logs syncBuffer
	a, write := fileApp(t, rule("fixed_window", 5, 0), zerolog.New(&logs))
	const msg = "can together admit more than either"
	reloadWarns(t, a, write, &logs, msg, []reloadWarning{
		{rule("fixed_window", 9, 0), ""},
		{rule("sliding_window", 9, 0), ""},
		{rule("sliding_window", 4, 0), ""},
		{rule("gcra", 4, 0), ""}, // a new algorithm: fresh counts, warned of apart
		{rule("gcra", 4, 0), ""},
		{rule("gcra", 4, 2), ""},                                              // the burst alone: both sides read the TAT as it stands
		{rule("gcra", 5, 2), ""},                                              // faster, same burst: the loosest is the new rule
		{rule("gcra", 6, 1), "r (gcra 5/1h0m0s burst 2 -> 6/1h0m0s burst 1)"}, // crossed
		{rule("token_bucket", 5, 2), ""},
		{rule("token_bucket", 5, 9), ""},
		{rule("token_bucket", 4, 3), ""}, // slower and smaller
		{rule("token_bucket", 3, 9), "r (token_bucket 4/1h0m0s burst 3 -> 3/1h0m0s burst 9)"}, // crossed
		{rule("sliding_log", 5, 0), ""},
		{rule("sliding_log", 6, 0), "r (sliding_log 5/1h0m0s burst 5 -> 6/1h0m0s burst 6)"},
	})
}

// TestReloadAppliesPathParameters: identity.path_parameters changed by a
// reload applies to /auth and to the admin API's ?route= at once.
func TestReloadAppliesPathParameters(t *testing.T) {
	const rules = "rules:\n  - name: r\n    key: [route]\n    algorithm: fixed_window\n    limit: 5\n    period: 1h\n"
	a, write := fileApp(t, rules, zerolog.Nop())
	auth, adm := a.Handler(), a.AdminHandler()
	ask := func(uri string) int {
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI("/auth")
		ctx.Request.Header.Set("X-Original-URI", uri)
		ctx.Request.Header.Set("X-Real-IP", "192.0.2.1")
		auth(&ctx)
		return ctx.Response.StatusCode()
	}
	remaining := func(route string) string {
		var ctx fasthttp.RequestCtx
		ctx.Request.SetRequestURI("/v1/keys/r?route=" + url.QueryEscape(route))
		ctx.SetRemoteAddr(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
		adm(&ctx)
		var v struct{ Remaining int64 }
		if err := json.Unmarshal(ctx.Response.Body(), &v); err != nil || ctx.Response.StatusCode() != 200 {
			t.Fatalf("GET /v1/keys/r?route=%s: %d %s", route, ctx.Response.StatusCode(), ctx.Response.Body())
		}
		return strconv.FormatInt(v.Remaining, 10)
	}
	if ask("/;x/admin") != 204 || remaining("/admin") != "5" || remaining("/;x/admin") != "4" {
		t.Fatalf("kept: /;x/admin is its own route")
	}
	write("identity: {path_parameters: strip}\n" + rules)
	res, err := a.Reload("test")
	if err != nil || !slices.Contains(res.Applied, "identity.path_parameters") {
		t.Fatalf("reload: %+v, %v", res, err)
	}
	for _, uri := range []string{"/admin", "/;x/admin", "/x/..;/admin;jsessionid=1"} {
		if code := ask(uri); code != 204 {
			t.Fatalf("%s: %d", uri, code)
		}
	}
	if got := remaining("/;y/admin"); got != "2" {
		t.Fatalf("stripped: /admin has %s left, want 2 (three requests)", got)
	}
}
