package faults

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/rategate/rategate/internal/procs"
	"github.com/rategate/rategate/limits/storetest"
)

// This file runs rategate processes and reads their vital signs.

// budget is redis.timeout in every config of the suite: the longest a
// decision may wait for Redis.
const budget = 50 * time.Millisecond

// Rules of every config. /load is what the load generator asks: a limit
// never reached, so a normal answer is 204 without X-RateLimit-Status.
// /gcra and /window check exact limiting: 10 per hour per IP.
const rulesYAML = `rules:
  - name: load
    match: {path: /load}
    key: [ip]
    algorithm: fixed_window
    limit: 1000000000
    period: 1h
  - name: exact-gcra
    match: {path: /gcra}
    key: [ip]
    algorithm: gcra
    limit: 10
    period: 1h
  - name: exact-window
    match: {path: /window}
    key: [ip]
    algorithm: fixed_window
    limit: 10
    period: 1h
`

// steadyRules is rulesYAML with its hour-long periods a little longer
// (storetest.SteadyDuration): a window that turned over in a test's
// middle would give /window its limit whole again.
var steadyRules = strings.ReplaceAll(rulesYAML, "period: 1h\n", "period: "+storetest.SteadyDuration().String()+"\n")

// exactLimit is the limit of the /gcra and /window rules.
const exactLimit = 10

// gate is one running rategate process.
type gate struct {
	name    string
	addr    string // main listener
	admin   string // admin listener
	logPath string
	rg      *procs.Rategate
	client  *fasthttp.HostClient
}

// startGate writes a config for redisAddr and failure mode, starts rategate
// with it and waits until /healthz answers. The process is stopped with
// SIGTERM when the test ends, and must exit 0.
func startGate(t *testing.T, name, redisAddr, mode string, share int) *gate {
	t.Helper()
	return startGateTimeout(t, name, redisAddr, mode, share, budget)
}

// startGateTimeout is startGate with another redis.timeout.
func startGateTimeout(t *testing.T, name, redisAddr, mode string, share int, timeout time.Duration) *gate {
	t.Helper()
	dir := t.TempDir()
	cfg := fmt.Sprintf("redis:\n  url: redis://%s/0\n  timeout: %s\n  functions: %v\nfailure_mode: %s\nlocal_share: %d\n%s",
		redisAddr, timeout, *functions, mode, share, steadyRules)
	cfgPath := filepath.Join(dir, "rategate.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	g := &gate{name: name, logPath: filepath.Join(dir, name+".log")}
	rg, err := procs.StartRategate(procs.Options{Name: name, Bin: binPath, Dir: dir, Args: []string{"-config", cfgPath}})
	if err != nil {
		t.Fatal(err)
	}
	g.rg, g.addr, g.admin = rg, rg.Main, rg.Admin
	g.client = &fasthttp.HostClient{
		Addr: g.addr, MaxConns: 64, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		// A retried request would hide the failure being measured.
		MaxIdemponentCallAttempts: 1,
	}
	t.Cleanup(func() { g.stop(t) })
	return g
}

// stop sends SIGTERM and expects a clean exit within 10s.
func (g *gate) stop(t *testing.T) {
	g.client.CloseIdleConnections()
	if g.rg.Exited() {
		return
	}
	if err := g.rg.Stop(10 * time.Second); err != nil {
		t.Errorf("%s: stop: %v\n%s", g.name, err, g.logTail())
	}
}

// get asks path with the client IP ip and returns the status, the
// X-RateLimit-Status header and the body.
func (g *gate) get(path, ip string) (status int, mark, body string, err error) {
	req := fasthttp.AcquireRequest()
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(req)
	defer fasthttp.ReleaseResponse(resp)
	req.SetRequestURI("http://" + g.addr + "/auth")
	if path == "/healthz" || path == "/readyz" {
		req.SetRequestURI("http://" + g.addr + path)
	}
	req.Header.Set("X-Original-URI", path)
	req.Header.Set("X-Real-IP", ip)
	if err := g.client.DoTimeout(req, resp, 2*time.Second); err != nil {
		return 0, "", "", err
	}
	return resp.StatusCode(), string(resp.Header.Peek("X-RateLimit-Status")), string(resp.Body()), nil
}

// exactly checks exact limiting through Redis for a fresh identity: the
// limit of path admitted, the next denied, none of it marked as a failure
// answer. used is how much of the quota the identity already spent.
func (g *gate) exactly(t *testing.T, path, ip string, used int) {
	t.Helper()
	if err := g.exact(path, ip, used); err != nil {
		t.Fatalf("%v\n%s", err, g.logTail())
	}
}

// exact is exactly, returning what went wrong.
func (g *gate) exact(path, ip string, used int) error {
	for i := used; i <= exactLimit; i++ {
		status, mark, body, err := g.get(path, ip)
		want := 204
		if i == exactLimit {
			want = 429
		}
		if err != nil || status != want || mark != "" {
			return fmt.Errorf("%s %s request %d of %d: status %d mark %q body %q err %v; want %d from Redis",
				g.name, path, i+1, exactLimit+1, status, mark, body, err, want)
		}
	}
	return nil
}

// logTail returns the end of the process's log, for failure messages.
func (g *gate) logTail() string {
	b, err := os.ReadFile(g.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-25):], "\n")
}

