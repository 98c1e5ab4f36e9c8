package main

import (
	"path/filepath"
	"strconv"
	"testing"

	"github.com/rategate/rategate/internal/procs"
)

// TestReloadKeepsTheTokenOfANonLoopbackAdminListener: rategate refuses to
// start with its admin listener off loopback and no token
// (docs/operations.md: "rategate refuses to start when the admin listener
// is reachable from other hosts without a token"). A reload must not reach
// the same state: a config file whose admin.token is removed (an edit, a
// ConfigMap or templating mistake, a file being rewritten by -watch) must
// be refused on a listener bound to 0.0.0.0, or keep the running token.
// Instead the reload applies "admin.token" = "" and every admin path
// (overrides, key resets, reload, identity blocks) answers anyone who can
// reach the port, without a token.
func TestReloadKeepsTheTokenOfANonLoopbackAdminListener(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rategate.yaml")
	const rules = "rules:\n  - name: r\n    key: [ip]\n    algorithm: gcra\n    limit: 5\n    period: 1m\n"
	writeFile(t, cfg, "admin:\n  token: s3cr3t-0123456789abcdef\n"+rules)

	port, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	// The admin listener on every interface, as the shipped Deployment and
	// compose file run it; the token comes from the config file here.
	rg, err := procs.StartRategate(procs.Options{
		Name: "reload-token", Bin: rategateBin(t), Dir: t.TempDir(),
		Admin: "0.0.0.0:" + strconv.Itoa(port), Token: "s3cr3t-0123456789abcdef",
		Args: []string{"-config", cfg},
	})
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: "reload-token", main: rg.Main, admin: rg.Admin, token: "s3cr3t-0123456789abcdef", rg: rg}
	t.Cleanup(p.kill)

	if code, _ := p.get("http://"+p.admin+"/v1/rules", ""); code != 401 {
		t.Fatalf("before the reload, no token: %d, want 401", code)
	}

	// The same file without admin.token, reloaded.
	writeFile(t, cfg, rules)
	code, out := p.do("POST", "http://"+p.admin+"/v1/reload", p.token, nil)
	t.Logf("reload: %d %s", code, out)

	// Whatever the reload answered, the admin API on 0.0.0.0 must still
	// require a token.
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/rules", ""},
		{"PUT", "/v1/rules/r/override", `{"limit":1000000}`},
		{"DELETE", "/v1/keys/r?ip=192.0.2.1", ""},
	} {
		var body []byte
		if c.body != "" {
			body = []byte(c.body)
		}
		if code, out := p.do(c.method, "http://"+p.admin+c.path, "", body); code != 401 {
			t.Errorf("after the reload, %s %s without a token on %s: %d, want 401: %.200s", c.method, c.path, p.admin, code, out)
		}
	}
}
