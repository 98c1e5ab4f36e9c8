package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"
)

// results is everything one `make bench` measured; it is written as JSON.
type results struct {
	Command    string           `json:"command"`
	Started    time.Time        `json:"started"`
	Finished   time.Time        `json:"finished"`
	Machine    machineInfo      `json:"machine"`
	Settings   settings         `json:"settings"`
	Stack      stackInfo        `json:"stack"`
	LoadBefore [3]float64       `json:"load_before"`
	LoadAfter  [3]float64       `json:"load_after"`
	Scenarios  []scenarioResult `json:"scenarios"`
	Latency    *latencyResult   `json:"latency,omitempty"`
	Targets    []targetResult   `json:"targets"`
	Logs       logInfo          `json:"logs"`
}

type machineInfo struct {
	CPUs     int    `json:"cpus"`
	Model    string `json:"model"`
	Kernel   string `json:"kernel"`
	Go       string `json:"go"`
	Nginx    string `json:"nginx"`
	Redis    string `json:"redis"`
	Wrk      string `json:"wrk"`
	Revision string `json:"revision"`
}

type stackInfo struct {
	Summary string `json:"summary"`
	App     string `json:"app"`
	NGINX   string `json:"nginx"`
	Minimal string `json:"minimal,omitempty"`
}

// logInfo counts problem lines in the servers' logs after the run.
type logInfo struct {
	RategateWarnings         int `json:"rategate_warn_or_error_lines"`
	NginxRategateErrorLines  int `json:"nginx_rategate_error_log_lines"`
	NginxRategateDenialLines int `json:"nginx_rategate_429_lines"`
	NginxFloorErrorLines     int `json:"nginx_floor_error_log_lines"`
	// NginxMinimalErrorLines: the copy asking bench/minimal; MinimalLines:
	// what bench/minimal itself wrote (only errors).
	NginxMinimalErrorLines int `json:"nginx_minimal_error_log_lines"`
	MinimalLines           int `json:"minimal_log_lines"`
	// NginxQuietErrorLines counts both quiet copies' error.log lines.
	NginxQuietErrorLines int `json:"nginx_quiet_error_log_lines"`
	// Samples are the first few lines of each kind that is not expected
	// (rategate warnings, NGINX errors other than the 429 lines).
	Samples []string `json:"samples,omitempty"`
}

// sample is one run against one target.
type sample struct {
	// Target is the arm: floor, rategate, minimal, ..., or ceiling
	// (redis-benchmark).
	Target string `json:"target"`
	// NginxProc and AuthProc name the processes in CPU that served the run
	// ("nginx-rategate", "rategate"; "nginx-floor-quiet", "floor";
	// "minimal-hot"; "none" for the ceiling).
	NginxProc string  `json:"nginx_proc,omitempty"`
	AuthProc  string  `json:"auth_proc"`
	Round     int     `json:"round"`
	WallS     float64 `json:"wall_s"`
	wrkResult
	P999MS    float64 `json:"p999_ms,omitempty"`
	LateSends int64   `json:"late_sends,omitempty"`
	// CPU is CPU seconds during the run per process (from
	// /proc/<pid>/stat): redis-server, rategate..., minimal..., floor,
	// app, nginx-... (master and worker), load (wrk, openloop or
	// redis-benchmark) and other (the rest of the machine).
	CPU map[string]float64 `json:"cpu_s"`
	// RedisCalls and RedisUSec are INFO commandstats' calls and
	// microseconds per command during the run (CONFIG RESETSTAT just
	// before; the runner's own INFO and RESETSTAT left out). Redis counts
	// the commands a script runs too, under their own names, and a
	// script's time includes theirs.
	RedisCalls map[string]int64 `json:"redis_calls"`
	RedisUSec  map[string]int64 `json:"redis_usec,omitempty"`
	// RedisFailed counts calls that failed (a script error, NOSCRIPT...).
	RedisFailed int64 `json:"redis_failed_calls,omitempty"`
	// RedisPerRequest is every command Redis executed per request,
	// EvalshaPerRequest the script calls (EVALSHA, EVAL, FCALL) per request.
	RedisPerRequest   float64 `json:"redis_commands_per_request"`
	EvalshaPerRequest float64 `json:"evalsha_per_request"`
	// RedisScriptUSPerRequest is the time Redis spent in script calls per
	// request; RedisCommandUSPerRequest the part of it in the commands the
	// scripts ran (every other command, housekeeping left out).
	RedisScriptUSPerRequest  float64 `json:"redis_script_us_per_request"`
	RedisCommandUSPerRequest float64 `json:"redis_script_commands_us_per_request"`
	// RedisReadsPerRequest is Redis's network reads per request: below
	// the EVALSHAs per request when decisions share pipelines.
	RedisReadsPerRequest float64 `json:"redis_reads_per_request"`
	// Undecided is how many requests the auth service answered without a
	// decision during the run (rategate's failure_mode, the minimal
	// limiter's fail-open): Redis slower than the deadline, or failing.
	Undecided int64 `json:"undecided,omitempty"`
	// AuthAccepts and AppAccepts are the connections the auth service
	// and the app accepted during the run: with every connection kept
	// alive, only the first ones. -1: not measured (needs perf).
	AuthAccepts int64   `json:"auth_accepts"`
	AppAccepts  int64   `json:"app_accepts"`
	Load1       float64 `json:"load1_after"`
}

