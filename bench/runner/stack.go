package main

import (
	"bufio"
	"bytes"
	"context"
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
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// stack is every server of the benchmark, running.
type stack struct {
	ps     *procSet
	work   string
	bin    string
	script string // bench/wrk/users.lua
	policy string // bench/policy.yaml
	// pprof: rategate serves /debug/pprof/ (BENCH_PPROF=1); profiles go
	// to profileDir.
	pprof      bool
	profileDir string

	redis, rategate, floor, app, ngRG, ngFloor                   *proc
	redisAddr, rgAddr, floorAddr, appAddr, ngRGAddr, ngFloorAddr string
	adminAddr                                                    string

	// The quiet variant: a second rategate with deny_status 403 behind
	// nginx/nginx-quiet.conf, and the floor behind the same config.
	rategateQuiet, ngRGQuiet, ngFloorQuiet                       *proc
	rgQuietAddr, adminQuietAddr, ngRGQuietAddr, ngFloorQuietAddr string

	rdb *redis.Client
}

// startStack starts everything, checks that each path answers as expected,
// and returns the running stack. On error what was started is left to
// ps.stopAll.
func startStack(ctx context.Context, ps *procSet, work, bin, repo string, keepalive int, pprof bool) (*stack, error) {
	st := &stack{ps: ps, work: work, bin: bin}
	var err error
	if st.script, err = filepath.Abs(filepath.Join(repo, "bench", "wrk", "users.lua")); err != nil {
		return nil, err
	}
	if st.policy, err = filepath.Abs(filepath.Join(repo, "bench", "policy.yaml")); err != nil {
		return nil, err
	}
	logs := filepath.Join(work, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, err
	}
	addr := func() (string, error) {
		p, err := freePort()
		return "127.0.0.1:" + strconv.Itoa(p), err
	}
	for _, a := range []*string{&st.redisAddr, &st.rgAddr, &st.floorAddr, &st.appAddr, &st.ngRGAddr, &st.ngFloorAddr,
		&st.adminAddr, &st.rgQuietAddr, &st.adminQuietAddr, &st.ngRGQuietAddr, &st.ngFloorQuietAddr} {
		if *a, err = addr(); err != nil {
			return nil, err
		}
	}

	// Redis: no persistence, like the tests' redis-server.
	redisDir := filepath.Join(work, "redis")
	if err := os.MkdirAll(redisDir, 0o755); err != nil {
		return nil, err
	}
	_, rport, _ := net.SplitHostPort(st.redisAddr)
	if st.redis, err = ps.start("redis-server", filepath.Join(logs, "redis.log"), "redis-server",
		"--bind", "127.0.0.1", "--port", rport, "--save", "", "--appendonly", "no",
		"--dir", redisDir, "--daemonize", "no"); err != nil {
		return nil, err
	}
	st.rdb = redis.NewClient(&redis.Options{Addr: st.redisAddr})
	if err := waitRedis(ctx, st.rdb, st.redis); err != nil {
		return nil, err
	}

	floorBin := filepath.Join(bin, "floor")
	if st.floor, err = ps.start("floor", filepath.Join(logs, "floor.log"), floorBin, "-listen", st.floorAddr); err != nil {
		return nil, err
	}
	if st.app, err = ps.start("app", filepath.Join(logs, "app.log"), floorBin, "-listen", st.appAddr); err != nil {
		return nil, err
	}
	quietPolicy, err := writeQuietPolicy(st.policy, filepath.Join(work, "policy-quiet.yaml"))
	if err != nil {
		return nil, err
	}
	rg := filepath.Join(bin, "rategate")
	var extra []string
	if pprof {
		extra = append(extra, "-pprof")
		st.pprof = true
	}
	if st.rategate, err = ps.start("rategate", filepath.Join(logs, "rategate.log"), rg,
		append([]string{"-config", st.policy, "-redis", "redis://" + st.redisAddr + "/0",
			"-listen", st.rgAddr, "-admin-listen", st.adminAddr}, extra...)...); err != nil {
		return nil, err
	}
	if st.rategateQuiet, err = ps.start("rategate-quiet", filepath.Join(logs, "rategate-quiet.log"), rg,
		append([]string{"-config", quietPolicy, "-redis", "redis://" + st.redisAddr + "/0",
			"-listen", st.rgQuietAddr, "-admin-listen", st.adminQuietAddr}, extra...)...); err != nil {
		return nil, err
	}
	for _, w := range []struct {
		p          *proc
		addr, path string
		want       int
	}{{st.floor, st.floorAddr, "/", 204}, {st.app, st.appAddr, "/", 204},
		{st.rategate, st.rgAddr, "/readyz", 200}, {st.rategateQuiet, st.rgQuietAddr, "/readyz", 200}} {
		if err := waitHTTP(w.p, w.addr, w.path, w.want, 10*time.Second); err != nil {
			return nil, err
		}
	}

	// Copies of the shipped nginx/, differing only in the auth address:
	// nginx.conf, and nginx-quiet.conf for the quiet variant.
	for _, n := range []struct {
		name, auth, listen, conf string
		dst                      **proc
	}{
		{"nginx-rategate", st.rgAddr, st.ngRGAddr, "nginx.conf", &st.ngRG},
		{"nginx-floor", st.floorAddr, st.ngFloorAddr, "nginx.conf", &st.ngFloor},
		{"nginx-rategate-quiet", st.rgQuietAddr, st.ngRGQuietAddr, "nginx-quiet.conf", &st.ngRGQuiet},
		{"nginx-floor-quiet", st.floorAddr, st.ngFloorQuietAddr, "nginx-quiet.conf", &st.ngFloorQuiet},
	} {
		prefix := filepath.Join(work, n.name)
		_, lport, _ := net.SplitHostPort(n.listen)
		port, _ := strconv.Atoi(lport)
		if err := copyNginxDir(filepath.Join(repo, "nginx"), prefix, nginxRewrite{listen: port, auth: n.auth, app: st.appAddr, keepalive: keepalive}); err != nil {
			return nil, err
		}
		p, err := ps.start(n.name, filepath.Join(logs, n.name+".log"), "nginx",
			"-p", prefix+"/", "-c", n.conf, "-g", "daemon off;")
		if err != nil {
			return nil, err
		}
		*n.dst = p
		if err := waitHTTP(p, n.listen, "/nginx-health", 200, 10*time.Second); err != nil {
			return nil, fmt.Errorf("%w\nerror.log:\n%s", err, tail(filepath.Join(prefix, "logs", "error.log"), 20))
		}
	}
	return st, st.check()
}

// writeQuietPolicy writes the bench policy with deny_status 403, for the
// quiet NGINX variant, and returns its path.
func writeQuietPolicy(src, dst string) (string, error) {
	b, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	const anchor = "\nfailure_mode: allow\n"
	if !bytes.Contains(b, []byte(anchor)) {
		return "", fmt.Errorf("%s has no %q line: update writeQuietPolicy", src, strings.TrimSpace(anchor))
	}
	b = bytes.Replace(b, []byte(anchor), []byte(anchor+"deny_status: 403\n"), 1)
	return dst, os.WriteFile(dst, b, 0o644)
}

// check makes sure each path is what the numbers will claim: NGINX asks
// rategate (rate-limit headers come back) or the floor (none), the app is
// reached, and /auth decides directly.
func (st *stack) check() error {
	user := map[string]string{"X-User": "check-user"}
	for _, ng := range []struct{ what, addr string }{{"NGINX", st.ngRGAddr}, {"NGINX (quiet)", st.ngRGQuietAddr}} {
		status, hdr, err := httpDo(ng.addr, "/api/items/1", user)
		if err != nil || status != 204 || hdr["x-ratelimit-limit"] == "" {
			return fmt.Errorf("%s -> rategate -> app: status %d, X-RateLimit-Limit %q, err %v (want 204 with the header)", ng.what, status, hdr["x-ratelimit-limit"], err)
		}
	}
	for _, ng := range []struct{ what, addr string }{{"NGINX", st.ngFloorAddr}, {"NGINX (quiet)", st.ngFloorQuietAddr}} {
		status, hdr, err := httpDo(ng.addr, "/api/items/1", user)
		if err != nil || status != 204 || hdr["x-ratelimit-limit"] != "" {
			return fmt.Errorf("%s -> floor -> app: status %d, X-RateLimit-Limit %q, err %v (want 204 without the header)", ng.what, status, hdr["x-ratelimit-limit"], err)
		}
	}
	status, hdr, err := httpDo(st.rgAddr, "/auth", map[string]string{
		"X-Original-URI": "/api/items/1", "X-Real-IP": "127.0.0.1", "X-User-Id": "check-user",
	})
	if err != nil || status != 204 || hdr["ratelimit-policy"] == "" {
		return fmt.Errorf("rategate /auth: status %d, RateLimit-Policy %q, err %v (want 204 with the header)", status, hdr["ratelimit-policy"], err)
	}
	return nil
}

// describe says what runs where, for the results.
func (st *stack) describe() stackInfo {
	return stackInfo{
		Summary: fmt.Sprintf("stack: redis %s · rategate %s (quiet: %s) · floor %s · app (floor binary) %s · NGINX→rategate %s · NGINX→floor %s · quiet NGINX→rategate %s, →floor %s",
			st.redisAddr, st.rgAddr, st.rgQuietAddr, st.floorAddr, st.appAddr, st.ngRGAddr, st.ngFloorAddr, st.ngRGQuietAddr, st.ngFloorQuietAddr),
		App: "the floor server (204, no body) on its own port, behind both NGINX copies",
		NGINX: "copies of nginx/ (nginx.conf, or nginx-quiet.conf for attack-quiet, with their includes) with only the listen, " +
			"rategate and app addresses rewritten and worker_processes 1; access_log and error_log as shipped",
	}
}

// target is one side of a comparison.
type target struct {
	name  string // "floor" or "rategate"
	via   string // "nginx" or "direct"
	url   string
	auth  *proc
	nginx *proc  // nil when direct
	admin string // rategate's admin listener; "" for the floor
}

func (st *stack) target(name, via string, quiet bool) target {
	t := target{name: name, via: via}
	switch {
	case name == "floor" && via == "nginx" && quiet:
		t.url, t.auth, t.nginx = "http://"+st.ngFloorQuietAddr, st.floor, st.ngFloorQuiet
	case name == "floor" && via == "nginx":
		t.url, t.auth, t.nginx = "http://"+st.ngFloorAddr, st.floor, st.ngFloor
	case name == "floor":
		t.url, t.auth = "http://"+st.floorAddr, st.floor
	case via == "nginx" && quiet:
		t.url, t.auth, t.nginx, t.admin = "http://"+st.ngRGQuietAddr, st.rategateQuiet, st.ngRGQuiet, st.adminQuietAddr
	case via == "nginx":
		t.url, t.auth, t.nginx, t.admin = "http://"+st.ngRGAddr, st.rategate, st.ngRG, st.adminAddr
	default:
		t.url, t.auth, t.admin = "http://"+st.rgAddr, st.rategate, st.adminAddr
	}
	return t
}

// all is every long-running server of the stack.
func (st *stack) all() []*proc {
	return []*proc{st.redis, st.rategate, st.rategateQuiet, st.floor, st.app, st.ngRG, st.ngFloor, st.ngRGQuiet, st.ngFloorQuiet}
}

// runScenario alternates floor and rategate runs of sc.
func (st *stack) runScenario(ctx context.Context, cfg settings, sc scenario) (scenarioResult, error) {
	r := scenarioResult{scenario: sc}
	fmt.Printf("\n%s — %s\n", sc.Name, sc.Description)
	for round := 1; round <= cfg.Rounds; round++ {
		for _, name := range []string{"floor", "rategate"} {
			tg := st.target(name, sc.Via, sc.Quiet)
			load := func(ctx context.Context) (loadResult, error) {
				out, cpu, err := runTimed(ctx, "wrk", wrkArgs(cfg.Threads, cfg.Connections, cfg.Duration, st.script, tg.url, sc.Via, sc.Prefix, sc.Users)...)
				if err != nil {
					return loadResult{}, err
				}
				w, err := parseWrk(out)
				return loadResult{wrkResult: w, GenCPU: cpu}, err
			}
			var profiled chan error
			if st.pprof && name == "rategate" && round == 1 && tg.admin != "" {
				profiled = make(chan error, 1)
				go func() { profiled <- st.saveProfile(ctx, tg.admin, sc.Name, cfg.Duration) }()
			}
			s, err := st.measure(ctx, tg, round, cfg.Duration+30*time.Second, load)
			if profiled != nil {
				if perr := <-profiled; perr != nil {
					fmt.Println("  (no profile: " + perr.Error() + ")")
				}
			}
			if err != nil {
				return r, fmt.Errorf("%s, %s, round %d: %w", sc.Name, name, round, err)
			}
			fmt.Println("  " + s.line())
			if name == "floor" {
				r.Floor = append(r.Floor, s)
			} else {
				r.Rategate = append(r.Rategate, s)
			}
		}
	}
	r.summarize()
	fmt.Printf("  => rategate/floor %.2f (median req/s %.0f / %.0f)\n", r.Ratio, r.RategateMedian.RPS, r.FloorMedian.RPS)
	return r, nil
}

// runLatency is the fixed-rate check: floor and rategate through NGINX at
// the same rate, half of rategate's median maximum in mostly-allowed.
func (st *stack) runLatency(ctx context.Context, cfg settings, done []scenarioResult) (*latencyResult, error) {
	var rate float64
	for _, r := range done {
		if r.Name == "mostly-allowed" {
			rate = r.RategateMedian.RPS / 2
		}
	}
	if v := os.Getenv("BENCH_RATE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 {
			return nil, fmt.Errorf("BENCH_RATE=%q: want requests per second", v)
		}
		rate = f
	}
	if rate <= 0 {
		return nil, fmt.Errorf("latency needs mostly-allowed in BENCH_SCENARIOS (its rate is half of that maximum), or BENCH_RATE")
	}
	rate = float64(int(rate/100) * 100) // a round number
	lr := &latencyResult{Rate: rate}
	fmt.Printf("\n%s — p99 at %.0f req/s (half of rategate's maximum), open loop (bench/openloop), through NGINX\n", latencyScenario, rate)
	for round := 1; round <= cfg.Rounds; round++ {
		for _, name := range []string{"floor", "rategate"} {
			tg := st.target(name, "nginx", false)
			load := func(ctx context.Context) (loadResult, error) {
				out, cpu, err := runTimed(ctx, filepath.Join(st.bin, "openloop"),
					"-addr", strings.TrimPrefix(tg.url, "http://"), "-rate", strconv.FormatFloat(rate, 'f', 0, 64),
					"-duration", cfg.Duration.String(), "-warmup", "500ms", "-connections", strconv.Itoa(cfg.Connections),
					"-users", strconv.Itoa(cfg.Users), "-prefix", "/api/")
				if err != nil {
					return loadResult{}, err
				}
				return parseOpenloop(out, cpu)
			}
			var profiled chan error
			if st.pprof && name == "rategate" && round == 1 && tg.admin != "" {
				profiled = make(chan error, 1)
				go func() { profiled <- st.saveProfile(ctx, tg.admin, latencyScenario, cfg.Duration) }()
			}
			s, err := st.measure(ctx, tg, round, cfg.Duration+30*time.Second, load)
			if profiled != nil {
				if perr := <-profiled; perr != nil {
					fmt.Println("  (no profile: " + perr.Error() + ")")
				}
			}
			if err != nil {
				return nil, fmt.Errorf("%s, %s, round %d: %w", latencyScenario, name, round, err)
			}
			fmt.Println("  " + s.line())
			if name == "floor" {
				lr.Floor = append(lr.Floor, s)
			} else {
				lr.Rategate = append(lr.Rategate, s)
			}
		}
	}
	lr.summarize()
	fmt.Printf("  => p99 rategate %.2f ms, floor %.2f ms: +%.2f ms\n", lr.RategateMedian.P99MS, lr.FloorMedian.P99MS, lr.DeltaP99MS)
	return lr, nil
}

