package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"

	"github.com/rategate/rategate/top"
)

// overrideConfig: one exact rule (sliding_log has no window boundary, so
// counts never reset during a test) keyed on the user.
const overrideConfig = `
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
`

// TestOverrideAcrossProcesses: two rategate processes share Redis; an
// override set on one is enforced by the other within 1 s, deleting it
// restores the file's limit, and an override survives a restart of both.
func TestOverrideAcrossProcesses(t *testing.T) {
	t.Parallel()
	rs := testredis.Start(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rategate.yaml")
	prefix := uniquePrefix(t)
	writeFile(t, cfg, fmt.Sprintf(overrideConfig, rs.Addr, prefix, "tok"))
	a := startRategate(t, "a", cfg, "tok")
	b := startRategate(t, "b", cfg, "tok")

	ask := func(p *proc, u string) int {
		return p.auth("X-Original-URI", "/x", "X-Real-IP", "192.0.2.1", "X-User-Id", u)
	}
	// The file's limit, shared: 3 for u1 across both processes.
	for i, p := range []*proc{a, b, a} {
		if got := ask(p, "u1"); got != 204 {
			t.Fatalf("request %d: %d, want 204", i+1, got)
		}
	}
	if got := ask(b, "u1"); got != 429 {
		t.Fatalf("4th request: %d, want 429", got)
	}
	if got := ask(a, "u1"); got != 429 {
		t.Fatalf("5th request: %d, want 429", got)
	}
	// top merges both processes' denials through Redis (each publishes
	// every 2 s): one denial on each.
	within(t, 5*time.Second, "top merged across instances", func() error {
		var v top.TopView
		if err := json.Unmarshal([]byte(a.api("GET", "/v1/top?rule=per-user", "", 200)), &v); err != nil {
			return err
		}
		if v.Scope != "fleet" || v.Instances != 2 || len(v.Rules) != 1 || len(v.Rules[0].Top) != 1 ||
			v.Rules[0].Top[0].Identity != "u1" || v.Rules[0].Top[0].Denied != 2 {
			return fmt.Errorf("top %+v", v)
		}
		return nil
	})

	// Override on a, enforced by b within 1 s.
	a.api("PUT", "/v1/rules/per-user/override", `{"limit":10,"reason":"sale"}`, 200)
	took := within(t, time.Second, "override reaches b", func() error {
		if got := ask(b, "u1"); got != 204 {
			return fmt.Errorf("b answers %d", got)
		}
		return nil
	})
	t.Logf("override enforced by the other process after %v", took)
	if got := effectiveLimit(b.rules(), "per-user"); got != 10 {
		t.Fatalf("b's effective limit %d, want 10", got)
	}

	// Delete on b: a enforces the file's 3 again (u1 has used 4).
	b.api("DELETE", "/v1/rules/per-user/override", "", 200)
	within(t, time.Second, "delete reaches a", func() error {
		if got := ask(a, "u1"); got != 429 {
			return fmt.Errorf("a answers %d", got)
		}
		return nil
	})
	if got := effectiveLimit(a.rules(), "per-user"); got != 3 {
		t.Fatalf("a's effective limit %d, want 3", got)
	}

	// An override survives a restart of both processes.
	a.api("PUT", "/v1/rules/per-user/override", `{"factor":2}`, 200)
	a.restart()
	b.restart()
	for _, p := range []*proc{a, b} {
		v := p.rules()
		if got := effectiveLimit(v, "per-user"); got != 6 {
			t.Fatalf("%s after restart: effective limit %d, want 6 (factor 2 of 3)", p.name, got)
		}
		if v.Rules[0].Override == nil || v.Rules[0].Override.Factor != 2 {
			t.Fatalf("%s after restart: override %+v", p.name, v.Rules[0].Override)
		}
	}
	allowed := 0
	for i := 0; i < 8; i++ {
		if ask([]*proc{a, b}[i%2], "u2") == 204 {
			allowed++
		}
	}
	if allowed != 6 {
		t.Fatalf("after restart: %d of 8 allowed, want exactly 6", allowed)
	}

	// The periodic re-read is a safety net of its own: an override written
	// to Redis without an announcement still applies within 1 s.
	c := rs.Client(t)
	if err := c.HSet(testredis.Ctx(t), prefix+":overrides", "per-user", `{"limit":4,"set_at":"2026-01-01T00:00:00Z"}`).Err(); err != nil {
		t.Fatal(err)
	}
	within(t, time.Second, "silent change re-read", func() error {
		for _, p := range []*proc{a, b} {
			if got := effectiveLimit(p.rules(), "per-user"); got != 4 {
				return fmt.Errorf("%s: limit %d", p.name, got)
			}
		}
		return nil
	})
}

// reloadConfig has one rule whose limit the test changes (per-ip, on /x)
// and a pair of rules on /swap whose names say which file they came from.
// reloadConfig tests rule swaps, not latency: a 2 s store budget keeps a
// loaded CI machine from turning a slow Redis answer into an undecided 204
// that would look like a request that saw no rules.
const reloadConfig = `
redis:
  url: redis://%s/0
  key_prefix: %s
  timeout: 2s
rules:
  - name: per-ip
    match: {path: /x}
    key: [ip]
    algorithm: sliding_log
    limit: %d
    period: 1h
  - name: %s-1
    match: {path: /swap}
    key: [ip]
    algorithm: fixed_window
    limit: 1000000000
    period: 1s
  - name: %s-2
    match: {path: /swap}
    key: []
    algorithm: gcra
    limit: 1000000000
    period: 1s
`

// TestReloadUnderLoad: valid changes (SIGHUP and POST /v1/reload) apply,
// invalid ones are rejected with every error and the old rules stay in force
// exactly, and concurrent /auth traffic never sees a failed request nor a
// mix of two files' rules.
func TestReloadUnderLoad(t *testing.T) {
	t.Parallel()
	rs := testredis.Start(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rategate.yaml")
	prefix := uniquePrefix(t)
	set := "old"
	conf := func(limit int) string { return fmt.Sprintf(reloadConfig, rs.Addr, prefix, limit, set, set) }
	writeFile(t, cfg, conf(3))
	p := startRategate(t, "reload", cfg, "")

	// Load: 4 workers asking about /swap from 50 IPs until stopped. Every
	// answer must be 204 and list both rules of one file: "old-1, old-2"
	// or "new-1, new-2", never one of each.
	var stop atomic.Bool
	var total, failed atomic.Int64
	var firstFail atomic.Value
	var wg sync.WaitGroup
	loadStart := time.Now()
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 200_000 && !stop.Load(); i++ {
				req, _ := http.NewRequest("GET", "http://"+p.main+"/auth", nil)
				req.Header.Set("X-Original-URI", "/swap")
				req.Header.Set("X-Real-IP", fmt.Sprintf("198.51.100.%d", (w*7+i)%50))
				problem := ""
				resp, err := httpClient.Do(req)
				if err != nil {
					problem = err.Error()
				} else {
					io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					pol := resp.Header.Get("RateLimit-Policy")
					ok := strings.HasPrefix(pol, `"old-1";`) && strings.Contains(pol, `, "old-2";`) ||
						strings.HasPrefix(pol, `"new-1";`) && strings.Contains(pol, `, "new-2";`)
					if resp.StatusCode != 204 || !ok {
						problem = fmt.Sprintf("status %d, RateLimit-Policy %q, X-RateLimit-Status %q",
							resp.StatusCode, pol, resp.Header.Get("X-RateLimit-Status"))
					}
				}
				total.Add(1)
				if problem != "" {
					failed.Add(1)
					firstFail.CompareAndSwap(nil, problem)
				}
			}
		}(w)
	}
	defer func() { stop.Store(true); wg.Wait() }()

	// Flip between two files' rule sets while the load runs.
	for i := 0; i < 40; i++ {
		set = []string{"new", "old"}[i%2]
		writeFile(t, cfg, conf(3))
		p.api("POST", "/v1/reload", "", 200)
		time.Sleep(5 * time.Millisecond)
	}

	// exactly checks that a fresh IP gets exactly n allowed.
	fresh := 0
	exactly := func(n int) {
		t.Helper()
		fresh++
		ip := fmt.Sprintf("203.0.113.%d", fresh)
		for i := 1; i <= n+1; i++ {
			want := 204
			if i > n {
				want = 429
			}
			if got := p.auth("X-Original-URI", "/x", "X-Real-IP", ip); got != want {
				t.Fatalf("limit %d, request %d from a fresh IP: %d, want %d", n, i, got, want)
			}
		}
	}
	exactly(3)

	// Valid change by SIGHUP.
	writeFile(t, cfg, conf(5))
	p.signal(syscall.SIGHUP)
	within(t, 5*time.Second, "SIGHUP reload", func() error {
		if got := effectiveLimit(p.rules(), "per-ip"); got != 5 {
			return fmt.Errorf("limit %d", got)
		}
		return nil
	})
	exactly(5)

	// Valid change by POST /v1/reload.
	writeFile(t, cfg, conf(4))
	out := p.api("POST", "/v1/reload", "", 200)
	if !strings.Contains(out, `"changed": [`) || !strings.Contains(out, "per-ip") {
		t.Fatalf("reload answer does not list the changed rule: %s", out)
	}
	exactly(4)

	// Invalid change: 400 with every error; the old rules stay exactly.
	writeFile(t, cfg, strings.Replace(conf(0), "period: 1h", "period: 1h\n    burts: 3", 1))
	out = p.api("POST", "/v1/reload", "", 400)
	for _, want := range []string{"running rules were kept", "limit must be >= 1, got 0", `unknown key \"burts\"`} {
		if !strings.Contains(out, want) {
			t.Fatalf("reload error answer lacks %q: %s", want, out)
		}
	}
	exactly(4)
	p.signal(syscall.SIGHUP) // the same invalid file by signal: counted, rules kept
	within(t, 5*time.Second, "SIGHUP error counted", func() error {
		m := p.scrape()
		if got := value(m, "rategate_config_reloads_total", "result", "error"); got != 2 {
			return fmt.Errorf("errors counted: %v", got)
		}
		return nil
	})
	exactly(4)

	m := p.scrape()
	if got := value(m, "rategate_config_reloads_total", "result", "success"); got != 42 {
		t.Fatalf("successful reloads %v, want 42", got)
	}
	if got := value(m, "rategate_config_last_reload_successful"); got != 0 {
		t.Fatalf("last reload successful %v, want 0", got)
	}
	if !strings.Contains(p.logTail(), "limit must be >= 1, got 0") {
		t.Fatalf("the log does not name the error:\n%s", p.logTail())
	}

	stop.Store(true)
	wg.Wait()
	if failed.Load() != 0 {
		t.Fatalf("%d of %d requests under load failed (first: %v)", failed.Load(), total.Load(), firstFail.Load())
	}
	if total.Load() < 100 {
		t.Fatalf("only %d requests ran under load", total.Load())
	}
	t.Logf("%d requests in %v under load during 44 reloads, none failed", total.Load(), time.Since(loadStart).Round(time.Millisecond))
}

