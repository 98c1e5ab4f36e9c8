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
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/rategate/rategate/internal/procs"
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

	// hot-key: rategate on bench/policy-hotkey.yaml, and on its lease
	// variant (nil with BENCH_LEASE=0).
	rategateHot, rategateLease                           *proc
	rgHotAddr, adminHotAddr, rgLeaseAddr, adminLeaseAddr string

	// bench/minimal on the vs-minimal rule (direct, and behind its own copy
	// of nginx.conf) and on the hot-key rule.
	minimal, minimalHot, ngMin     *proc
	minAddr, minHotAddr, ngMinAddr string

	// ceilingSHA is rategate's script as loaded for redis-benchmark;
	// ceilingRate its last measured calls per second (sizes the next run).
	ceilingSHA  string
	ceilingRate float64

	rdb *redis.Client
}

// stackOptions are the knobs that change what runs.
type stackOptions struct {
	keepalive int  // BENCH_NGINX_KEEPALIVE
	pprof     bool // BENCH_PPROF
	lease     bool // BENCH_LEASE
}

// The minimal limiter's rules. check() holds each to its rategate twin:
// both must announce the same RateLimit-Policy.
var (
	// minimalSW is bench/policy.yaml's sw-per-user.
	minimalSW = []string{"-name", "sw-per-user", "-algorithm", "sliding_window", "-limit", "1000", "-period", "1m", "-key", "user", "-prefix", "minbench:sw"}
	// minimalHot is bench/policy-hotkey.yaml's hot-global.
	minimalHot = []string{"-name", "hot-global", "-algorithm", "fixed_window", "-limit", "1000000000", "-period", "1m", "-key", "global", "-prefix", "minbench:hot"}
)

