// Command runner is the load benchmark behind `make bench` (bench/run.sh
// builds it and the binaries it needs, then runs it).
//
// It starts, on free loopback ports: redis-server; rategate with
// bench/policy.yaml and that Redis (and more rategates: deny_status 403 for
// attack-quiet, bench/policy-hotkey.yaml for hot-key, and its lease variant
// unless BENCH_LEASE=0); bench/minimal, the minimal limiter rategate is compared
// with, twice (the vs-minimal rule and the hot-key rule); the floor server
// (bench/floor, a do-nothing fasthttp server answering 204) twice, once as
// the floor's auth service and once as the application; and copies of the
// shipped nginx/nginx.conf with one worker process, asking rategate, the
// floor server or bench/minimal, all proxying allowed requests to the same
// application. For each scenario it alternates runs of its arms (floor,
// rategate, minimal, ...), reads the CPU time of every process from /proc
// and Redis's INFO commandstats (reset with CONFIG RESETSTAT before each
// run), and prints the medians, their paired ratios and the targets. It
// writes everything as JSON to bench/results/<time>.json and the tables to
// bench/results/latest.md.
//
// Environment knobs: BENCH_DURATION (per run, default 3s), BENCH_ROUNDS
// (alternations, default 4), BENCH_CONNECTIONS (default 50), BENCH_THREADS
// (wrk threads, default 2), BENCH_USERS (default 10000), BENCH_SCENARIOS
// (comma-separated names, default all; see scenarios), BENCH_RATE (the
// latency check's rate), BENCH_NGINX_KEEPALIVE (an experiment: the
// upstreams' keepalive instead of the shipped one), BENCH_PPROF=1 (CPU
// profiles of rategate's first run of each scenario, in
// bench/results/profiles-<time>/), BENCH_LEASE=0 (no hot-key lease arm).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// scenario is one workload, run against each of its arms in turn.
type scenario struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Via is "nginx" (wrk -> NGINX -> auth_request) or "direct" (wrk -> /auth).
	Via    string `json:"via"`
	Prefix string `json:"prefix"`
	// Users is the number of identities; 0 means BENCH_USERS.
	Users int `json:"users"`
	// Connections is wrk's connections; 0 means BENCH_CONNECTIONS.
	Connections int `json:"connections,omitempty"`
	// Target is the ratio rategate/floor to reach, 0 for none.
	Target float64 `json:"target,omitempty"`
	// Quiet runs through nginx/nginx-quiet.conf, with rategate on
	// deny_status 403.
	Quiet bool `json:"quiet,omitempty"`
	// Arms are the auth services a round runs, in this order; nil means
	// floor, rategate. The first is the floor the others are divided by.
	Arms []arm `json:"arms,omitempty"`
	// Ceiling adds, to each round, redis-benchmark running rategate's
	// script on one key (Redis's own single-key ceiling; hot-key).
	Ceiling bool `json:"ceiling,omitempty"`
}

// arm is one side of a scenario.
type arm struct {
	// Name is what the results call it: floor, rategate, minimal,
	// rategate-1rule, rategate-lease.
	Name string `json:"name"`
	// Auth is the process asked: floor, rategate, rategate-hot,
	// rategate-lease, minimal, minimal-hot (stack.target).
	Auth string `json:"auth"`
	// Prefix, when set, replaces the scenario's.
	Prefix string `json:"prefix,omitempty"`
	// Lease arms run unless BENCH_LEASE=0.
	Lease bool `json:"lease,omitempty"`
}

var (
	floorArm    = arm{Name: "floor", Auth: "floor"}
	rategateArm = arm{Name: "rategate", Auth: "rategate"}
	minimalArm  = arm{Name: "minimal", Auth: "minimal"}
	defaultArms = []arm{floorArm, rategateArm}
)

// arms returns the arms the scenario runs with these settings.
func (sc scenario) arms(lease bool) []arm {
	if sc.Arms == nil {
		return defaultArms
	}
	var a []arm
	for _, x := range sc.Arms {
		if !x.Lease || lease {
			a = append(a, x)
		}
	}
	return a
}

// prefix is the path prefix an arm's requests use.
func (sc scenario) prefix(a arm) string {
	if a.Prefix != "" {
		return a.Prefix
	}
	return sc.Prefix
}