// TestWatchReloads: with -watch, a rename-and-replace of the file and a
// Kubernetes-style ConfigMap symlink swap both reload the rules.
func TestWatchReloads(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	conf := func(limit int) string {
		return fmt.Sprintf("rules:\n  - name: per-ip\n    key: [ip]\n    algorithm: fixed_window\n    limit: %d\n    period: 1h\n", limit)
	}
	// ConfigMap layout: rategate.yaml -> ..data/rategate.yaml, ..data -> ..v1
	mustOK := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	mustOK(os.Mkdir(filepath.Join(dir, "..v1"), 0o755))
	mustOK(os.WriteFile(filepath.Join(dir, "..v1", "rategate.yaml"), []byte(conf(3)), 0o644))
	mustOK(os.Symlink("..v1", filepath.Join(dir, "..data")))
	mustOK(os.Symlink(filepath.Join("..data", "rategate.yaml"), filepath.Join(dir, "rategate.yaml")))
	cm := startRategate(t, "configmap", filepath.Join(dir, "rategate.yaml"), "", "-watch")

	plainDir := t.TempDir()
	plain := filepath.Join(plainDir, "rategate.yaml")
	writeFile(t, plain, conf(3))
	ed := startRategate(t, "editor", plain, "", "-watch")

	// The ConfigMap update: a new directory, then an atomic ..data swap.
	mustOK(os.Mkdir(filepath.Join(dir, "..v2"), 0o755))
	mustOK(os.WriteFile(filepath.Join(dir, "..v2", "rategate.yaml"), []byte(conf(7)), 0o644))
	mustOK(os.Symlink("..v2", filepath.Join(dir, "..data_tmp")))
	mustOK(os.Rename(filepath.Join(dir, "..data_tmp"), filepath.Join(dir, "..data")))
	mustOK(os.RemoveAll(filepath.Join(dir, "..v1")))
	within(t, 3*time.Second, "ConfigMap swap reloads", func() error {
		if got := effectiveLimit(cm.rules(), "per-ip"); got != 7 {
			return fmt.Errorf("limit %d", got)
		}
		return nil
	})

	// An editor's rename-and-replace.
	writeFile(t, plain, conf(9))
	within(t, 3*time.Second, "rename-and-replace reloads", func() error {
		if got := effectiveLimit(ed.rules(), "per-ip"); got != 9 {
			return fmt.Errorf("limit %d", got)
		}
		return nil
	})
	// A write in place, then an invalid file: counted as an error, rules kept.
	mustOK(os.WriteFile(plain, []byte(conf(11)), 0o644))
	within(t, 3*time.Second, "write in place reloads", func() error {
		if got := effectiveLimit(ed.rules(), "per-ip"); got != 11 {
			return fmt.Errorf("limit %d", got)
		}
		return nil
	})
	writeFile(t, plain, conf(0))
	within(t, 3*time.Second, "invalid file counted", func() error {
		if got := value(ed.scrape(), "rategate_config_reloads_total", "result", "error"); got != 1 {
			return fmt.Errorf("errors %v", got)
		}
		return nil
	})
	if got := effectiveLimit(ed.rules(), "per-ip"); got != 11 {
		t.Fatalf("after an invalid file: limit %d, want the running 11", got)
	}
}