// The commands setRedis sorts.
var (
	// benchOwn are the runner's own, around each run.
	benchOwn = map[string]bool{"info": true, "config|resetstat": true}
	// scriptCalls run a script.
	scriptCalls = map[string]bool{"evalsha": true, "eval": true, "evalsha_ro": true, "eval_ro": true, "fcall": true, "fcall_ro": true}
	// housekeeping is what clients send besides decisions.
	housekeeping = map[string]bool{"ping": true, "hello": true, "select": true, "client|setinfo": true, "client|setname": true,
		"script|load": true, "script|exists": true, "subscribe": true, "psubscribe": true, "ssubscribe": true, "publish": true, "command|docs": true}
)

// setRedis fills the Redis fields from INFO after the run, per request.
func (s *sample) setRedis(rs redisStats) {
	s.RedisCalls, s.RedisUSec, s.RedisFailed = map[string]int64{}, map[string]int64{}, 0
	var calls, scripts, scriptUS, commandUS int64
	for k, n := range rs.Calls {
		if benchOwn[k] {
			continue
		}
		u := rs.USec[k]
		s.RedisCalls[k], s.RedisUSec[k] = n, u
		calls += n
		switch {
		case scriptCalls[k]:
			scripts += n
			scriptUS += u
		case !housekeeping[k]:
			commandUS += u
		}
	}
	for k, n := range rs.Failed {
		if !benchOwn[k] {
			s.RedisFailed += n
		}
	}
	if s.Requests > 0 {
		d := float64(s.Requests)
		s.RedisPerRequest, s.EvalshaPerRequest = float64(calls)/d, float64(scripts)/d
		s.RedisScriptUSPerRequest, s.RedisCommandUSPerRequest = float64(scriptUS)/d, float64(commandUS)/d
		// The INFO that read these is one of the reads.
		s.RedisReadsPerRequest = float64(max(rs.Reads-1, 0)) / d
	}
}

// roles maps a sample's CPU onto the roles of its target: the NGINX in
// use, the auth service in use (rategate, minimal or floor), app, redis,
// load, and other (the rest of the machine, including the idle side of
// the stack).
func (s *sample) roles() map[string]float64 {
	ngx, auth := s.NginxProc, s.AuthProc
	if auth == "" { // results written before these fields existed
		ngx, auth = "nginx-"+s.Target, s.Target
	}
	r := map[string]float64{}
	for k, v := range s.CPU {
		switch k {
		case ngx:
			r["nginx"] += v
		case auth:
			r["auth"] += v
		case "app", "redis-server", "load":
			r[strings.TrimSuffix(k, "-server")] += v
		default:
			r["other"] += v
		}
	}
	return r
}

// stackCPU is the CPU seconds of the processes serving the run (NGINX,
// auth, app, redis; not the load generator or the rest of the machine).
func (s *sample) stackCPU() float64 {
	r := s.roles()
	return r["nginx"] + r["auth"] + r["app"] + r["redis"]
}

