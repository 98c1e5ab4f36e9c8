//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rategate/rategate/internal/testredis"
)

// Timing of the adaptive rule below, as docs/adaptive.md states it: a
// change of the backend's load reaches Prometheus at its next scrape,
// the leader at its next evaluation (plus the reading's timeout), every
// other instance within a second of the leader's write.
const (
	adScrape   = time.Second
	adInterval = time.Second
	adTimeout  = 500 * time.Millisecond
	adLease    = 2 * time.Second
	// adFollow is the documented bound for the fleet to follow.
	adFollow = adScrape + adInterval + adTimeout + time.Second
	// adSlack is what a loaded 2-core machine adds to process wake-ups
	// and scrapes; the bound asserted is adFollow plus it.
	adSlack = 1500 * time.Millisecond
)

// loadBackend is a small application whose /metrics exports the load the
// test sets, for Prometheus to scrape.
type loadBackend struct {
	addr string
	load atomic.Value // string
}

func startLoadBackend(t *testing.T, load string) *loadBackend {
	t.Helper()
	b := &loadBackend{}
	b.load.Store(load)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprintf(w, "# TYPE backend_load gauge\nbackend_load %s\n", b.load.Load().(string))
	}), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	b.addr = ln.Addr().String()
	return b
}

func (b *loadBackend) set(load string) { b.load.Store(load) }