// TestAdminToken: without the token or with a wrong one every admin path
// answers 401; the admin API is not served on the main listener.
func TestAdminToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rategate.yaml")
	writeFile(t, cfg, "admin:\n  token: s3cr3t\nrules:\n  - name: r\n    key: [ip]\n    algorithm: gcra\n    limit: 5\n    period: 1m\n")
	p := startRategate(t, "token", cfg, "s3cr3t")
	paths := []struct{ method, path, body string }{
		{"GET", "/metrics", ""},
		{"GET", "/v1/rules", ""},
		{"PUT", "/v1/rules/r/override", `{"limit":1}`},
		{"DELETE", "/v1/rules/r/override", ""},
		{"GET", "/v1/keys/r?ip=192.0.2.1", ""},
		{"DELETE", "/v1/keys/r?ip=192.0.2.1", ""},
		{"GET", "/v1/top", ""},
		{"POST", "/v1/reload", ""},
		{"GET", "/", ""},
		{"GET", "/nope", ""},
	}
	for _, c := range paths {
		for _, tok := range []string{"", "wrong", "s3cr3t2", "S3CR3T"} {
			var body []byte
			if c.body != "" {
				body = []byte(c.body)
			}
			if code, out := p.do(c.method, "http://"+p.admin+c.path, tok, body); code != 401 {
				t.Errorf("%s %s with token %q: %d, want 401: %s", c.method, c.path, tok, code, out)
			}
		}
		// Not on the main listener, token or not.
		if code, _ := p.do(c.method, "http://"+p.main+c.path, "s3cr3t", nil); code != 404 {
			t.Errorf("%s %s on the main listener: %d, want 404", c.method, c.path, code)
		}
	}
	// A Basic header or the bare token is not the bearer token either.
	for _, h := range []string{"s3cr3t", "Basic s3cr3t", "Bearer", "Bearer s3cr3", "Bearers3cr3t", "Bearer s3cr3t x"} {
		req := "GET /v1/rules HTTP/1.1\r\nHost: x\r\nAuthorization: " + h + "\r\nConnection: close\r\n\r\n"
		if code := rawStatus(t, p.admin, req); code != 401 {
			t.Errorf("Authorization %q: %d, want 401", h, code)
		}
	}
	// The scheme is case-insensitive (RFC 9110 section 11.1), and spaces
	// around the token are not part of it.
	for _, h := range []string{"bearer s3cr3t", "BEARER s3cr3t", "Bearer  s3cr3t", "Bearer s3cr3t "} {
		req := "GET /v1/rules HTTP/1.1\r\nHost: x\r\nAuthorization: " + h + "\r\nConnection: close\r\n\r\n"
		if code := rawStatus(t, p.admin, req); code != 200 {
			t.Errorf("Authorization %q: %d, want 200", h, code)
		}
	}
	// With the token, everything answers.
	p.api("GET", "/metrics", "", 200)
	p.api("GET", "/v1/top", "", 200)
	p.api("PUT", "/v1/rules/r/override", `{"limit":1}`, 200)
	p.api("DELETE", "/v1/keys/r?ip=192.0.2.1", "", 200)
	p.api("GET", "/nope", "", 404)
}