// perDecision is the CPU µs a role spent per request of the run (every
// request is one decision); role "stack" is stackCPU.
func (s *sample) perDecision(role string) float64 {
	if s.Requests == 0 {
		return 0
	}
	cpu := s.roles()[role]
	if role == "stack" {
		cpu = s.stackCPU()
	}
	return cpu * 1e6 / float64(s.Requests)
}

// costPerRequest is the CPU per request of the stack and the load
// generator together, the cost ratio's terms.
func (s *sample) costPerRequest() float64 {
	if s.Requests == 0 {
		return 0
	}
	return (s.stackCPU() + s.roles()["load"]) / float64(s.Requests)
}

// summary is the median over a target's rounds of each figure.
type summary struct {
	RPS   float64 `json:"rps"`
	P50MS float64 `json:"p50_ms"`
	P99MS float64 `json:"p99_ms"`
	// Cores is CPU seconds per wall second, per role (nginx, auth, app,
	// redis, load, other).
	Cores map[string]float64 `json:"cores"`
	// StackUSPerRequest is the CPU µs NGINX, the auth service, the app and
	// Redis spend per request; USPerRequest is that per role (and the
	// load generator's).
	StackUSPerRequest float64            `json:"stack_cpu_us_per_request"`
	USPerRequest      map[string]float64 `json:"cpu_us_per_request"`
	RedisPerRequest   float64            `json:"redis_commands_per_request"`
	EvalshaPerRequest float64            `json:"evalsha_per_request"`
	// RedisScriptUSPerRequest and RedisCommandUSPerRequest: Redis's time
	// in scripts per request, and in the commands they ran.
	RedisScriptUSPerRequest  float64 `json:"redis_script_us_per_request"`
	RedisCommandUSPerRequest float64 `json:"redis_script_commands_us_per_request"`
	// RedisReadsPerRequest: Redis's network reads per request.
	RedisReadsPerRequest float64 `json:"redis_reads_per_request"`
	Non2xxShare          float64 `json:"non_2xx_share"`
	// AuthConnsPer1000 and AppConnsPer1000 are the connections the auth
	// service and the app accepted per 1000 requests; -1 when not measured.
	AuthConnsPer1000 float64 `json:"auth_conns_per_1000_requests"`
	AppConnsPer1000  float64 `json:"app_conns_per_1000_requests"`
	// SocketErrors, Undecided and RedisFailed are totals over the rounds.
	SocketErrors int64 `json:"socket_errors"`
	Undecided    int64 `json:"undecided"`
	RedisFailed  int64 `json:"redis_failed_calls,omitempty"`
}

// per1000 is n per 1000 requests; -1 when n was not measured.
func per1000(n, requests int64) float64 {
	if n < 0 || requests == 0 {
		return -1
	}
	return 1000 * float64(n) / float64(requests)
}