// logMessages counts the log lines whose message starts with prefix.
func (g *gate) logMessages(prefix string) int {
	b, _ := os.ReadFile(g.logPath)
	return strings.Count(string(b), `"message":"`+prefix)
}

// histogram is a snapshot of rategate_request_duration_seconds, every
// outcome summed: how many answers took at most each bound, and in all.
type histogram struct {
	le    map[string]float64
	count float64
}

// durations scrapes the request duration histogram from /metrics.
func (g *gate) durations(t *testing.T) histogram {
	t.Helper()
	h := histogram{le: map[string]float64{}}
	for _, line := range g.metricLines(t, "rategate_request_duration_seconds_") {
		name, value, ok := strings.Cut(line, " ")
		v, err := strconv.ParseFloat(value, 64)
		if !ok || err != nil {
			continue
		}
		switch {
		case strings.HasPrefix(name, "rategate_request_duration_seconds_count"):
			h.count += v
		case strings.HasPrefix(name, "rategate_request_duration_seconds_bucket"):
			if i := strings.Index(name, `le="`); i >= 0 {
				bound, _, _ := strings.Cut(name[i+4:], `"`)
				h.le[bound] += v
			}
		}
	}
	if h.count == 0 && len(h.le) == 0 {
		t.Fatalf("%s: no rategate_request_duration_seconds in /metrics", g.name)
	}
	return h
}

// within returns the share of the answers between snapshots a and b that
// took at most bound ("0.001"), and how many there were.
func within(a, b histogram, bound string) (share float64, n int) {
	total := b.count - a.count
	if total <= 0 {
		return 1, 0
	}
	return (b.le[bound] - a.le[bound]) / total, int(total)
}

// metricLines returns the /metrics lines that start with prefix.
func (g *gate) metricLines(t *testing.T, prefix string) []string {
	t.Helper()
	status, body, err := fasthttp.GetTimeout(nil, "http://"+g.admin+"/metrics", 5*time.Second)
	if err != nil || status != 200 {
		t.Fatalf("%s: GET /metrics: %d %v", g.name, status, err)
	}
	var out []string
	for _, line := range strings.Split(string(body), "\n") {
		if strings.HasPrefix(line, prefix) {
			out = append(out, line)
		}
	}
	return out
}