// openloopReport is bench/openloop's output (the fields used here).
type openloopReport struct {
	AchievedRate float64        `json:"achieved_rate"`
	Completed    int64          `json:"completed"`
	Errors       int64          `json:"errors"`
	Status       map[string]int `json:"status"`
	P50US        float64        `json:"p50_us"`
	P90US        float64        `json:"p90_us"`
	P99US        float64        `json:"p99_us"`
	P999US       float64        `json:"p999_us"`
	LateSends    int64          `json:"late_sends"`
}

func parseOpenloop(out string, cpu float64) (loadResult, error) {
	var o openloopReport
	if err := json.Unmarshal([]byte(out), &o); err != nil {
		return loadResult{}, fmt.Errorf("openloop output: %w\n%s", err, out)
	}
	l := loadResult{GenCPU: cpu, P999MS: o.P999US / 1000, LateSends: o.LateSends}
	l.Requests, l.RPS, l.SocketErrors = o.Completed, o.AchievedRate, o.Errors
	l.P50MS, l.P90MS, l.P99MS = o.P50US/1000, o.P90US/1000, o.P99US/1000
	for code, n := range o.Status {
		if !strings.HasPrefix(code, "2") && !strings.HasPrefix(code, "3") {
			l.Non2xx += int64(n)
		}
	}
	return l, nil
}