func median(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func medianOf(ss []sample, f func(*sample) float64) float64 {
	v := make([]float64, len(ss))
	for i := range ss {
		v[i] = f(&ss[i])
	}
	return median(v)
}

func summarize(ss []sample) summary {
	col := func(f func(s *sample) float64) float64 { return medianOf(ss, f) }
	m := summary{
		RPS:                      col(func(s *sample) float64 { return s.RPS }),
		P50MS:                    col(func(s *sample) float64 { return s.P50MS }),
		P99MS:                    col(func(s *sample) float64 { return s.P99MS }),
		StackUSPerRequest:        col(func(s *sample) float64 { return s.perDecision("stack") }),
		USPerRequest:             map[string]float64{},
		RedisPerRequest:          col(func(s *sample) float64 { return s.RedisPerRequest }),
		EvalshaPerRequest:        col(func(s *sample) float64 { return s.EvalshaPerRequest }),
		RedisScriptUSPerRequest:  col(func(s *sample) float64 { return s.RedisScriptUSPerRequest }),
		RedisCommandUSPerRequest: col(func(s *sample) float64 { return s.RedisCommandUSPerRequest }),
		RedisReadsPerRequest:     col(func(s *sample) float64 { return s.RedisReadsPerRequest }),
		Non2xxShare: col(func(s *sample) float64 {
			if s.Requests == 0 {
				return 0
			}
			return float64(s.Non2xx) / float64(s.Requests)
		}),
		AuthConnsPer1000: col(func(s *sample) float64 { return per1000(s.AuthAccepts, s.Requests) }),
		AppConnsPer1000:  col(func(s *sample) float64 { return per1000(s.AppAccepts, s.Requests) }),
		Cores:            map[string]float64{},
	}
	for _, role := range []string{"nginx", "auth", "app", "redis", "load", "other"} {
		m.Cores[role] = round3(col(func(s *sample) float64 { return s.roles()[role] / s.WallS }))
		if role != "other" {
			m.USPerRequest[role] = round3(col(func(s *sample) float64 { return s.perDecision(role) }))
		}
	}
	for i := range ss {
		m.SocketErrors += ss[i].SocketErrors
		m.Undecided += ss[i].Undecided
		m.RedisFailed += ss[i].RedisFailed
	}
	return m
}

// paired divides f of each run of a by f of b's run in the same round, and
// returns those ratios and their median. The machine's speed drifts (other
// work, the host under a VM) by more between rounds than between two
// adjacent runs, so pairs compare like with like.
func paired(a, b []sample, f func(*sample) float64) (rounds []float64, med float64) {
	for i := range min(len(a), len(b)) {
		if d := f(&b[i]); d > 0 {
			rounds = append(rounds, round3(f(&a[i])/d))
		}
	}
	return rounds, round3(median(rounds))
}

func rps(s *sample) float64 { return s.RPS }

// armRuns is one arm's runs beyond floor and rategate (minimal,
// rategate-1rule, rategate-lease) and their medians.
type armRuns struct {
	Name    string   `json:"name"`
	Samples []sample `json:"samples"`
	Median  summary  `json:"median"`
	// Ratio is the median of RoundRatios: this arm's req/s over the floor
	// run of the same round. CostRatio: the floor's CPU per request over
	// this arm's, paired the same way.
	Ratio       float64   `json:"ratio"`
	RoundRatios []float64 `json:"round_ratios"`
	CostRatio   float64   `json:"cost_ratio"`
}

// scenarioResult is one scenario's runs and their medians.
//
// Ratios are paired: each run of an arm is divided by the floor run of its
// round, and the ratio is the median of those.
type scenarioResult struct {
	scenario
	Floor          []sample `json:"floor"`
	Rategate       []sample `json:"rategate"`
	FloorMedian    summary  `json:"floor_median"`
	RategateMedian summary  `json:"rategate_median"`
	// Others are the scenario's other arms, in run order.
	Others []armRuns `json:"others,omitempty"`
	// Ceiling holds hot-key's redis-benchmark runs, one per round.
	Ceiling       []sample `json:"ceiling,omitempty"`
	CeilingMedian *summary `json:"ceiling_median,omitempty"`
	// Ratio is the median of RoundRatios, rategate req/s over the floor's.
	Ratio       float64   `json:"ratio"`
	RoundRatios []float64 `json:"round_ratios"`
	// RatioOfMedians is the median rategate req/s over the median floor req/s.
	RatioOfMedians float64 `json:"ratio_of_medians"`
	// Noisy is set when the round ratios spread by more than noisySpread,
	// or rategate answered some requests by failure_mode.
	Noisy bool `json:"noisy"`
	// CostRatio is the median over the rounds of the floor's CPU per
	// request (stack and load generator) over rategate's. When the CPUs
	// are the bottleneck, as on a small box running everything, the req/s
	// ratio tends to it.
	CostRatio float64 `json:"cost_ratio"`
}

// noisySpread is the max-min spread of the round ratios above which a
// scenario is marked noisy.
const noisySpread = 0.2

// setArms files each arm's runs: floor and rategate in their own fields,
// the others in Others.
func (r *scenarioResult) setArms(arms []arm, runs [][]sample) {
	r.Floor, r.Rategate, r.Others = nil, nil, nil
	for i, a := range arms {
		switch a.Name {
		case "floor":
			r.Floor = runs[i]
		case "rategate":
			r.Rategate = runs[i]
		default:
			r.Others = append(r.Others, armRuns{Name: a.Name, Samples: runs[i]})
		}
	}
}

// armSamples returns the runs of the arm called name, nil if it did not run.
func (r *scenarioResult) armSamples(name string) []sample {
	switch name {
	case "floor":
		return r.Floor
	case "rategate":
		return r.Rategate
	}
	for i := range r.Others {
		if r.Others[i].Name == name {
			return r.Others[i].Samples
		}
	}
	return nil
}

// arms lists every arm with its figures, in run order (floor first).
func (r *scenarioResult) arms() []armRuns {
	out := []armRuns{{Name: "floor", Samples: r.Floor, Median: r.FloorMedian},
		{Name: "rategate", Samples: r.Rategate, Median: r.RategateMedian, Ratio: r.Ratio, RoundRatios: r.RoundRatios, CostRatio: r.CostRatio}}
	return append(out, r.Others...)
}

func (r *scenarioResult) summarize() {
	r.FloorMedian, r.RategateMedian = summarize(r.Floor), summarize(r.Rategate)
	r.RatioOfMedians = 0
	if r.FloorMedian.RPS > 0 {
		r.RatioOfMedians = round3(r.RategateMedian.RPS / r.FloorMedian.RPS)
	}
	cost := func(s *sample) float64 { return s.costPerRequest() }
	r.RoundRatios, r.Ratio = paired(r.Rategate, r.Floor, rps)
	_, r.CostRatio = paired(r.Floor, r.Rategate, cost)
	for i := range r.Others {
		o := &r.Others[i]
		o.Median = summarize(o.Samples)
		o.RoundRatios, o.Ratio = paired(o.Samples, r.Floor, rps)
		_, o.CostRatio = paired(r.Floor, o.Samples, cost)
	}
	r.CeilingMedian = nil
	if len(r.Ceiling) > 0 {
		m := summarize(r.Ceiling)
		r.CeilingMedian = &m
	}
	r.Noisy = r.RategateMedian.Undecided > 0 ||
		(len(r.RoundRatios) > 1 && slices.Max(r.RoundRatios)-slices.Min(r.RoundRatios) > noisySpread)
	for _, o := range r.Others {
		r.Noisy = r.Noisy || o.Median.Undecided > 0 ||
			(len(o.RoundRatios) > 1 && slices.Max(o.RoundRatios)-slices.Min(o.RoundRatios) > noisySpread)
	}
}

// ratioRange is "min–max" of round ratios, "" for fewer than two.
func ratioRange(v []float64) string {
	if len(v) < 2 {
		return ""
	}
	return fmt.Sprintf("%.2f–%.2f", slices.Min(v), slices.Max(v))
}

// latencyResult is the fixed-rate check.
type latencyResult struct {
	Rate           float64  `json:"rate"`
	Floor          []sample `json:"floor"`
	Rategate       []sample `json:"rategate"`
	FloorMedian    summary  `json:"floor_median"`
	RategateMedian summary  `json:"rategate_median"`
	// DeltaP99MS is the median over the rounds of rategate's p99 minus
	// the floor's just before it.
	DeltaP99MS  float64   `json:"delta_p99_ms"`
	RoundDeltas []float64 `json:"round_deltas_ms"`
	// Noisy is set when the floor's p99 varied by more than 2x over the
	// rounds, or rategate answered some requests by failure_mode.
	Noisy bool `json:"noisy"`
}

func (l *latencyResult) summarize() {
	l.FloorMedian, l.RategateMedian = summarize(l.Floor), summarize(l.Rategate)
	l.RoundDeltas = nil
	for i := range min(len(l.Floor), len(l.Rategate)) {
		l.RoundDeltas = append(l.RoundDeltas, round3(l.Rategate[i].P99MS-l.Floor[i].P99MS))
	}
	l.DeltaP99MS = round3(median(l.RoundDeltas))
	p99 := make([]float64, len(l.Floor))
	for i := range l.Floor {
		p99[i] = l.Floor[i].P99MS
	}
	l.Noisy = l.RategateMedian.Undecided > 0 || (len(p99) > 0 && slices.Max(p99) > 2*slices.Min(p99))
}

// targetResult is one target, computed from one run's rounds.
type targetResult struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  string `json:"got"`
	// Verdict is "met", "not met", "inconclusive" when too many rounds
	// are on the other side of the median, or "not run" when the
	// scenario (or arm) it needs did not run.
	Verdict string `json:"verdict"`
	// Value is the median of Rounds, the figure judged against Bound;
	// A and B are the medians of its two terms (A ÷ B, or A - B for the
	// latency check), in Unit.
	Value  float64   `json:"value"`
	Bound  float64   `json:"bound"`
	A      float64   `json:"a"`
	B      float64   `json:"b"`
	Unit   string    `json:"unit,omitempty"`
	Rounds []float64 `json:"rounds,omitempty"`
}