// startStack starts everything, checks that each path answers as expected,
// and returns the running stack. On error what was started is left to
// ps.stopAll.
func startStack(ctx context.Context, ps *procSet, work, bin, repo string, opt stackOptions) (*stack, error) {
	st := &stack{ps: ps, work: work, bin: bin}
	var err error
	if st.script, err = filepath.Abs(filepath.Join(repo, "bench", "wrk", "users.lua")); err != nil {
		return nil, err
	}
	if st.policy, err = filepath.Abs(filepath.Join(repo, "bench", "policy.yaml")); err != nil {
		return nil, err
	}
	hotPolicy, err := filepath.Abs(filepath.Join(repo, "bench", "policy-hotkey.yaml"))
	if err != nil {
		return nil, err
	}
	logs := filepath.Join(work, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, err
	}
	// Each port was free a moment ago; the kernel may hand the same one
	// out again once its probe closed, so a port already given to another
	// server is picked again.
	given := map[int]bool{}
	addr := func() (string, error) {
		for {
			p, err := procs.FreePort()
			if err != nil {
				return "", err
			}
			if !given[p] {
				given[p] = true
				return "127.0.0.1:" + strconv.Itoa(p), nil
			}
		}
	}
	for _, a := range []*string{&st.redisAddr, &st.rgAddr, &st.floorAddr, &st.appAddr, &st.ngRGAddr, &st.ngFloorAddr,
		&st.adminAddr, &st.rgQuietAddr, &st.adminQuietAddr, &st.ngRGQuietAddr, &st.ngFloorQuietAddr,
		&st.rgHotAddr, &st.adminHotAddr, &st.rgLeaseAddr, &st.adminLeaseAddr, &st.minAddr, &st.minHotAddr, &st.ngMinAddr} {
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
	var extra []string
	if opt.pprof {
		extra = append(extra, "-pprof")
		st.pprof = true
	}
	type rg struct {
		name, policy, listen, admin string
		dst                         **proc
	}
	rgs := []rg{
		{"rategate", st.policy, st.rgAddr, st.adminAddr, &st.rategate},
		{"rategate-quiet", quietPolicy, st.rgQuietAddr, st.adminQuietAddr, &st.rategateQuiet},
		{"rategate-hot", hotPolicy, st.rgHotAddr, st.adminHotAddr, &st.rategateHot},
	}
	if opt.lease {
		leasePolicy, err := writeLeasePolicy(hotPolicy, filepath.Join(work, "policy-hotkey-lease.yaml"))
		if err != nil {
			return nil, err
		}
		rgs = append(rgs, rg{"rategate-lease", leasePolicy, st.rgLeaseAddr, st.adminLeaseAddr, &st.rategateLease})
	}
	for _, r := range rgs {
		if *r.dst, err = ps.start(r.name, filepath.Join(logs, r.name+".log"), filepath.Join(bin, "rategate"),
			append([]string{"-config", r.policy, "-redis", "redis://" + st.redisAddr + "/0",
				"-listen", r.listen, "-admin-listen", r.admin}, extra...)...); err != nil {
			return nil, err
		}
	}
	// The minimal limiter has the same Redis budget as rategate's policy.
	for _, m := range []struct {
		name, listen string
		rule         []string
		dst          **proc
	}{{"minimal", st.minAddr, minimalSW, &st.minimal}, {"minimal-hot", st.minHotAddr, minimalHot, &st.minimalHot}} {
		if *m.dst, err = ps.start(m.name, filepath.Join(logs, m.name+".log"), filepath.Join(bin, "minimal"),
			append([]string{"-listen", m.listen, "-redis", st.redisAddr, "-timeout", "200ms", "-pipelines", "4"}, m.rule...)...); err != nil {
			return nil, err
		}
	}
	waits := []struct {
		p          *proc
		addr, path string
		want       int
	}{{st.floor, st.floorAddr, "/", 204}, {st.app, st.appAddr, "/", 204},
		{st.rategate, st.rgAddr, "/readyz", 200}, {st.rategateQuiet, st.rgQuietAddr, "/readyz", 200},
		{st.rategateHot, st.rgHotAddr, "/readyz", 200},
		{st.minimal, st.minAddr, "/metrics", 200}, {st.minimalHot, st.minHotAddr, "/metrics", 200}}
	if st.rategateLease != nil {
		waits = append(waits, struct {
			p          *proc
			addr, path string
			want       int
		}{st.rategateLease, st.rgLeaseAddr, "/readyz", 200})
	}
	for _, w := range waits {
		if err := waitHTTP(w.p, w.addr, w.path, w.want, 10*time.Second); err != nil {
			if w.p == st.rategateLease {
				err = fmt.Errorf("rategate-lease: rategate does not take the hot-key rule with lease: true (%w; BENCH_LEASE=0 leaves the arm out)", err)
			}
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
		{"nginx-minimal", st.minAddr, st.ngMinAddr, "nginx.conf", &st.ngMin},
		{"nginx-rategate-quiet", st.rgQuietAddr, st.ngRGQuietAddr, "nginx-quiet.conf", &st.ngRGQuiet},
		{"nginx-floor-quiet", st.floorAddr, st.ngFloorQuietAddr, "nginx-quiet.conf", &st.ngFloorQuiet},
	} {
		prefix := filepath.Join(work, n.name)
		_, lport, _ := net.SplitHostPort(n.listen)
		port, _ := strconv.Atoi(lport)
		if err := copyNginxDir(filepath.Join(repo, "nginx"), prefix, nginxRewrite{listen: port, auth: n.auth, app: st.appAddr, keepalive: opt.keepalive}); err != nil {
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
	return rewritePolicy(src, dst, "\nfailure_mode: allow\n", "deny_status: 403\n")
}

// writeLeasePolicy writes the hot-key policy with lease: true on its rule,
// for the rategate-lease arm, and returns its path.
func writeLeasePolicy(src, dst string) (string, error) {
	return rewritePolicy(src, dst, "\n    algorithm: fixed_window\n", "    lease: true\n")
}

// rewritePolicy copies src to dst with line inserted after the one anchor
// line, which must be there.
func rewritePolicy(src, dst, anchor, line string) (string, error) {
	b, err := os.ReadFile(src)
	if err != nil {
		return "", err
	}
	if bytes.Count(b, []byte(anchor)) != 1 {
		return "", fmt.Errorf("%s has not exactly one %q line: update bench/runner/stack.go", src, strings.TrimSpace(anchor))
	}
	b = bytes.Replace(b, []byte(anchor), []byte(anchor+line), 1)
	return dst, os.WriteFile(dst, b, 0o644)
}

// check makes sure each path is what the numbers will claim: NGINX asks
// rategate or the minimal limiter (rate-limit headers come back) or the
// floor (none), the app is reached, /auth decides directly, each prefix
// meets the rules named for it, and the minimal limiter runs the same
// rules as its rategate twin.
func (st *stack) check() error {
	user := map[string]string{"X-User": "check-user"}
	for _, ng := range []struct{ what, addr string }{{"NGINX", st.ngRGAddr}, {"NGINX (quiet)", st.ngRGQuietAddr}, {"NGINX (minimal)", st.ngMinAddr}} {
		status, hdr, err := httpDo(ng.addr, "/sw/items/1", user)
		if err != nil || status != 204 || hdr["x-ratelimit-limit"] == "" {
			return fmt.Errorf("%s -> auth -> app: status %d, X-RateLimit-Limit %q, err %v (want 204 with the header)", ng.what, status, hdr["x-ratelimit-limit"], err)
		}
	}
	for _, ng := range []struct{ what, addr string }{{"NGINX", st.ngFloorAddr}, {"NGINX (quiet)", st.ngFloorQuietAddr}} {
		status, hdr, err := httpDo(ng.addr, "/api/items/1", user)
		if err != nil || status != 204 || hdr["x-ratelimit-limit"] != "" {
			return fmt.Errorf("%s -> floor -> app: status %d, X-RateLimit-Limit %q, err %v (want 204 without the header)", ng.what, status, hdr["x-ratelimit-limit"], err)
		}
	}
	// policy returns the RateLimit-Policy of an allowed /auth, and the
	// names of every header that came with it.
	policy := func(addr, path string) (string, string, error) {
		status, hdr, err := httpDo(addr, "/auth", map[string]string{
			"X-Original-URI": path, "X-Real-IP": "127.0.0.1", "X-User-Id": "check-user",
		})
		if err != nil || status != 204 || hdr["ratelimit-policy"] == "" {
			return "", "", fmt.Errorf("%s /auth %s: status %d, RateLimit-Policy %q, err %v (want 204 with the header)", addr, path, status, hdr["ratelimit-policy"], err)
		}
		var names []string
		for k := range hdr {
			names = append(names, k)
		}
		slices.Sort(names)
		return hdr["ratelimit-policy"], strings.Join(names, " "), nil
	}
	for _, c := range []struct {
		what, addr, path string
		want             string // the rules named in RateLimit-Policy
		twin             string // the minimal limiter that must announce the same policy
	}{
		{"rategate", st.rgAddr, "/api/items/1", `"api-per-user"`, ""},
		{"rategate", st.rgAddr, "/sw/items/1", `"sw-per-user"`, st.minAddr},
		{"rategate", st.rgAddr, "/swm/items/1", `"swm-user" "swm-route" "swm-global"`, ""},
		{"rategate-hot", st.rgHotAddr, "/hot/items/1", `"hot-global"`, st.minHotAddr},
		{"rategate-lease", st.rgLeaseAddr, "/hot/items/1", `"hot-global"`, ""},
	} {
		if c.what == "rategate-lease" && st.rategateLease == nil {
			continue
		}
		got, names, err := policy(c.addr, c.path)
		if err != nil {
			return fmt.Errorf("%s: %w", c.what, err)
		}
		for _, name := range strings.Fields(c.want) {
			if !strings.Contains(got, name+";") {
				return fmt.Errorf("%s /auth %s: RateLimit-Policy %q does not name %s: bench/policy*.yaml and the scenarios disagree", c.what, c.path, got, name)
			}
		}
		if c.twin != "" {
			twin, twinNames, err := policy(c.twin, c.path)
			if err != nil {
				return fmt.Errorf("minimal: %w", err)
			}
			if twin != got {
				return fmt.Errorf("the minimal limiter announces %q, rategate %q for %s: make bench/runner's minimal rule match the policy", twin, got, c.path)
			}
			if twinNames != names {
				return fmt.Errorf("for %s the minimal limiter answers with the headers %q, rategate with %q: NGINX would not copy the same", c.path, twinNames, names)
			}
		}
	}
	return nil
}

// describe says what runs where, for the results.
func (st *stack) describe() stackInfo {
	return stackInfo{
		Summary: fmt.Sprintf("stack: redis %s · rategate %s (quiet: %s, hot-key: %s) · minimal %s (hot-key: %s) · floor %s · app (floor binary) %s · "+
			"NGINX→rategate %s · NGINX→minimal %s · NGINX→floor %s · quiet NGINX→rategate %s, →floor %s",
			st.redisAddr, st.rgAddr, st.rgQuietAddr, st.rgHotAddr, st.minAddr, st.minHotAddr, st.floorAddr, st.appAddr,
			st.ngRGAddr, st.ngMinAddr, st.ngFloorAddr, st.ngRGQuietAddr, st.ngFloorQuietAddr),
		App: "the floor server (204, no body) on its own port, behind every NGINX copy",
		NGINX: "copies of nginx/ (nginx.conf, or nginx-quiet.conf for attack-quiet, with their includes) with only the listen, " +
			"auth and app addresses rewritten and worker_processes 1; access_log and error_log as shipped",
		Minimal: "bench/minimal: fasthttp + go-redis, one Lua script per algorithm, 4 pipeline runners, a 200ms deadline per request; " +
			"its rule: " + strings.Join(minimalSW, " ") + " (hot-key: " + strings.Join(minimalHot, " ") + ")",
	}
}

// target is where one arm's runs go.
type target struct {
	name  string // the arm: floor, rategate, minimal, ...
	via   string // "nginx" or "direct"
	url   string
	auth  *proc // nil for redis-benchmark's ceiling runs
	nginx *proc // nil when direct
	// admin is rategate's admin listener (pprof); "" otherwise.
	admin string
	// undecidedAddr serves undecidedMetric: the requests answered without
	// a decision ("" for the floor).
	undecidedAddr, undecidedMetric string
}

// target resolves arm a of a scenario run via via (quiet: nginx-quiet.conf).
func (st *stack) target(a arm, via string, quiet bool) (target, error) {
	t := target{name: a.Name, via: via}
	if quiet && a.Auth != "floor" && a.Auth != "rategate" {
		return t, fmt.Errorf("arm %s: no quiet variant", a.Name)
	}
	if via != "nginx" && via != "direct" {
		return t, fmt.Errorf("arm %s: via %q", a.Name, via)
	}
	rg := func(p *proc, addr, admin string) {
		t.auth, t.url, t.admin, t.undecidedAddr, t.undecidedMetric = p, "http://"+addr, admin, admin, "rategate_failure_mode_decisions_total"
	}
	mini := func(p *proc, addr string) {
		t.auth, t.url, t.undecidedAddr, t.undecidedMetric = p, "http://"+addr, addr, "minimal_undecided_total"
	}
	nginx := func(p *proc, addr string) { t.nginx, t.url = p, "http://"+addr }
	switch a.Auth {
	case "floor":
		t.auth, t.url = st.floor, "http://"+st.floorAddr
		if via == "nginx" && quiet {
			nginx(st.ngFloorQuiet, st.ngFloorQuietAddr)
		} else if via == "nginx" {
			nginx(st.ngFloor, st.ngFloorAddr)
		}
	case "rategate":
		if quiet {
			rg(st.rategateQuiet, st.rgQuietAddr, st.adminQuietAddr)
		} else {
			rg(st.rategate, st.rgAddr, st.adminAddr)
		}
		if via == "nginx" && quiet {
			nginx(st.ngRGQuiet, st.ngRGQuietAddr)
		} else if via == "nginx" {
			nginx(st.ngRG, st.ngRGAddr)
		}
	case "minimal":
		mini(st.minimal, st.minAddr)
		if via == "nginx" {
			nginx(st.ngMin, st.ngMinAddr)
		}
	case "rategate-hot", "rategate-lease", "minimal-hot":
		if via != "direct" {
			return t, fmt.Errorf("arm %s: %s is asked directly only", a.Name, a.Auth)
		}
		switch a.Auth {
		case "rategate-hot":
			rg(st.rategateHot, st.rgHotAddr, st.adminHotAddr)
		case "rategate-lease":
			if st.rategateLease == nil {
				return t, fmt.Errorf("arm %s needs the lease arm on (BENCH_LEASE=1, the default)", a.Name)
			}
			rg(st.rategateLease, st.rgLeaseAddr, st.adminLeaseAddr)
		default:
			mini(st.minimalHot, st.minHotAddr)
		}
	default:
		return t, fmt.Errorf("arm %s: unknown auth service %q", a.Name, a.Auth)
	}
	return t, nil
}

// all is every long-running server of the stack.
func (st *stack) all() []*proc {
	var ps []*proc
	for _, p := range []*proc{st.redis, st.rategate, st.rategateQuiet, st.rategateHot, st.rategateLease, st.minimal, st.minimalHot,
		st.floor, st.app, st.ngRG, st.ngFloor, st.ngMin, st.ngRGQuiet, st.ngFloorQuiet} {
		if p != nil {
			ps = append(ps, p)
		}
	}
	return ps
}

// runScenario alternates the runs of sc's arms, round after round (floor,
// rategate, minimal, floor, rategate, minimal, ...), and, for hot-key,
// redis-benchmark's ceiling after each round.
func (st *stack) runScenario(ctx context.Context, cfg settings, sc scenario) (scenarioResult, error) {
	r := scenarioResult{scenario: sc}
	arms := sc.arms(cfg.Lease)
	runs := make([][]sample, len(arms))
	fmt.Printf("\n%s — %s\n", sc.Name, sc.Description)
	for round := 1; round <= cfg.Rounds; round++ {
		for i, a := range arms {
			tg, err := st.target(a, sc.Via, sc.Quiet)
			if err != nil {
				return r, fmt.Errorf("%s: %w", sc.Name, err)
			}
			prefix := sc.prefix(a)
			load := func(ctx context.Context) (loadResult, error) {
				conns := cfg.Connections
				if sc.Connections > 0 {
					conns = sc.Connections
				}
				out, cpu, err := runTimed(ctx, "wrk", wrkArgs(cfg.Threads, max(conns, cfg.Threads), cfg.Duration, st.script, tg.url, sc.Via, prefix, sc.Users)...)
				if err != nil {
					return loadResult{}, err
				}
				w, err := parseWrk(out)
				return loadResult{wrkResult: w, GenCPU: cpu}, err
			}
			var profiled chan error
			if st.pprof && round == 1 && tg.admin != "" {
				name := sc.Name
				if a.Name != "rategate" {
					name += "-" + a.Name
				}
				profiled = make(chan error, 1)
				go func() { profiled <- st.saveProfile(ctx, tg.admin, name, cfg.Duration) }()
			}
			s, err := st.measure(ctx, tg, round, cfg.Duration+30*time.Second, load)
			if profiled != nil {
				if perr := <-profiled; perr != nil {
					fmt.Println("  (no profile: " + perr.Error() + ")")
				}
			}
			if err != nil {
				return r, fmt.Errorf("%s, %s, round %d: %w", sc.Name, a.Name, round, err)
			}
			fmt.Println("  " + s.line())
			runs[i] = append(runs[i], s)
		}
		if sc.Ceiling {
			s, err := st.runCeiling(ctx, cfg, round)
			if err != nil {
				return r, fmt.Errorf("%s, ceiling, round %d: %w", sc.Name, round, err)
			}
			fmt.Println("  " + s.line())
			r.Ceiling = append(r.Ceiling, s)
		}
	}
	r.setArms(arms, runs)
	r.summarize()
	fmt.Printf("  => rategate/floor %.2f (median req/s %.0f / %.0f)", r.Ratio, r.RategateMedian.RPS, r.FloorMedian.RPS)
	for _, o := range r.Others {
		fmt.Printf("; %s/floor %.2f (%.0f)", o.Name, o.Ratio, o.Median.RPS)
	}
	fmt.Println()
	return r, nil
}

// ceilingKey is the one key redis-benchmark's ceiling runs hit.
const ceilingKey = "rgbench-ceiling:{hot-global:}:fw2"

// runCeiling measures Redis's own single-key ceiling: redis-benchmark
// sending EVALSHA of rategate's decide script, one fixed_window check of
// the hot-key rule on one key, from BENCH_CONNECTIONS clients pipelining 16
// calls each, about as long as one run.
func (st *stack) runCeiling(ctx context.Context, cfg settings, round int) (sample, error) {
	if st.ceilingSHA == "" {
		sha, err := loadCeilingScript(ctx, st.rdb)
		if err != nil {
			return sample{}, err
		}
		st.ceilingSHA = sha
	}
	host, port, _ := net.SplitHostPort(st.redisAddr)
	args := func(n int) []string {
		return append([]string{"-h", host, "-p", port, "-c", strconv.Itoa(cfg.Connections), "-P", "16", "-n", strconv.Itoa(n), "--csv"},
			ceilingCommand(st.ceilingSHA)...)
	}
	if st.ceilingRate == 0 { // a short calibration, not measured
		out, _, err := runTimed(ctx, "redis-benchmark", args(20000)...)
		if err != nil {
			return sample{}, err
		}
		w, err := parseRedisBenchmark(out, 20000)
		if err != nil {
			return sample{}, err
		}
		st.ceilingRate = w.RPS
	}
	n := max(int(st.ceilingRate*cfg.Duration.Seconds()), 10000)
	tg := target{name: "ceiling", via: "direct"}
	s, err := st.measure(ctx, tg, round, 3*cfg.Duration+30*time.Second, func(ctx context.Context) (loadResult, error) {
		out, cpu, err := runTimed(ctx, "redis-benchmark", args(n)...)
		if err != nil {
			return loadResult{}, err
		}
		w, err := parseRedisBenchmark(out, int64(n))
		return loadResult{wrkResult: w, GenCPU: cpu}, err
	})
	if err != nil {
		return s, err
	}
	// redis-benchmark counts error replies as answers: a ceiling of
	// failed calls would be no ceiling.
	if s.RedisFailed > 0 || s.RedisCalls["evalsha"] < int64(n) {
		return s, fmt.Errorf("redis-benchmark: %d EVALSHA calls of %d, %d failed", s.RedisCalls["evalsha"], n, s.RedisFailed)
	}
	st.ceilingRate = s.RPS
	return s, nil
}

// runLatency is the fixed-rate check: floor and rategate through NGINX at
// the same rate, half of rategate's median maximum in mostly-allowed.
func (st *stack) runLatency(ctx context.Context, cfg settings, done []scenarioResult) (*latencyResult, error) {
	var rate float64
	for _, r := range done {
		if r.Name == "mostly-allowed" || (r.Name == "vs-minimal" && rate == 0) {
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
		return nil, fmt.Errorf("latency needs mostly-allowed (or vs-minimal) in BENCH_SCENARIOS (its rate is half of rategate's maximum there), or BENCH_RATE")
	}
	rate = float64(int(rate/100) * 100) // a round number
	lr := &latencyResult{Rate: rate}
	fmt.Printf("\n%s — p99 at %.0f req/s (half of rategate's maximum), open loop (bench/openloop), through NGINX\n", latencyScenario, rate)
	for round := 1; round <= cfg.Rounds; round++ {
		for _, a := range defaultArms {
			name := a.Name
			tg, err := st.target(a, "nginx", false)
			if err != nil {
				return nil, err
			}
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
	fmt.Printf("  => p99 medians rategate %.2f ms, floor %.2f ms; median of the rounds' differences %+.2f ms %v\n",
		lr.RategateMedian.P99MS, lr.FloorMedian.P99MS, lr.DeltaP99MS, lr.RoundDeltas)
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
// process of the stack and of the whole machine, and what Redis executed
// (INFO commandstats and stats, reset with CONFIG RESETSTAT just before).
func (st *stack) measure(ctx context.Context, tg target, round int, limit time.Duration, load func(context.Context) (loadResult, error)) (sample, error) {
	for _, p := range st.all() {
		if p.exited() {
			return sample{}, fmt.Errorf("%s has exited: %s", p.name, tail(p.log, 20))
		}
	}
	undecided0, err := undecided(tg)
	if err != nil {
		return sample{}, err
	}
	// New connections NGINX (or wrk, direct) opens to the auth service and the app.
	var authAccepts, appAccepts *acceptCounter
	if tg.auth != nil {
		authAccepts, appAccepts = countAccepts(tg.auth.pid()), countAccepts(st.app.pid())
		if authAccepts != nil {
			time.Sleep(100 * time.Millisecond) // perf attaches
		}
	}
	rc, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = st.rdb.ConfigResetStat(rc).Err()
	cancel()
	if err != nil {
		return sample{}, fmt.Errorf("redis CONFIG RESETSTAT: %w", err)
	}
	before, err := st.cpuSnapshot()
	if err != nil {
		return sample{}, err
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
	rs, err := readRedisStats(ctx, st.rdb)
	if err != nil {
		return sample{}, err
	}
	undecided1, err := undecided(tg)
	if err != nil {
		return sample{}, err
	}

	s := sample{Target: tg.name, Round: round, WallS: wall, wrkResult: lr.wrkResult, P999MS: lr.P999MS,
		LateSends: lr.LateSends, Load1: loadAvg()[0], CPU: map[string]float64{},
		AuthAccepts: authN, AppAccepts: appN, AuthProc: "none"}
	if tg.auth != nil {
		s.AuthProc = tg.auth.name
	}
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
	s.setRedis(rs)
	s.Undecided = int64(undecided1 - undecided0)
	return s, nil
}

// undecided reads how many requests the auth service answered without a
// decision: rategate's rategate_failure_mode_decisions_total (every mode;
// from its admin listener), the minimal limiter's minimal_undecided_total.
// Redis did not answer within the deadline: a run with some flatters it.
func undecided(tg target) (float64, error) {
	if tg.undecidedAddr == "" {
		return 0, nil
	}
	c, err := net.DialTimeout("tcp", tg.undecidedAddr, time.Second)
	if err != nil {
		return 0, fmt.Errorf("%s /metrics: %w", tg.name, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")
	var body bytes.Buffer
	if _, err := body.ReadFrom(c); err != nil {
		return 0, fmt.Errorf("%s /metrics: %w", tg.name, err)
	}
	return sumMetric(body.String(), tg.undecidedMetric)
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

// redisStats is what INFO commandstats and stats say since the last CONFIG
// RESETSTAT.
type redisStats struct {
	// Calls, USec and Failed are calls, microseconds and failed calls per
	// command ("evalsha", "hmget", "config|resetstat", ...).
	Calls, USec, Failed map[string]int64
	// Reads is total_reads_processed: one per network read, however many
	// pipelined commands it carried.
	Reads int64
}

func redisStatsOf(text string) redisStats {
	calls, usec, failed := parseCommandStats(text)
	return redisStats{Calls: calls, USec: usec, Failed: failed, Reads: parseInfoInt(text, "total_reads_processed")}
}

// readRedisStats reads INFO commandstats and stats.
func readRedisStats(ctx context.Context, rdb *redis.Client) (redisStats, error) {
	c, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	text, err := rdb.Info(c, "commandstats", "stats").Result()
	if err != nil {
		return redisStats{}, fmt.Errorf("redis INFO commandstats stats: %w", err)
	}
	return redisStatsOf(text), nil
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

// parseCommandStats turns "cmdstat_evalsha:calls=12,usec=340,...,failed_calls=1"
// lines into {"evalsha": 12}, {"evalsha": 340} and {"evalsha": 1}.
func parseCommandStats(text string) (calls, usec, failed map[string]int64) {
	calls, usec, failed = map[string]int64{}, map[string]int64{}, map[string]int64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		name, rest, ok := strings.Cut(line, ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		name = strings.TrimPrefix(name, "cmdstat_")
		for _, kv := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil {
				continue
			}
			switch k {
			case "calls":
				calls[name] = n
			case "usec":
				usec[name] = n
			case "failed_calls":
				if n > 0 {
					failed[name] = n
				}
			}
		}
	}
	return calls, usec, failed
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
	for _, p := range []*proc{st.rategate, st.rategateQuiet, st.rategateHot, st.rategateLease} {
		if p == nil {
			continue
		}
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
	li.NginxMinimalErrorLines, _ = count(filepath.Join(st.work, "nginx-minimal", "logs", "error.log"))
	// The minimal limiter writes only when something is wrong.
	for _, p := range []*proc{st.minimal, st.minimalHot} {
		if p == nil {
			continue
		}
		if b, err := os.ReadFile(p.log); err == nil {
			for _, line := range strings.Split(strings.TrimSpace(string(b)), "\n") {
				if line != "" {
					li.MinimalLines++
					if li.MinimalLines <= 3 {
						sample(p.name, line)
					}
				}
			}
		}
	}
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