// loadResult is what a load generator reports, plus its own CPU seconds.
type loadResult struct {
	wrkResult
	P999MS    float64
	LateSends int64
	GenCPU    float64
}

// measure runs load once and records, around it, the CPU time of every
// process of the stack and of the whole machine, and Redis's command counts.
func (st *stack) measure(ctx context.Context, tg target, round int, limit time.Duration, load func(context.Context) (loadResult, error)) (sample, error) {
	for _, p := range st.all() {
		if p.exited() {
			return sample{}, fmt.Errorf("%s has exited: %s", p.name, tail(p.log, 20))
		}
	}
	before, err := st.cpuSnapshot()
	if err != nil {
		return sample{}, err
	}
	calls0, reads0, err := redisCalls(ctx, st.rdb)
	if err != nil {
		return sample{}, err
	}
	undecided0, err := st.undecided(tg.admin)
	if err != nil {
		return sample{}, err
	}
	// New connections NGINX (or wrk, direct) opens to the auth service and the app.
	authAccepts, appAccepts := countAccepts(tg.auth.pid()), countAccepts(st.app.pid())
	if authAccepts != nil {
		time.Sleep(100 * time.Millisecond) // perf attaches
	}
	busy0, _ := machineBusy()
	start := time.Now()

	lctx, cancel := context.WithTimeout(ctx, limit)
	lr, err := load(lctx)
	cancel()
	authN, appN := authAccepts.stop(), appAccepts.stop()
	if err != nil {
		return sample{}, err
	}

	wall := time.Since(start).Seconds()
	busy1, _ := machineBusy()
	after, err := st.cpuSnapshot()
	if err != nil {
		return sample{}, err
	}
	calls1, reads1, err := redisCalls(ctx, st.rdb)
	if err != nil {
		return sample{}, err
	}
	undecided1, err := st.undecided(tg.admin)
	if err != nil {
		return sample{}, err
	}

	s := sample{Target: tg.name, Round: round, WallS: wall, wrkResult: lr.wrkResult, P999MS: lr.P999MS,
		LateSends: lr.LateSends, Load1: loadAvg()[0], CPU: map[string]float64{}, RedisCalls: map[string]int64{},
		AuthAccepts: authN, AppAccepts: appN, AuthProc: tg.auth.name}
	if tg.nginx != nil {
		s.NginxProc = tg.nginx.name
	}
	ours := lr.GenCPU
	for k, v := range after {
		s.CPU[k] = round3(v - before[k])
		ours += v - before[k]
	}
	s.CPU["load"] = round3(lr.GenCPU)
	s.CPU["other"] = round3(max(busy1-busy0-ours, 0))
	var total int64
	for k, v := range calls1 {
		if d := v - calls0[k]; d > 0 {
			s.RedisCalls[k] = d
			total += d
		}
	}
	// Each snapshot's own INFO is one call; leave them out.
	if s.RedisCalls["info"] > 0 {
		s.RedisCalls["info"]--
		total--
	}
	if s.Requests > 0 {
		s.RedisPerRequest = float64(total) / float64(s.Requests)
		s.EvalshaPerRequest = float64(s.RedisCalls["evalsha"]+s.RedisCalls["eval"]) / float64(s.Requests)
		// The two INFO calls are two of the reads.
		s.RedisReadsPerRequest = float64(max(reads1-reads0-1, 0)) / float64(s.Requests)
	}
	if tg.name == "rategate" {
		s.Undecided = int64(undecided1 - undecided0)
	}
	return s, nil
}