// verdict judges a target by the median of the rounds, and calls it
// inconclusive when fewer than two thirds of the rounds agree with it (one
// disturbed round in five does not decide, two do).
func verdict(rounds []float64, median float64, ok func(float64) bool) string {
	agree := 0
	for _, v := range rounds {
		if ok(v) == ok(median) {
			agree++
		}
	}
	switch {
	case 3*agree < 2*len(rounds):
		return "inconclusive"
	case ok(median):
		return "met"
	}
	return "not met"
}

// goal is a target of the speed issue, computed from one scenario's rounds:
// Metric of arm A divided by Metric of arm B in the same round, at most
// (AtMost) or at least Bound.
type goal struct {
	Name     string
	Scenario string
	A, B     string
	Metric   string // "rps", "redis_us" (Redis CPU per decision), "auth_us" (the auth service's)
	Bound    float64
	AtMost   bool
}

// metrics are the figures goals divide, per sample, with their unit.
var metrics = map[string]struct {
	unit string
	f    func(*sample) float64
}{
	"rps":      {"req/s", rps},
	"redis_us": {"µs", func(s *sample) float64 { return s.perDecision("redis") }},
	"auth_us":  {"µs", func(s *sample) float64 { return s.perDecision("auth") }},
}

// goals are the speed issue's targets against the minimal limiter, in the
// order the report lists them.
var goals = []goal{
	{"Redis CPU per decision, rategate ÷ minimal, direct", "vs-minimal-direct", "rategate", "minimal", "redis_us", 0.8, true},
	{"Redis CPU per decision, rategate ÷ minimal, behind NGINX", "vs-minimal", "rategate", "minimal", "redis_us", 0.8, true},
	{"Redis CPU per decision, 3 rules ÷ 1 rule (rategate)", "vs-minimal-multi", "rategate", "rategate-1rule", "redis_us", 1.5, true},
	{"throughput, rategate ÷ minimal, direct", "vs-minimal-direct", "rategate", "minimal", "rps", 1.1, false},
	{"throughput, rategate ÷ minimal, behind NGINX", "vs-minimal", "rategate", "minimal", "rps", 1.1, false},
	{"throughput, rategate ÷ minimal, direct over 8 connections", "vs-minimal-few", "rategate", "minimal", "rps", 1.1, false},
	{"own CPU per decision, rategate ÷ minimal, direct", "vs-minimal-direct", "rategate", "minimal", "auth_us", 1.0, true},
	{"own CPU per decision, rategate ÷ minimal, behind NGINX", "vs-minimal", "rategate", "minimal", "auth_us", 1.0, true},
}

