package main

import (
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const wrkOutput = `Running 5s test @ http://127.0.0.1:38091
  2 threads and 50 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.20ms    2.01ms  40.00ms   91.00%
    Req/Sec    20.10k     2.00k   25.00k    70.00%
  Latency Distribution
     50%  830.00us
     75%    1.10ms
     90%    2.00ms
     99%    1.05s
  201234 requests in 5.00s, 20.00MB read
  Socket errors: connect 0, read 2, write 0, timeout 3
  Non-2xx or 3xx responses: 1500
Requests/sec:  40246.80
Transfer/sec:      4.00MB
`

func TestParseWrk(t *testing.T) {
	r, err := parseWrk(wrkOutput)
	if err != nil {
		t.Fatal(err)
	}
	want := wrkResult{Requests: 201234, RPS: 40246.80, P50MS: 0.83, P75MS: 1.1, P90MS: 2, P99MS: 1050, Non2xx: 1500, SocketErrors: 5}
	if !near(r.RPS, want.RPS) || !near(r.P50MS, want.P50MS) || !near(r.P75MS, want.P75MS) || !near(r.P90MS, want.P90MS) ||
		!near(r.P99MS, want.P99MS) || r.Requests != want.Requests || r.Non2xx != want.Non2xx || r.SocketErrors != want.SocketErrors {
		t.Errorf("parseWrk = %+v, want %+v", r, want)
	}
	if _, err := parseWrk("unable to connect to 127.0.0.1:1 Connection refused\n"); err == nil {
		t.Error("parseWrk accepted output without results")
	}
}

func TestParseStatCPU(t *testing.T) {
	// The command name may hold spaces and parentheses.
	line := "4242 (nginx: worker (x)) S 4241 4241 4241 0 -1 4194624 900 0 0 0 150 50 0 0 20 0 1 0 100 1000 200 0"
	got, err := parseStatCPU([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if want := 200 / clockTicks; !near(got, want) {
		t.Errorf("cpu = %v, want %v", got, want)
	}
	if _, err := parseStatCPU([]byte("4242 (x) S 1")); err == nil {
		t.Error("short line accepted")
	}
}

func TestParseMachineBusy(t *testing.T) {
	// user nice system idle iowait irq softirq steal guest guest_nice
	stat := "cpu  100 10 50 1000 20 5 5 10 7 0\ncpu0 50 5 25 500 10 2 3 5 3 0\n"
	got, err := parseMachineBusy([]byte(stat))
	if err != nil {
		t.Fatal(err)
	}
	if want := 180 / clockTicks; !near(got, want) {
		t.Errorf("busy = %v, want %v", got, want)
	}
}

func TestParsePerfCount(t *testing.T) {
	out := "\n1234,,syscalls:sys_exit_accept4,1002003,100.00,,\n"
	if got := parsePerfCount(out); got != 1234 {
		t.Errorf("parsePerfCount = %d, want 1234", got)
	}
	if got := parsePerfCount("<not counted>,,syscalls:sys_exit_accept4,0,0.00,,\n"); got != -1 {
		t.Errorf("not counted = %d, want -1", got)
	}
}

func TestParseCommandStats(t *testing.T) {
	text := "# Commandstats\r\ncmdstat_evalsha:calls=1200,usec=3400,usec_per_call=2.83,rejected_calls=0,failed_calls=3\r\n" +
		"cmdstat_hset:calls=1200,usec=900,usec_per_call=0.75,rejected_calls=0,failed_calls=0\r\n" +
		"cmdstat_config|resetstat:calls=1,usec=35,usec_per_call=35.00,rejected_calls=0,failed_calls=0\r\n" +
		"# Stats\r\ntotal_reads_processed:401\r\n"
	rs := redisStatsOf(text)
	if rs.Calls["evalsha"] != 1200 || rs.Calls["hset"] != 1200 || rs.Calls["config|resetstat"] != 1 || len(rs.Calls) != 3 {
		t.Errorf("calls = %v", rs.Calls)
	}
	if rs.USec["evalsha"] != 3400 || rs.USec["hset"] != 900 || len(rs.USec) != 3 {
		t.Errorf("usec = %v", rs.USec)
	}
	if rs.Failed["evalsha"] != 3 || len(rs.Failed) != 1 || rs.Reads != 401 {
		t.Errorf("failed = %v, reads = %d", rs.Failed, rs.Reads)
	}
}

// TestSetRedis: Redis's figures per decision from one run's INFO, the
// runner's own INFO and RESETSTAT left out, scripts apart from the
// commands they ran, housekeeping apart from both.
func TestSetRedis(t *testing.T) {
	s := sample{wrkResult: wrkResult{Requests: 1000}}
	s.setRedis(redisStats{
		Calls:  map[string]int64{"evalsha": 1000, "time": 1000, "hmget": 1000, "hset": 1000, "ping": 2, "info": 1, "config|resetstat": 1},
		USec:   map[string]int64{"evalsha": 9000, "time": 500, "hmget": 1500, "hset": 1000, "ping": 4, "info": 50, "config|resetstat": 30},
		Failed: map[string]int64{"evalsha": 2, "info": 1},
		Reads:  201,
	})
	for _, c := range []struct {
		what      string
		got, want float64
	}{
		{"commands per request", s.RedisPerRequest, 4.002},
		{"scripts per request", s.EvalshaPerRequest, 1},
		{"script µs per request", s.RedisScriptUSPerRequest, 9},
		{"their commands' µs per request", s.RedisCommandUSPerRequest, 3},
		{"reads per request (the INFO's own read left out)", s.RedisReadsPerRequest, 0.2},
	} {
		if !near(c.got, c.want) {
			t.Errorf("%s = %v, want %v", c.what, c.got, c.want)
		}
	}
	if s.RedisFailed != 2 || s.RedisCalls["info"] != 0 || s.RedisUSec["evalsha"] != 9000 {
		t.Errorf("failed %d, calls %v, usec %v", s.RedisFailed, s.RedisCalls, s.RedisUSec)
	}
	empty := sample{}
	empty.setRedis(redisStats{Calls: map[string]int64{"evalsha": 5}})
	if empty.RedisPerRequest != 0 || empty.RedisScriptUSPerRequest != 0 {
		t.Errorf("no requests: %+v", empty)
	}
}

func TestParseRedisBenchmark(t *testing.T) {
	out := `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms","p99_latency_ms","max_latency_ms"
"evalsha 6163 1 k 0 1 1000000000 60000000 1000000000 1 0","151057.39","5.180","0.632","5.031","6.495","7.311","12.383"
`
	r, err := parseRedisBenchmark(out, 450000)
	if err != nil {
		t.Fatal(err)
	}
	if !near(r.RPS, 151057.39) || !near(r.P50MS, 5.031) || !near(r.P99MS, 7.311) || r.Requests != 450000 {
		t.Errorf("parseRedisBenchmark = %+v", r)
	}
	for _, bad := range []string{"", "ERROR: NOSCRIPT\n", "\"test\",\"rps\"\n\"x\",\"0\"\n"} {
		if _, err := parseRedisBenchmark(bad, 1); err == nil {
			t.Errorf("accepted %q", bad)
		}
	}
}

// TestCeilingCommand: one key and decide.lua's ARGV for one check (now,
// then code, limit, period, burst, cost, shadow).
func TestCeilingCommand(t *testing.T) {
	c := ceilingCommand("abc")
	if len(c) != 11 || c[0] != "evalsha" || c[1] != "abc" || c[2] != "1" || c[3] != ceilingKey || c[4] != "0" || c[5] != "1" ||
		c[6] != "1000000000" || c[7] != "60000000" || c[9] != "1" || c[10] != "0" {
		t.Errorf("ceilingCommand = %q", c)
	}
}

func TestSumMetric(t *testing.T) {
	text := `# HELP rategate_failure_mode_decisions_total x
# TYPE rategate_failure_mode_decisions_total counter
rategate_failure_mode_decisions_total{mode="allow"} 3
rategate_failure_mode_decisions_total{mode="deny"} 2
rategate_failure_mode_decisions_total_extra 100
`
	got, err := sumMetric(text, "rategate_failure_mode_decisions_total")
	if err != nil || got != 5 {
		t.Errorf("sumMetric = %v, %v; want 5", got, err)
	}
	if _, err := sumMetric(text, "rategate_missing"); err == nil {
		t.Error("a missing family is not an error")
	}
}

// TestCopyNginxDir runs the rewrite on the shipped nginx/ and checks that
// only the addresses and the worker count changed.
func TestCopyNginxDir(t *testing.T) {
	dst := t.TempDir()
	rw := nginxRewrite{listen: 18000, auth: "127.0.0.1:18080", app: "127.0.0.1:18001"}
	if err := copyNginxDir(filepath.Join("..", "..", "nginx"), dst, rw); err != nil {
		t.Fatal(err)
	}
	conf := read(t, filepath.Join(dst, "nginx.conf"))
	for _, want := range []string{"worker_processes 1;", "listen 127.0.0.1:18000;", "server 127.0.0.1:18001;"} {
		if !strings.Contains(conf, want) {
			t.Errorf("nginx.conf lacks %q", want)
		}
	}
	if up := read(t, filepath.Join(dst, "rategate-upstream.conf")); !strings.Contains(up, "server 127.0.0.1:18080 ") {
		t.Errorf("rategate-upstream.conf does not point at the auth service:\n%s", up)
	}
	shipped := read(t, filepath.Join("..", "..", "nginx", "nginx.conf"))
	if a, b := strings.Count(shipped, "\n"), strings.Count(conf, "\n"); a != b {
		t.Errorf("line count changed: %d -> %d", a, b)
	}
	for _, d := range []string{"logs", "temp"} {
		if fi, err := os.Stat(filepath.Join(dst, d)); err != nil || !fi.IsDir() {
			t.Errorf("%s/ not created: %v", d, err)
		}
	}
}

func TestRewriteKeepalive(t *testing.T) {
	hits := map[string]int{}
	in := "upstream app {\n    server 127.0.0.1:8001;\n    keepalive 16;\n}\n"
	got := rewriteConf(in, nginxRewrite{app: "127.0.0.1:2", keepalive: 256}, hits)
	if !strings.Contains(got, "    keepalive 256;\n") || hits["keepalive"] != 1 {
		t.Errorf("rewriteConf = %q, hits %v", got, hits)
	}
	if got := rewriteConf(in, nginxRewrite{app: "127.0.0.1:2"}, map[string]int{}); !strings.Contains(got, "keepalive 16;") {
		t.Errorf("keepalive changed without the experiment: %q", got)
	}
}

func TestRewriteConfLeavesComments(t *testing.T) {
	hits := map[string]int{}
	in := "# listen 8000; in a comment\nlisten 8000;\n"
	got := rewriteConf(in, nginxRewrite{listen: 1}, hits)
	if got != "# listen 8000; in a comment\nlisten 127.0.0.1:1;\n" || hits[shippedListen] != 1 {
		t.Errorf("rewriteConf = %q, hits %v", got, hits)
	}
}

func TestVerdict(t *testing.T) {
	atLeast := func(v float64) bool { return v >= 0.8 }
	for _, c := range []struct {
		rounds []float64
		median float64
		want   string
	}{
		{[]float64{0.81, 0.85, 0.9}, 0.85, "met"},
		{[]float64{0.6, 0.7, 0.75}, 0.7, "not met"},
		{[]float64{0.53, 1.0, 0.61, 0.6, 0.64}, 0.61, "not met"}, // one disturbed round
		{[]float64{0.7, 0.82, 0.85, 0.78, 0.9}, 0.82, "inconclusive"},
	} {
		if got := verdict(c.rounds, c.median, atLeast); got != c.want {
			t.Errorf("verdict(%v) = %q, want %q", c.rounds, got, c.want)
		}
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}

func TestLoadSettings(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	s, err := loadSettings(env(nil))
	if err != nil || s.Duration.Seconds() != 3 || s.Rounds != 4 || len(s.Scenarios) != len(scenarios)+1 {
		t.Errorf("defaults: %+v, %v", s, err)
	}
	if !s.Lease || s.Pprof {
		t.Errorf("want the lease arm on and pprof off by default: %+v", s)
	}
	if s, err := loadSettings(env(map[string]string{"BENCH_LEASE": "0"})); err != nil || s.Lease {
		t.Errorf("BENCH_LEASE=0: %+v, %v", s, err)
	}
	s, err = loadSettings(env(map[string]string{"BENCH_DURATION": "2s", "BENCH_ROUNDS": "1", "BENCH_SCENARIOS": "attack, latency, hot-key", "BENCH_LEASE": "1"}))
	if err != nil || s.Duration.Seconds() != 2 || s.Rounds != 1 || !s.wants("attack") || !s.wants("latency") || !s.wants("hot-key") || s.wants("direct") || !s.Lease {
		t.Errorf("knobs: %+v, %v", s, err)
	}
	_, err = loadSettings(env(map[string]string{"BENCH_DURATION": "500ms", "BENCH_ROUNDS": "0", "BENCH_SCENARIOS": "nope", "BENCH_LEASE": "yes"}))
	for _, want := range []string{"BENCH_DURATION", "BENCH_ROUNDS", `unknown scenario "nope"`, "BENCH_LEASE"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not mention %s", err, want)
		}
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-9*math.Max(1, math.Abs(b)) }

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