// undecided reads rategate_failure_mode_decisions_total (every mode) from
// rategate's /metrics: requests answered by failure_mode because Redis did
// not answer within redis.timeout. A run with some flatters rategate.
func (st *stack) undecided(admin string) (float64, error) {
	if admin == "" {
		return 0, nil
	}
	c, err := net.DialTimeout("tcp", admin, time.Second)
	if err != nil {
		return 0, fmt.Errorf("rategate admin: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
	var body bytes.Buffer
	if _, err := body.ReadFrom(c); err != nil {
		return 0, fmt.Errorf("rategate /metrics: %w", err)
	}
	return sumMetric(body.String(), "rategate_failure_mode_decisions_total")
}

// sumMetric adds up every sample of a Prometheus text family.
func sumMetric(text, name string) (float64, error) {
	var sum float64
	found := false
	for _, line := range strings.Split(text, "\n") {
		rest, ok := strings.CutPrefix(line, name)
		if !ok || (rest != "" && rest[0] != '{' && rest[0] != ' ') {
			continue
		}
		f := strings.Fields(rest[strings.LastIndexByte(rest, '}')+1:])
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return 0, fmt.Errorf("metric %s: %q: %w", name, line, err)
		}
		sum += v
		found = true
	}
	if !found {
		return 0, fmt.Errorf("rategate /metrics has no %s", name)
	}
	return sum, nil
}

// cpuSnapshot reads the CPU seconds of each server, NGINX with its workers.
func (st *stack) cpuSnapshot() (map[string]float64, error) {
	m := map[string]float64{}
	for _, p := range st.all() {
		pids := []int{p.pid()}
		if strings.HasPrefix(p.name, "nginx") {
			pids = withChildren(p.pid())
		}
		for _, pid := range pids {
			c, err := cpuSeconds(pid)
			if err != nil {
				return nil, fmt.Errorf("cpu of %s (pid %d): %w", p.name, pid, err)
			}
			m[p.name] += c
		}
	}
	return m, nil
}

// redisCalls reads INFO commandstats and stats: calls per command, and the
// read events Redis processed (total_reads_processed: one per network read,
// however many pipelined commands it carried).
func redisCalls(ctx context.Context, rdb *redis.Client) (map[string]int64, int64, error) {
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	text, err := rdb.Info(c, "commandstats", "stats").Result()
	if err != nil {
		return nil, 0, fmt.Errorf("redis INFO commandstats stats: %w", err)
	}
	return parseCommandStats(text), parseInfoInt(text, "total_reads_processed"), nil
}

// parseInfoInt returns the integer field name of an INFO text, 0 if absent.
func parseInfoInt(text, name string) int64 {
	for line := range strings.Lines(text) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// parseCommandStats turns "cmdstat_evalsha:calls=12,usec=..." lines into
// {"evalsha": 12}.
func parseCommandStats(text string) map[string]int64 {
	m := map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		for _, kv := range strings.Split(rest, ",") {
			if v, ok := strings.CutPrefix(kv, "calls="); ok {
				n, err := strconv.ParseInt(v, 10, 64)
				if err == nil {
					m[strings.TrimPrefix(name, "cmdstat_")] = n
				}
			}
		}
	}
	return m
}

// waitRedis waits until Redis answers PING.
func waitRedis(ctx context.Context, rdb *redis.Client, p *proc) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, cancel := context.WithTimeout(ctx, time.Second)
		err := rdb.Ping(c).Err()
		cancel()
		if err == nil {
			return nil
		}
		if p.exited() || time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("redis-server not ready: %v\n%s", err, tail(p.log, 20))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// runTimed runs a load generator to completion and returns its stdout and
// the CPU seconds it used (its rusage).
func runTimed(ctx context.Context, name string, args ...string) (string, float64, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 3 * time.Second
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), 0, fmt.Errorf("%s: %w\n%s%s", name, err, out.String(), errb.String())
	}
	cpu := (cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime()).Seconds()
	return out.String(), cpu, nil
}