// judge computes g from the scenarios that ran.
func (g goal) judge(scs []scenarioResult) targetResult {
	m := metrics[g.Metric]
	cmp := ">="
	if g.AtMost {
		cmp = "<="
	}
	t := targetResult{Name: g.Name, Want: fmt.Sprintf("%s %.2f", cmp, g.Bound), Bound: g.Bound, Unit: m.unit, Verdict: "not run",
		Got: "not run (" + g.Scenario + ")"}
	var a, b []sample
	for i := range scs {
		if scs[i].Name == g.Scenario {
			a, b = scs[i].armSamples(g.A), scs[i].armSamples(g.B)
		}
	}
	if len(a) == 0 || len(b) == 0 {
		return t
	}
	t.Rounds, t.Value = paired(a, b, m.f)
	t.A, t.B = round3(medianOf(a, m.f)), round3(medianOf(b, m.f))
	ok := func(v float64) bool { return v >= g.Bound }
	if g.AtMost {
		ok = func(v float64) bool { return v <= g.Bound }
	}
	t.Verdict = verdict(t.Rounds, t.Value, ok)
	t.Got = fmt.Sprintf("%.2f (%s %s: %s ÷ %s %s%s)", t.Value, g.A, g.B, fmtNum(t.A), fmtNum(t.B), m.unit, roundsNote(t.Rounds))
	return t
}

