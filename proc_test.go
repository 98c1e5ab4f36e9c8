package main

// Helpers of the multi-process tests: the rategate binary is built once per
// test run, and each test starts real processes on loopback ports against a
// real redis-server.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/procs"
	"github.com/rategate/rategate/policy"
)

// rategateBin is the rategate binary, built once for the whole test run.
func rategateBin(t testing.TB) string { return procs.TestBinary(t) }

func TestMain(m *testing.M) {
	code := m.Run()
	procs.RemoveTestBinary()
	os.Exit(code)
}

// proc is one running rategate, with the HTTP helpers the tests use.
type proc struct {
	t     testing.TB
	name  string
	main  string // host:port of /auth
	admin string // host:port of the admin API
	token string
	rg    *procs.Rategate
}

// startRategate starts rategate with -config cfg and args, on fresh ports,
// and waits until both listeners answer.
func startRategate(t testing.TB, name, cfg, token string, args ...string) *proc {
	t.Helper()
	rg, err := procs.StartRategate(procs.Options{
		Name: name, Bin: rategateBin(t), Dir: t.TempDir(), Token: token,
		Args: append([]string{"-log-level", "debug", "-config", cfg}, args...),
	})
	if err != nil {
		t.Fatal(err)
	}
	p := &proc{t: t, name: name, main: rg.Main, admin: rg.Admin, token: token, rg: rg}
	t.Cleanup(p.kill)
	return p
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop() {
	p.t.Helper()
	if err := p.rg.Stop(10 * time.Second); err != nil {
		p.t.Fatalf("%s: %v:\n%s", p.name, err, p.logTail())
	}
}

func (p *proc) restart() {
	p.t.Helper()
	p.stop()
	if err := p.rg.Restart(); err != nil {
		p.t.Fatal(err)
	}
}

func (p *proc) kill() { p.rg.Kill() }

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.rg.Signal(sig); err != nil {
		p.t.Fatalf("%s: signal %v: %v", p.name, sig, err)
	}
}

func (p *proc) logTail() string { return p.rg.LogTail(40) }

var httpClient = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// get returns status and body; status 0 when the request failed.
func (p *proc) get(url, token string) (int, string) {
	return p.do("GET", url, token, nil)
}

func (p *proc) do(method, url, token string, body []byte) (int, string) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, rd)
	if err != nil {
		return 0, err.Error()
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// api calls the admin API with the process's token and fails the test
// unless the status is want.
func (p *proc) api(method, path string, body string, want int) string {
	p.t.Helper()
	var b []byte
	if body != "" {
		b = []byte(body)
	}
	code, out := p.do(method, "http://"+p.admin+path, p.token, b)
	if code != want {
		p.t.Fatalf("%s: %s %s: status %d, want %d: %s\nlog:\n%s", p.name, method, path, code, want, out, p.logTail())
	}
	return out
}

// auth asks /auth with the given headers (name, value pairs) and returns the status.
func (p *proc) auth(kv ...string) int {
	req, _ := http.NewRequest("GET", "http://"+p.main+"/auth", nil)
	for i := 0; i+1 < len(kv); i += 2 {
		req.Header.Set(kv[i], kv[i+1])
	}
	resp, err := httpClient.Do(req)
	if err != nil {
		return 0
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// rules returns GET /v1/rules.
func (p *proc) rules() policy.RulesView {
	p.t.Helper()
	var v policy.RulesView
	if err := json.Unmarshal([]byte(p.api("GET", "/v1/rules", "", 200)), &v); err != nil {
		p.t.Fatal(err)
	}
	return v
}

func effectiveLimit(v policy.RulesView, rule string) int64 {
	for _, r := range v.Rules {
		if r.Name == rule {
			return r.Effective.Limit
		}
	}
	return -1
}

// writeFile replaces path the way editors do: write a temporary file next
// to it and rename it over the old one, so a reader never sees half a file.
func writeFile(t testing.TB, path, content string) {
	t.Helper()
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// within polls cond every 10ms for at most d; it returns the time it took,
// or fails with the last error.
func within(t testing.TB, d time.Duration, what string, cond func() error) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := start.Add(d)
	for {
		err := cond()
		if err == nil {
			return time.Since(start)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// uniquePrefix returns a Redis key prefix of its own for a test.
func uniquePrefix(t testing.TB) string {
	return fmt.Sprintf("t%d", time.Now().UnixNano()%1_000_000_000)
}

// adminCLI returns a runner of `rategate admin -addr addr ARGS...` with the
// admin token in the environment: it fails the test unless the exit code
// is wantCode, and returns what the command printed.
func adminCLI(t *testing.T, addr, token string) func(wantCode int, args ...string) string {
	return func(wantCode int, args ...string) string {
		t.Helper()
		cmd := exec.Command(rategateBin(t), append([]string{"admin", "-addr", addr}, args...)...)
		cmd.Env = append(os.Environ(), "RATEGATE_ADMIN_TOKEN="+token)
		var out strings.Builder
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		if code != wantCode {
			t.Fatalf("rategate admin %s: exit %d, want %d:\n%s", strings.Join(args, " "), code, wantCode, out.String())
		}
		return out.String()
	}
}

// mustContain fails the test unless out contains every one of wants.
func mustContain(t *testing.T, out string, wants ...string) {
	t.Helper()
	for _, w := range wants {
		if !strings.Contains(out, w) {
			t.Fatalf("output lacks %q:\n%s", w, out)
		}
	}
}
