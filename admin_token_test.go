package main

import (
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/procs"
)

// TestReloadKeepsTheTokenOfAnOpenAdminListener: rategate refuses to start
// with its admin listener off loopback and no token; a reload must not
// reach that state either. A file whose admin.token went (an edit, a
// templating mistake, a file being rewritten under -watch) or became short
// is refused on a listener bound to every interface, and the running token
// stays; before, the reload applied "admin.token" = "" and every admin
// path answered anyone who could reach the port.
func TestReloadKeepsTheTokenOfAnOpenAdminListener(t *testing.T) {
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

	// The same file without admin.token, then with a short one, reloaded.
	for _, head := range []string{"", "admin:\n  token: short\n"} {
		writeFile(t, cfg, head+rules)
		code, out := p.do("POST", "http://"+p.admin+"/v1/reload", p.token, nil)
		if code != 400 || !strings.Contains(out, "admin.token: the admin API on") || !strings.Contains(out, "at least 16 bytes") {
			t.Errorf("reload of %q: %d %s, want 400 naming admin.token", head, code, out)
		}
	}

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

// TestShortAdminTokenRefusedOffLoopback: on an admin listener reachable
// from other hosts the token is the only guard of overrides, key resets,
// identity blocks and reloads, and every wrong guess is a cheap 401: a
// token of one character was found in at most 94 requests. rategate
// refuses to start with a token under 16 bytes there, as with none, and
// says why; on loopback any token will do.
func TestShortAdminTokenRefusedOffLoopback(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rategate.yaml")
	writeFile(t, cfg, "rules:\n  - name: r\n    key: [ip]\n    algorithm: gcra\n    limit: 5\n    period: 1m\n")
	port, err := procs.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	const token = "k"
	rg, err := procs.StartRategate(procs.Options{
		Name: "short-token", Bin: rategateBin(t), Dir: t.TempDir(),
		Admin: "0.0.0.0:" + strconv.Itoa(port), Token: token, Ready: "none",
		Args: []string{"-config", cfg},
		Env:  []string{"RATEGATE_ADMIN_TOKEN=" + token},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(rg.Kill)
	select {
	case <-rg.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("rategate runs with a %d-byte admin token on 0.0.0.0:%d; want a refusal at start", len(token), port)
	}
	if log := rg.LogTail(20); !strings.Contains(log, "with a token of 1 bytes (at least 16") {
		t.Errorf("the refusal does not say why:\n%s", log)
	}
	// On loopback a short token is the operator's business.
	p := startRategate(t, "short-token-loopback", cfg, token)
	if code, _ := p.get("http://"+p.admin+"/v1/rules", token); code != 200 {
		t.Errorf("a short token on a loopback admin listener: %d, want 200", code)
	}
}