// scenarios are the workloads, in order. The rules each prefix hits are in
// bench/policy.yaml (hot-key: bench/policy-hotkey.yaml). "latency" (the
// fixed-rate check) runs after them.
var scenarios = []scenario{
	{Name: "mostly-allowed", Via: "nginx", Prefix: "/api/", Target: 0.8,
		Description: "10k users, random user per request, one fixed_window rule per user, all allowed; through NGINX"},
	{Name: "direct", Via: "direct", Prefix: "/api/", Target: 0.65,
		Description: "the same requests straight to /auth (floor: the do-nothing server hit directly)"},
	{Name: "attack", Via: "nginx", Prefix: "/attack/", Users: 5, Target: 0.95,
		Description: "5 identities far over their limit (10/s each: 100x at 5,000 req/s); through NGINX, denials are 429"},
	{Name: "attack-quiet", Via: "nginx", Prefix: "/attack/", Users: 5, Quiet: true,
		Description: "the same attack through nginx/nginx-quiet.conf, rategate on deny_status: 403 (no error-log line, NGINX maps it to 429)"},
	{Name: "multi-rule", Via: "nginx", Prefix: "/multi/",
		Description: "three fixed_window rules per request: user + route + global; through NGINX"},
	{Name: "sliding_log", Via: "nginx", Prefix: "/algo/sliding-log/",
		Description: "one sliding_log rule per user; through NGINX"},
	{Name: "sliding_window", Via: "nginx", Prefix: "/algo/sliding-window/",
		Description: "one sliding_window rule per user; through NGINX"},
	{Name: "gcra", Via: "nginx", Prefix: "/algo/gcra/",
		Description: "one gcra rule per user; through NGINX"},
	{Name: "token_bucket", Via: "nginx", Prefix: "/algo/token-bucket/",
		Description: "one token_bucket rule per user; through NGINX"},
	{Name: "vs-minimal", Via: "nginx", Prefix: "/sw/", Target: 0.8, Arms: []arm{floorArm, rategateArm, minimalArm},
		Description: "sliding_window 1000/min per user, 10k users, all allowed, through NGINX: the floor, rategate, and bench/minimal on the same rule"},
	{Name: "vs-minimal-direct", Via: "direct", Prefix: "/sw/", Target: 0.65, Arms: []arm{floorArm, rategateArm, minimalArm},
		Description: "the same straight to /auth"},
	{Name: "vs-minimal-few", Via: "direct", Prefix: "/sw/", Connections: 8, Arms: []arm{floorArm, rategateArm, minimalArm},
		Description: "the same straight to /auth over 8 connections: a light closed loop, where Redis and the CPUs have room and a decision's latency sets the rate"},
	{Name: "vs-minimal-multi", Via: "direct", Prefix: "/swm/",
		Arms:        []arm{floorArm, rategateArm, {Name: "rategate-1rule", Auth: "rategate", Prefix: "/sw/"}},
		Description: "the same load straight to /auth, rategate deciding three sliding_window rules (user + route + global) in one script; rategate-1rule: the user rule alone"},
	{Name: "hot-key", Via: "direct", Prefix: "/hot/", Ceiling: true,
		Arms: []arm{floorArm, {Name: "rategate", Auth: "rategate-hot"}, {Name: "rategate-lease", Auth: "rategate-lease", Lease: true},
			{Name: "minimal", Auth: "minimal-hot"}},
		Description: "every request on one global fixed_window key (a huge limit, all allowed; bench/policy-hotkey.yaml), straight to /auth; " +
			"rategate-lease is the same rule with lease: true (BENCH_LEASE=0 leaves it out); ceiling: redis-benchmark EVALSHA of rategate's script on one key"},
}

// latencyScenario is the fixed-rate check's name in BENCH_SCENARIOS and the results.
const latencyScenario = "latency"

// settings are the knobs, from the environment.
type settings struct {
	Duration    time.Duration `json:"-"`
	DurationS   float64       `json:"duration_s"`
	Rounds      int           `json:"rounds"`
	Connections int           `json:"connections"`
	Threads     int           `json:"threads"`
	Users       int           `json:"users"`
	Scenarios   []string      `json:"scenarios"`
	// NginxKeepalive, when > 0, is an experiment: the upstreams' keepalive
	// (idle connections per worker) instead of the shipped 64.
	NginxKeepalive int `json:"nginx_keepalive,omitempty"`
	// Pprof (BENCH_PPROF=1) runs rategate with -pprof and saves a CPU
	// profile of its first run of each scenario next to the results.
	Pprof bool `json:"pprof,omitempty"`
	// Lease (on; BENCH_LEASE=0 turns it off) adds hot-key's rategate-lease
	// arm: the hot-key rule with lease: true.
	Lease bool `json:"lease,omitempty"`
}