// waitBreakerOpen polls /readyz until it says the breaker is open, and
// gives up after within.
func (g *gate) waitBreakerOpen(within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		status, _, body, err := g.get("/readyz", "192.0.2.1")
		if err == nil && status == 503 && strings.Contains(body, "circuit breaker open") {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: breaker not open %v into the outage; /readyz: %d %q %v", g.name, within, status, body, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// rssKiB is the process's resident memory.
func (g *gate) rssKiB(t *testing.T) int {
	t.Helper()
	return procStatus(t, g.rg.Pid(), "VmRSS:")
}

// tcpConns counts the host's TCP sockets whose local port is local (a
// listener's accepted connections) or, when local is 0, whose remote port
// is remote (connections to a server), in the states ESTABLISHED and
// CLOSE_WAIT (the peer closed, this side did not: a leak if it stays).
func tcpConns(t *testing.T, local, remote int) int {
	t.Helper()
	n := 0
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		b, err := os.ReadFile(file)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 4 || (f[3] != "01" && f[3] != "08") {
				continue
			}
			lport, rport := hexPort(f[1]), hexPort(f[2])
			if (local != 0 && lport == local) || (local == 0 && rport == remote) {
				n++
			}
		}
	}
	return n
}

// hexPort reads the port of a /proc/net/tcp address "0100007F:1F90".
func hexPort(addr string) int {
	_, p, _ := strings.Cut(addr, ":")
	n, _ := strconv.ParseInt(p, 16, 32)
	return int(n)
}

// port returns the port of a host:port address.
func port(addr string) int {
	_, p, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(p)
	return n
}

// clientConns counts the connections rategate's main listener holds.
func (g *gate) clientConns(t *testing.T) int { return tcpConns(t, port(g.addr), 0) }

// metric reads one unlabelled sample from /metrics.
func (g *gate) metric(t *testing.T, name string) float64 {
	t.Helper()
	for _, line := range g.metricLines(t, name+" ") {
		if v, err := strconv.ParseFloat(strings.TrimPrefix(line, name+" "), 64); err == nil {
			return v
		}
	}
	t.Fatalf("%s: no %s in /metrics", g.name, name)
	return 0
}

// goroutines reads go_goroutines from the admin listener's /metrics.
func (g *gate) goroutines(t *testing.T) int {
	t.Helper()
	return int(g.metric(t, "go_goroutines"))
}

// procStatus reads one "Name: value kB" line of /proc/<pid>/status.
func procStatus(t *testing.T, pid int, field string) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			n, err := strconv.Atoi(strings.Fields(v)[0])
			if err != nil {
				t.Fatal(err)
			}
			return n
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// alive fails the test if the process has exited.
func (g *gate) alive(t *testing.T) {
	t.Helper()
	select {
	case <-g.rg.Done():
		t.Fatalf("%s died: %v\n%s", g.name, g.rg.Err(), g.logTail())
	default:
	}
}

// redisClients returns how many clients Redis at addr has connected,
// asked over a fresh raw connection (which counts itself: subtract 1).
func redisClients(t *testing.T, addr string) int {
	t.Helper()
	return redisInfo(t, addr, "clients", "connected_clients") - 1
}

// redisInfo returns the integer field of INFO section ("errorstats",
// "errorstat_NOSCRIPT" reads the count=N part), 0 when absent.
func redisInfo(t *testing.T, addr, section, field string) int {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	fmt.Fprintf(c, "INFO %s\r\n", section)
	br := bufio.NewReader(c)
	header, err := br.ReadString('\n') // $<len>
	if err != nil || !strings.HasPrefix(header, "$") {
		t.Fatalf("INFO %s: %q %v", section, header, err)
	}
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("INFO %s: %v", section, err)
		}
		line = strings.TrimSpace(line)
		if line == "" && br.Buffered() == 0 {
			return 0
		}
		v, ok := strings.CutPrefix(line, field+":")
		if !ok {
			continue
		}
		v = strings.TrimPrefix(v, "count=")
		v, _, _ = strings.Cut(v, ",")
		n, err := strconv.Atoi(v)
		if err != nil {
			t.Fatalf("INFO %s: %q", section, line)
		}
		return n
	}
}
