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
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
	"github.com/rategate/rategate/policy"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

// rategateBin builds the rategate binary once for the whole test run.
func rategateBin(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "rategate-admin-test-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "rategate")
		goBin := filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, err := os.Stat(goBin); err != nil {
			goBin = "go"
		}
		cmd := exec.Command(goBin, "build", "-o", binPath, "github.com/rategate/rategate")
		cmd.Dir = "."
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return binPath
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// proc is one running rategate.
type proc struct {
	t         testing.TB
	name      string
	main      string // host:port of /auth
	admin     string // host:port of the admin API
	token     string
	args      []string
	logPath   string
	cmd       *exec.Cmd
	done      chan struct{}
	mu        sync.Mutex
	exitedErr error
}

// startRategate starts rategate with -config cfg and args, on fresh ports,
// and waits until both listeners answer.
func startRategate(t testing.TB, name, cfg, token string, args ...string) *proc {
	t.Helper()
	p := &proc{t: t, name: name, token: token, args: args,
		logPath: filepath.Join(t.TempDir(), name+".log")}
	p.main = "127.0.0.1:" + strconv.Itoa(testredis.FreePort(t))
	p.admin = "127.0.0.1:" + strconv.Itoa(testredis.FreePort(t))
	all := append([]string{"-config", cfg}, args...)
	p.args = all
	p.start()
	t.Cleanup(p.kill)
	return p
}

func (p *proc) start() {
	p.t.Helper()
	f, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	args := append([]string{"-listen", p.main, "-admin-listen", p.admin, "-log-level", "debug"}, p.args...)
	p.cmd = exec.Command(rategateBin(p.t), args...)
	p.cmd.Stdout, p.cmd.Stderr = f, f
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		f.Close()
		p.t.Fatalf("%s: start: %v", p.name, err)
	}
	p.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) {
		err := cmd.Wait()
		f.Close()
		p.mu.Lock()
		p.exitedErr = err
		p.mu.Unlock()
		close(done)
	}(p.cmd, p.done)
	deadline := time.Now().Add(10 * time.Second)
	for {
		code1, _ := p.get("http://"+p.main+"/healthz", "")
		code2, _ := p.get("http://"+p.admin+"/v1/rules", p.token)
		if code1 == 200 && code2 == 200 {
			return
		}
		select {
		case <-p.done:
			p.t.Fatalf("%s exited at start:\n%s", p.name, p.logTail())
		default:
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("%s not ready after 10s (healthz %d, admin %d):\n%s", p.name, code1, code2, p.logTail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop() {
	p.t.Helper()
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.t.Fatalf("%s did not stop on SIGTERM:\n%s", p.name, p.logTail())
	}
	p.mu.Lock()
	err := p.exitedErr
	p.mu.Unlock()
	if err != nil {
		p.t.Fatalf("%s exited with %v:\n%s", p.name, err, p.logTail())
	}
}

func (p *proc) restart() {
	p.t.Helper()
	p.stop()
	p.start()
}

func (p *proc) kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
	}
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("%s: signal %v: %v", p.name, sig, err)
	}
}

func (p *proc) logTail() string {
	b, _ := os.ReadFile(p.logPath)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > 40 {
		lines = lines[len(lines)-40:]
	}
	return strings.Join(lines, "\n")
}

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