func loadSettings(getenv func(string) string) (settings, error) {
	s := settings{Duration: 3 * time.Second, Rounds: 4, Connections: 50, Threads: 2, Users: 10000, Lease: true}
	var errs []error
	if v := getenv("BENCH_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Second {
			errs = append(errs, fmt.Errorf("BENCH_DURATION=%q: want a duration of at least 1s, like 5s", v))
		}
		s.Duration = d.Round(time.Second)
	}
	ints := []struct {
		env string
		dst *int
	}{{"BENCH_ROUNDS", &s.Rounds}, {"BENCH_CONNECTIONS", &s.Connections}, {"BENCH_THREADS", &s.Threads},
		{"BENCH_USERS", &s.Users}, {"BENCH_NGINX_KEEPALIVE", &s.NginxKeepalive}}
	for _, e := range ints {
		if v := getenv(e.env); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				errs = append(errs, fmt.Errorf("%s=%q: want a positive integer", e.env, v))
				continue
			}
			*e.dst = n
		}
	}
	for _, b := range []struct {
		env string
		dst *bool
	}{{"BENCH_PPROF", &s.Pprof}, {"BENCH_LEASE", &s.Lease}} {
		switch getenv(b.env) {
		case "":
		case "0":
			*b.dst = false
		case "1":
			*b.dst = true
		default:
			errs = append(errs, fmt.Errorf("%s=%q: want 1, 0 or nothing", b.env, getenv(b.env)))
		}
	}
	if s.Threads > s.Connections {
		errs = append(errs, fmt.Errorf("BENCH_THREADS (%d) must not exceed BENCH_CONNECTIONS (%d)", s.Threads, s.Connections))
	}
	known := map[string]bool{latencyScenario: true}
	for _, sc := range scenarios {
		known[sc.Name] = true
		s.Scenarios = append(s.Scenarios, sc.Name)
	}
	s.Scenarios = append(s.Scenarios, latencyScenario)
	if v := getenv("BENCH_SCENARIOS"); v != "" {
		s.Scenarios = nil
		for _, name := range strings.Split(v, ",") {
			name = strings.TrimSpace(name)
			if !known[name] {
				errs = append(errs, fmt.Errorf("BENCH_SCENARIOS: unknown scenario %q (known: %s)", name, strings.Join(allNames(), ", ")))
				continue
			}
			s.Scenarios = append(s.Scenarios, name)
		}
	}
	s.DurationS = s.Duration.Seconds()
	return s, errors.Join(errs...)
}

func allNames() []string {
	var n []string
	for _, sc := range scenarios {
		n = append(n, sc.Name)
	}
	return append(n, latencyScenario)
}

func (s settings) wants(name string) bool {
	for _, n := range s.Scenarios {
		if n == name {
			return true
		}
	}
	return false
}