// httpDo does one GET with headers, without keep-alive, and returns the
// status and the response headers (names lower-cased).
func httpDo(addr, path string, headers map[string]string) (int, map[string]string, error) {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0, nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(2 * time.Second))
	var b strings.Builder
	fmt.Fprintf(&b, "GET %s HTTP/1.1\r\nHost: bench.local\r\nConnection: close\r\n", path)
	for k, v := range headers {
		fmt.Fprintf(&b, "%s: %s\r\n", k, v)
	}
	b.WriteString("\r\n")
	if _, err := c.Write([]byte(b.String())); err != nil {
		return 0, nil, err
	}
	br := bufio.NewReader(c)
	line, err := br.ReadString('\n')
	if err != nil {
		return 0, nil, err
	}
	f := strings.Fields(line)
	if len(f) < 2 {
		return 0, nil, fmt.Errorf("bad status line %q", line)
	}
	status, err := strconv.Atoi(f[1])
	if err != nil {
		return 0, nil, err
	}
	hdr := map[string]string{}
	for {
		l, err := br.ReadString('\n')
		l = strings.TrimRight(l, "\r\n")
		if err != nil || l == "" {
			break
		}
		if k, v, ok := strings.Cut(l, ":"); ok {
			hdr[strings.ToLower(strings.TrimSpace(k))] = strings.TrimSpace(v)
		}
	}
	return status, hdr, nil
}