// startScrapingPrometheus runs Debian's Prometheus scraping target every
// second and returns its base URL once the target is up.
func startScrapingPrometheus(t *testing.T, bin, dir, target string) string {
	t.Helper()
	cfg := fmt.Sprintf(`global:
  scrape_interval: %s
  evaluation_interval: %s
scrape_configs:
  - job_name: backend
    static_configs:
      - targets: [%q]
`, adScrape, adScrape, target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	api, _ := startPrometheus(t, bin, dir, cfgPath)
	return api
}

// startPrometheus runs Debian's Prometheus on the configuration at
// cfgPath, its data under dir, and returns its base URL once it is ready,
// and the process.
func startPrometheus(t *testing.T, bin, dir, cfgPath string) (string, *proc) {
	t.Helper()
	tries := 0
	logPath := filepath.Join(dir, "prometheus.log")
	port, p := startOnFreePort(t, "prometheus", logPath, 30*time.Second, func(port int) *proc {
		tries++
		return startProc(t, "prometheus", logPath, bin,
			"--config.file="+cfgPath,
			"--storage.tsdb.path="+filepath.Join(dir, fmt.Sprintf("tsdb-%d", tries)),
			"--web.listen-address=127.0.0.1:"+strconv.Itoa(port),
			"--log.level=warn")
	}, func(port int) error {
		return httpStatus("http://127.0.0.1:"+strconv.Itoa(port)+"/-/ready", http.StatusOK)
	})
	return "http://127.0.0.1:" + strconv.Itoa(port), p
}

// adaptiveRule is one rule of GET /v1/rules, the parts this test reads.
type adaptiveRule struct {
	Name      string `json:"name"`
	Effective struct {
		Limit int64 `json:"limit"`
	} `json:"effective"`
	Adaptive *struct {
		Factor  float64  `json:"factor"`
		Signal  *float64 `json:"signal"`
		SetBy   string   `json:"set_by"`
		Leader  bool     `json:"leader"`
		Applied bool     `json:"applied"`
		Error   string   `json:"error"`
	} `json:"adaptive"`
}

func (r *rategate) adaptiveRule(t *testing.T) (adaptiveRule, error) {
	t.Helper()
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://127.0.0.1:" + strconv.Itoa(r.adminPort) + "/v1/rules")
	if err != nil {
		return adaptiveRule{}, err
	}
	defer resp.Body.Close()
	var v struct {
		Rules []adaptiveRule `json:"rules"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil {
		return adaptiveRule{}, err
	}
	for _, rule := range v.Rules {
		if rule.Name == "api" {
			return rule, nil
		}
	}
	return adaptiveRule{}, fmt.Errorf("no rule api")
}

// waitLimitEverywhere waits until every rategate enforces want and
// returns how long that took.
func waitLimitEverywhere(t *testing.T, within time.Duration, want int64, rgs ...*rategate) time.Duration {
	t.Helper()
	start := time.Now()
	err := waitFor(within, func() error {
		for _, rg := range rgs {
			rule, err := rg.adaptiveRule(t)
			if err != nil {
				return err
			}
			if rule.Effective.Limit != want {
				return fmt.Errorf("%s enforces %d (adaptive %+v)", rg.name, rule.Effective.Limit, rule.Adaptive)
			}
		}
		return nil
	})
	if err != nil {
		for _, rg := range rgs {
			t.Logf("%s log:\n%s", rg.name, rg.proc.logTail())
		}
		t.Fatalf("limit %d not in force everywhere within %v: %v", want, within, err)
	}
	return time.Since(start)
}

// admitted sends n /auth requests for user, alternating between the
// rategates, and returns how many got 204; every other answer must be
// the denial.
func admitted(t *testing.T, user string, n int, rgs ...*rategate) int {
	t.Helper()
	c := http.Client{Timeout: 5 * time.Second}
	ok := 0
	for i := 0; i < n; i++ {
		rg := rgs[i%len(rgs)]
		req, _ := http.NewRequest("GET", "http://"+rg.addr()+"/auth", nil)
		req.Header.Set("X-Original-URI", "/api/items")
		req.Header.Set("X-Original-Method", "GET")
		req.Header.Set("X-Real-IP", "203.0.113.50")
		req.Header.Set("X-User-Id", user)
		resp, err := c.Do(req)
		if err != nil {
			t.Fatalf("/auth on %s: %v", rg.name, err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusNoContent:
			ok++
		case http.StatusTooManyRequests:
		default:
			t.Fatalf("/auth on %s: %d", rg.name, resp.StatusCode)
		}
	}
	return ok
}

// TestAdaptiveFleet: a real Prometheus scrapes a backend whose load the
// test changes; two rategate processes on one Redis follow it through the
// step table within the documented time and both enforce exactly the new
// limit; when the instance evaluating the signal is killed, the other
// takes its lease over and keeps following.
func TestAdaptiveFleet(t *testing.T) {
	promBin := needBinary(t, "prometheus", "prometheus")
	needBinary(t, "redis-server", "redis-server")
	dir := filepath.Join(workDir, safeName(t.Name()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	needWindow(t, window, 30*time.Second)
	redis := testredis.Start(t)
	backend := startLoadBackend(t, "30")
	prom := startScrapingPrometheus(t, promBin, dir, backend.addr)

	cfgPath := filepath.Join(dir, "rategate.yaml")
	cfg := fmt.Sprintf(`redis:
  timeout: 200ms
failure_mode: allow
rules:
  - name: api
    match: {path: /api/}
    key: [user]
    algorithm: fixed_window
    limit: 10
    period: 24h
    adaptive:
      prometheus:
        url: %s
        query: max(backend_load{job="backend"})
      steps:
        - {below: 50, factor: 2}
        - {below: 80, factor: 1}
        - {factor: 0.5}
      hysteresis: 2
      interval: %s
      timeout: %s
      cooldown: 0s
      keep_on_error: 30s
      lease_ttl: %s
`, prom, adInterval, adTimeout, adLease)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	redisURL := "redis://" + redis.Addr + "/0"
	rgs := []*rategate{newRategate(t, "rategate-1", dir, cfgPath, redisURL), newRategate(t, "rategate-2", dir, cfgPath, redisURL)}
	for _, rg := range rgs {
		rg.start(t)
	}

	// Load 30 (below 50): x2, 20 per window. The first scrape and
	// Prometheus's start come first.
	took := waitLimitEverywhere(t, 20*time.Second, 20, rgs...)
	t.Logf("load 30: both enforce 20 after %v (Prometheus starting)", took)
	if got := admitted(t, "u1", 45, rgs...); got != 20 {
		t.Errorf("load 30: %d of 45 requests admitted through both instances, want exactly 20", got)
	}

	// Load 90 (above 80): x0.5, 5 per window.
	backend.set("90")
	took = waitLimitEverywhere(t, adFollow+adSlack, 5, rgs...)
	t.Logf("load 90: both enforce 5 after %v (documented: within %v)", took, adFollow)
	if got := admitted(t, "u2", 15, rgs...); got != 5 {
		t.Errorf("load 90: %d of 15 requests admitted, want exactly 5", got)
	}

	// One instance evaluates, and both say which.
	leader, follower := -1, -1
	for i, rg := range rgs {
		rule, err := rg.adaptiveRule(t)
		if err != nil {
			t.Fatal(err)
		}
		if rule.Adaptive == nil || rule.Adaptive.Signal == nil || *rule.Adaptive.Signal != 90 || rule.Adaptive.Factor != 0.5 {
			t.Fatalf("%s: adaptive %+v, want factor 0.5 from signal 90", rg.name, rule.Adaptive)
		}
		if rule.Adaptive.Leader {
			if leader >= 0 {
				t.Fatal("both instances evaluate the signal")
			}
			leader = i
		} else {
			follower = i
		}
	}
	if leader < 0 {
		t.Fatal("no instance evaluates the signal")
	}
	code, _, metrics := adminGet(t, "http://127.0.0.1:"+strconv.Itoa(rgs[follower].adminPort), "/metrics", "")
	for _, want := range []string{`rategate_adaptive_factor{rule="api"} 0.5`, `rategate_adaptive_signal{rule="api"} 90`,
		`rategate_adaptive_leader{rule="api"} 0`} {
		if code != http.StatusOK || !strings.Contains(metrics, want+"\n") {
			t.Errorf("%s /metrics lacks %s", rgs[follower].name, want)
		}
	}

	// The leader dies (SIGKILL: no release); load 60 (50..80): x1, 10.
	rgs[leader].stop()
	died := time.Now()
	backend.set("60")
	survivor := rgs[follower]
	took = waitLimitEverywhere(t, adLease+adFollow+adSlack, 10, survivor)
	t.Logf("leader killed: the survivor enforces 10 after %v (documented: within lease_ttl + %v = %v)", time.Since(died), adFollow, adLease+adFollow)
	rule, err := survivor.adaptiveRule(t)
	if err != nil {
		t.Fatal(err)
	}
	if rule.Adaptive == nil || !rule.Adaptive.Leader || rule.Adaptive.Signal == nil || *rule.Adaptive.Signal != 60 {
		t.Fatalf("survivor: adaptive %+v, want it to lead with signal 60", rule.Adaptive)
	}
	if got := admitted(t, "u3", 25, survivor); got != 10 {
		t.Errorf("after the takeover: %d of 25 requests admitted, want exactly 10", got)
	}

	// `rategate admin rules` says so.
	out, err := exec.Command(rategateBinary(t), "admin", "-addr", "127.0.0.1:"+strconv.Itoa(survivor.adminPort), "rules").CombinedOutput()
	if err != nil {
		t.Fatalf("rategate admin rules: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "ADAPTIVE") || !strings.Contains(string(out), "x1 signal=60 by ") || !strings.Contains(string(out), "(this instance)") {
		t.Errorf("rategate admin rules:\n%s", out)
	}
	t.Logf("rategate admin rules:\n%s", out)
}