func main() {
	work := flag.String("work", "", "work `dir`: configs, logs, the pid file (required)")
	bin := flag.String("bin", "", "`dir` holding the rategate, floor and openloop binaries (required)")
	repo := flag.String("repo", ".", "repository root `dir` (nginx/, bench/)")
	results := flag.String("results", "", "results `dir` (default <repo>/bench/results)")
	render := flag.String("render", "", "print the summary and the Markdown table of a results `file` (JSON) and exit")
	flag.Parse()
	if *render != "" {
		if err := renderFile(*render); err != nil {
			fmt.Fprintln(os.Stderr, "runner:", err)
			os.Exit(1)
		}
		return
	}
	if *work == "" || *bin == "" {
		fmt.Fprintln(os.Stderr, "runner: -work and -bin are required (run it through make bench)")
		os.Exit(2)
	}
	if *results == "" {
		*results = filepath.Join(*repo, "bench", "results")
	}
	cfg, err := loadSettings(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "runner:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, *work, *bin, *repo, *results); err != nil {
		if ctx.Err() != nil {
			fmt.Fprintln(os.Stderr, "runner: interrupted; every server it started is stopped")
			os.Exit(130)
		}
		fmt.Fprintln(os.Stderr, "runner:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, cfg settings, work, bin, repo, resultsDir string) error {
	res := &results{
		Started:  time.Now().UTC(),
		Settings: cfg,
		Machine:  describeMachine(repo),
		Command:  "make bench",
	}
	res.LoadBefore = loadAvg()
	fmt.Printf("rategate bench: %d-CPU %s; load average %.2f %.2f %.2f\n",
		res.Machine.CPUs, res.Machine.Model, res.LoadBefore[0], res.LoadBefore[1], res.LoadBefore[2])
	fmt.Printf("runs of %s, %d alternations (floor, rategate, ...), wrk -t%d -c%d, %d users; work dir %s\n",
		cfg.Duration, cfg.Rounds, cfg.Threads, cfg.Connections, cfg.Users, work)

	ps := &procSet{pidFile: filepath.Join(work, "pids")}
	defer ps.stopAll()
	if cfg.NginxKeepalive > 0 {
		fmt.Printf("EXPERIMENT: the NGINX copies keep %d idle connections per upstream (BENCH_NGINX_KEEPALIVE), not the shipped 64\n", cfg.NginxKeepalive)
	}
	st, err := startStack(ctx, ps, work, bin, repo, stackOptions{keepalive: cfg.NginxKeepalive, pprof: cfg.Pprof, lease: cfg.Lease})
	if err != nil {
		return err
	}
	st.profileDir = filepath.Join(resultsDir, "profiles-"+res.Started.UTC().Format("2006-01-02T15-04-05Z"))
	defer st.rdb.Close()
	res.Stack = st.describe()
	fmt.Println(res.Stack.Summary)

	// Warm up every path the chosen scenarios use (connections, EVALSHA's
	// script cache, the Go heap).
	warm, err := warmUps(st, cfg)
	if err != nil {
		return err
	}
	fmt.Printf("warming up (1 s per path, %d paths, not measured)\n", len(warm))
	for _, w := range warm {
		args := wrkArgs(cfg.Threads, cfg.Connections, time.Second, st.script, w.url, w.via, w.prefix, w.users)
		if _, err := runCmd(ctx, "wrk", args...); err != nil {
			return fmt.Errorf("warm-up against %s: %w", w.url, err)
		}
	}

	for _, sc := range scenarios {
		if !cfg.wants(sc.Name) {
			continue
		}
		if sc.Users == 0 {
			sc.Users = cfg.Users
		}
		r, err := st.runScenario(ctx, cfg, sc)
		if err != nil {
			return err
		}
		res.Scenarios = append(res.Scenarios, r)
	}
	if cfg.wants(latencyScenario) {
		r, err := st.runLatency(ctx, cfg, res.Scenarios)
		if err != nil {
			return err
		}
		res.Latency = r
	}
	res.Finished = time.Now().UTC()
	res.LoadAfter = loadAvg()
	res.evaluate()

	// The logs say whether anything went wrong inside (store errors, NGINX
	// failures) while it ran.
	res.Logs = st.logSummary()

	fmt.Println()
	fmt.Print(res.text())
	return res.write(resultsDir)
}

// warmUp is one path to warm up.
type warmUp struct {
	url, via, prefix string
	users            int
}

// warmUps lists, once each, the paths the chosen scenarios and the latency
// check will load.
func warmUps(st *stack, cfg settings) ([]warmUp, error) {
	var out []warmUp
	seen := map[warmUp]bool{}
	add := func(sc scenario, a arm) error {
		tg, err := st.target(a, sc.Via, sc.Quiet)
		if err != nil {
			return err
		}
		w := warmUp{url: tg.url, via: sc.Via, prefix: sc.prefix(a), users: cfg.Users}
		if sc.Users > 0 {
			w.users = sc.Users
		}
		if !seen[w] {
			seen[w] = true
			out = append(out, w)
		}
		return nil
	}
	for _, sc := range scenarios {
		if !cfg.wants(sc.Name) {
			continue
		}
		for _, a := range sc.arms(cfg.Lease) {
			if err := add(sc, a); err != nil {
				return nil, err
			}
		}
	}
	if cfg.wants(latencyScenario) {
		for _, a := range defaultArms {
			if err := add(scenario{Via: "nginx", Prefix: "/api/"}, a); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// renderFile prints a saved run's summary and Markdown table again.
func renderFile(path string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	var res results
	if err := json.Unmarshal(b, &res); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	res.Settings.Duration = time.Duration(res.Settings.DurationS * float64(time.Second))
	for i := range res.Scenarios {
		res.Scenarios[i].summarize()
	}
	if res.Latency != nil {
		res.Latency.summarize()
	}
	res.evaluate()
	fmt.Print(res.text())
	fmt.Println()
	fmt.Print(res.markdown())
	return nil
}

// runCmd runs a short-lived command and returns its stdout; stderr goes
// into the error.
func runCmd(ctx context.Context, name string, args ...string) (string, error) {
	out, _, err := runTimed(ctx, name, args...)
	return out, err
}