// logSummary counts what went wrong inside the servers while the bench ran.
func (st *stack) logSummary() logInfo {
	var li logInfo
	sample := func(who, line string) {
		if len(li.Samples) < 8 {
			li.Samples = append(li.Samples, who+": "+line)
		}
	}
	for _, p := range []*proc{st.rategate, st.rategateQuiet} {
		b, err := os.ReadFile(p.log)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(b), "\n") {
			if strings.Contains(line, `"level":"warn"`) || strings.Contains(line, `"level":"error"`) {
				li.RategateWarnings++
				if li.RategateWarnings <= 3 {
					sample(p.name, line)
				}
			}
		}
	}
	count := func(p string) (n, limited int) {
		b, err := os.ReadFile(p)
		if err != nil {
			return 0, 0
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line == "" {
				continue
			}
			n++
			if strings.Contains(line, "auth request unexpected status: 429") {
				limited++
			} else if n-limited <= 3 {
				sample(filepath.Base(filepath.Dir(filepath.Dir(p))), line)
			}
		}
		return n, limited
	}
	li.NginxRategateErrorLines, li.NginxRategateDenialLines = count(filepath.Join(st.work, "nginx-rategate", "logs", "error.log"))
	li.NginxFloorErrorLines, _ = count(filepath.Join(st.work, "nginx-floor", "logs", "error.log"))
	for _, d := range []string{"nginx-rategate-quiet", "nginx-floor-quiet"} {
		n, _ := count(filepath.Join(st.work, d, "logs", "error.log"))
		li.NginxQuietErrorLines += n
	}
	return li
}

func round3(v float64) float64 { return float64(int64(v*1000+0.5)) / 1000 }

// saveProfile fetches a CPU profile of rategate, as long as the run minus
// its first second, into <profileDir>/<scenario>.pprof (go tool pprof -top
// reads it without the binary).
func (st *stack) saveProfile(ctx context.Context, admin, scenario string, run time.Duration) error {
	secs := max(int((run-time.Second)/time.Second), 1)
	dir := st.profileDir
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	c, cancel := context.WithTimeout(ctx, run+10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(c, "GET", fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", admin, secs), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET /debug/pprof/profile: %s", resp.Status)
	}
	out := filepath.Join(dir, scenario+".pprof")
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	fmt.Println("  profile of rategate's round-1 run: " + out)
	return nil
}