// TestCLI drives `rategate admin` against a running process: tables on
// success, the server's message and a non-zero exit on error.
func TestCLI(t *testing.T) {
	t.Parallel()
	rs := testredis.Start(t)
	dir := t.TempDir()
	cfg := filepath.Join(dir, "rategate.yaml")
	writeFile(t, cfg, fmt.Sprintf(overrideConfig, rs.Addr, uniquePrefix(t), "clitok"))
	p := startRategate(t, "cli", cfg, "clitok")
	for i := 0; i < 5; i++ {
		p.auth("X-Original-URI", "/x", "X-Real-IP", "192.0.2.1", "X-User-Id", "mallory")
	}
	run := adminCLI(t, p.admin, "clitok")
	mustContain(t, run(0, "rules"), "RULE", "per-user", "sliding_log", "3/1h")
	mustContain(t, run(0, "override", "per-user", "limit=20", "reason=incident 42"), "20/1h", "incident 42")
	mustContain(t, run(0, "rules"), "limit=20")
	mustContain(t, run(1, "override", "per-user", "limit=0", "factor=lots"), "limit: must be >= 1, got 0", `factor: must be a number such as 1.5, got "lots"`, "400")
	mustContain(t, run(1, "override", "per-user", "burst=2"), "burst: is only for gcra and token_bucket, not sliding_log", "400")
	mustContain(t, run(1, "override", "nosuch", "limit=2"), "no such rule", "404")
	mustContain(t, run(0, "override", "per-user", "clear"), "3/1h")
	mustContain(t, run(0, "key", "per-user", "user=mallory"), "remaining", "0", "zset of 3")
	mustContain(t, run(0, "top"), "mallory", "2")
	mustContain(t, run(0, "reset", "per-user", "user=mallory"), "reset", "remaining", "3")
	mustContain(t, run(1, "key", "per-user"), "user", "give ?user=")
	mustContain(t, run(0, "reload"), "reloaded", "1 rules")
	mustContain(t, run(2, "frobnicate"), "unknown command")
	writeFile(t, cfg, "rules: [{name: x}]\n")
	mustContain(t, run(1, "reload"), "running rules were kept", "algorithm is required")

	// Wrong token: the server's 401 message, exit 1.
	cmd := exec.Command(rategateBin(t), "admin", "-addr", p.admin, "-token", "nope", "rules")
	out, err := cmd.CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "401") {
		t.Fatalf("wrong token: %v\n%s", err, out)
	}
}
