package admincli

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/admin"
	"github.com/rategate/rategate/config"
	"github.com/rategate/rategate/limits"
	"github.com/rategate/rategate/limits/memstore"
	"github.com/rategate/rategate/policy"
)

// TestRulesShowsAdaptive: `rategate admin rules` against a real admin API
// adds an ADAPTIVE column with the factor, the signal and who set it, and
// says when a manual override wins.
func TestRulesShowsAdaptive(t *testing.T) {
	sig := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "30") }))
	defer sig.Close()
	cfg, err := config.Parse("test.yaml", []byte(fmt.Sprintf(`rules:
  - name: api
    algorithm: fixed_window
    limit: 10
    period: 1h
    adaptive:
      http: {url: "%s"}
      steps: [{below: 50, factor: 2}, {factor: 0.5}]
      interval: 1s
  - name: plain
    algorithm: fixed_window
    limit: 5
    period: 1m
`, sig.URL)))
	if err != nil {
		t.Fatal(err)
	}
	mem := memstore.New()
	defer mem.Close()
	lim := limits.New(limits.Options{Store: mem, Prefix: "rg", Rules: cfg.Rules})
	mgr := policy.NewManager(policy.ManagerOptions{Config: cfg, Limiter: lim, Log: zerolog.Nop(),
		Adaptive: policy.AdaptiveOptions{Instance: "cli-test"}})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go mgr.RunAdaptive(ctx)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &fasthttp.Server{Handler: admin.NewServer(admin.ServerOptions{Rules: mgr, Limiter: lim, Log: zerolog.Nop()}).Serve}
	go srv.Serve(ln)
	defer srv.Shutdown()
	run := func(args ...string) string {
		var out, errOut strings.Builder
		if code := Run(append([]string{"-addr", ln.Addr().String()}, args...), func(string) string { return "" }, &out, &errOut); code != 0 {
			t.Fatalf("rategate admin %v: exit %d: %s", args, code, errOut.String())
		}
		return out.String()
	}
	deadline := time.Now().Add(5 * time.Second)
	for lim.Rule("api").Limit != 20 {
		if time.Now().After(deadline) {
			t.Fatal("the adaptive factor was not applied")
		}
		time.Sleep(10 * time.Millisecond)
	}
	out := run("rules")
	for _, want := range []string{"ADAPTIVE", "x2 signal=30 by cli-test (this instance)", "20/1h"} {
		if !strings.Contains(out, want) {
			t.Errorf("rules output lacks %q:\n%s", want, out)
		}
	}
	if line := lineWith(out, "plain"); !strings.HasSuffix(strings.TrimSpace(line), "-") {
		t.Errorf("a rule without adaptive block: %q, want - in the ADAPTIVE column", line)
	}
	run("override", "api", "limit=3")
	out = run("rules")
	if line := lineWith(out, "api"); !strings.Contains(line, "[not applied: a manual override is in force: it wins while it lasts]") || !strings.Contains(line, "3/1h") {
		t.Errorf("with a manual override: %q", line)
	}
}

func lineWith(out, prefix string) string {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, prefix+" ") {
			return l
		}
	}
	return ""
}