// fmtNum prints a figure with the digits that matter: 27700, 25.3, 0.84.
func fmtNum(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.0f", v)
	case v >= 10:
		return fmt.Sprintf("%.1f", v)
	}
	return fmt.Sprintf("%.2f", v)
}

// roundsNote is "; rounds 0.41–0.52", or "" for a single round.
func roundsNote(v []float64) string {
	if r := ratioRange(v); r != "" {
		return "; rounds " + r
	}
	return ""
}

// evaluate computes every target from what ran: the goals against the
// minimal limiter, each scenario's rategate ÷ floor target (the floor
// moonshots), and the latency check.
func (res *results) evaluate() {
	res.Targets = nil
	for _, g := range goals {
		res.Targets = append(res.Targets, g.judge(res.Scenarios))
	}
	for _, r := range res.Scenarios {
		if r.Target == 0 {
			continue
		}
		where := map[string]string{"nginx": "behind NGINX", "direct": "direct"}[r.Via]
		target := r.Target
		t := targetResult{Name: fmt.Sprintf("throughput, rategate ÷ floor, %s (%s)", where, r.Name), Want: fmt.Sprintf(">= %.2f", r.Target),
			Value: r.Ratio, Bound: r.Target, A: r.RategateMedian.RPS, B: r.FloorMedian.RPS, Unit: "req/s", Rounds: r.RoundRatios,
			Verdict: verdict(r.RoundRatios, r.Ratio, func(v float64) bool { return v >= target })}
		t.Got = fmt.Sprintf("%.2f (rategate floor: %.0f ÷ %.0f req/s%s)", r.Ratio, t.A, t.B, roundsNote(r.RoundRatios))
		res.Targets = append(res.Targets, t)
	}
	if l := res.Latency; l != nil {
		res.Targets = append(res.Targets, targetResult{
			Name: fmt.Sprintf("p99 at half the maximum rate (%.0f req/s), rategate - floor", l.Rate),
			Want: "<= +0.50 ms",
			// the median of the rounds' differences, which the two arms'
			// medians (also shown) need not subtract to
			Got: fmt.Sprintf("%+.2f ms (median of the rounds' rategate - floor; medians rategate %.2f, floor %.2f ms)",
				l.DeltaP99MS, l.RategateMedian.P99MS, l.FloorMedian.P99MS),
			Value: l.DeltaP99MS, Bound: 0.5, A: l.RategateMedian.P99MS, B: l.FloorMedian.P99MS, Unit: "ms", Rounds: l.RoundDeltas,
			Verdict: verdict(l.RoundDeltas, l.DeltaP99MS, func(v float64) bool { return v <= 0.5 }),
		})
	}
}

// write stores the JSON and latest.md in dir.
func (res *results) write(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	js, err := json.MarshalIndent(res, "", "  ")
	if err != nil {
		return err
	}
	name := filepath.Join(dir, res.Started.Format("2006-01-02T15-04-05Z")+".json")
	if err := os.WriteFile(name, append(js, '\n'), 0o644); err != nil {
		return err
	}
	md := filepath.Join(dir, "latest.md")
	if err := os.WriteFile(md, []byte(res.markdown()), 0o644); err != nil {
		return err
	}
	fmt.Printf("wrote %s and %s\n", name, md)
	return nil
}

// describeMachine records what the numbers were measured on.
func describeMachine(repo string) machineInfo {
	m := machineInfo{CPUs: runtime.NumCPU(), Go: runtime.Version()}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.Model = strings.Join(strings.Fields(v), " ")
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = strings.TrimSpace(string(b))
	}
	first := func(name string, args ...string) string {
		out, _ := exec.Command(name, args...).CombinedOutput()
		line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
		return line
	}
	m.Nginx = first("nginx", "-v")
	m.Redis = first("redis-server", "--version")
	m.Wrk = first("wrk", "-v")
	m.Revision = first("git", "-C", repo, "rev-parse", "--short", "HEAD")
	if out, err := exec.Command("git", "-C", repo, "status", "--porcelain", "--untracked-files=no").Output(); err == nil && len(out) > 0 {
		m.Revision += " plus uncommitted changes"
	}
	if m.Revision == "" {
		m.Revision = "an unknown revision"
	}
	return m
}
