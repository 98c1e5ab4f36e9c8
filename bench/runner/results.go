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
}

// logInfo counts problem lines in the servers' logs after the run.
type logInfo struct {
	RategateWarnings         int `json:"rategate_warn_or_error_lines"`
	NginxRategateErrorLines  int `json:"nginx_rategate_error_log_lines"`
	NginxRategateDenialLines int `json:"nginx_rategate_429_lines"`
	NginxFloorErrorLines     int `json:"nginx_floor_error_log_lines"`
	// NginxQuietErrorLines counts both quiet copies' error.log lines.
	NginxQuietErrorLines int `json:"nginx_quiet_error_log_lines"`
	// Samples are the first few lines of each kind that is not expected
	// (rategate warnings, NGINX errors other than the 429 lines).
	Samples []string `json:"samples,omitempty"`
}

// sample is one run against one target.
type sample struct {
	Target string `json:"target"`
	// NginxProc and AuthProc name the processes in CPU that served the run
	// ("nginx-rategate", "rategate"; "nginx-floor-quiet", "floor", ...).
	NginxProc string  `json:"nginx_proc,omitempty"`
	AuthProc  string  `json:"auth_proc"`
	Round     int     `json:"round"`
	WallS     float64 `json:"wall_s"`
	wrkResult
	P999MS    float64 `json:"p999_ms,omitempty"`
	LateSends int64   `json:"late_sends,omitempty"`
	// CPU is CPU seconds during the run per process: redis-server,
	// rategate, floor, app, nginx-rategate, nginx-floor (master and
	// worker), load (wrk or openloop) and other (the rest of the machine).
	CPU map[string]float64 `json:"cpu_s"`
	// RedisCalls is INFO commandstats' calls delta per command. Redis
	// counts the commands a script runs too: RedisPerRequest is every
	// command Redis executed per request, EvalshaPerRequest the round
	// trips (EVALSHA and EVAL) per request.
	RedisCalls        map[string]int64 `json:"redis_calls"`
	RedisPerRequest   float64          `json:"redis_commands_per_request"`
	EvalshaPerRequest float64          `json:"evalsha_per_request"`
	// RedisReadsPerRequest is Redis's network reads per request: below
	// the EVALSHAs per request when decisions share pipelines.
	RedisReadsPerRequest float64 `json:"redis_reads_per_request"`
	// Undecided is how many requests rategate answered by failure_mode
	// during the run (Redis slower than redis.timeout, or the breaker open).
	Undecided int64 `json:"undecided,omitempty"`
	// AuthAccepts and AppAccepts are the connections the auth service
	// (rategate or the floor) and the app accepted during the run: with
	// every connection kept alive, only the first ones. -1: not measured
	// (needs perf).
	AuthAccepts int64   `json:"auth_accepts"`
	AppAccepts  int64   `json:"app_accepts"`
	Load1       float64 `json:"load1_after"`
}

// roles maps a sample's CPU onto the roles of its target: the NGINX in
// use, the auth service in use (rategate or floor), app, redis, load, and
// other (the rest of the machine, including the idle side of the stack).
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

func (s *sample) line() string {
	r := s.roles()
	den := ""
	if s.Non2xx > 0 {
		den = fmt.Sprintf("  non-2xx %.1f%%", 100*float64(s.Non2xx)/float64(s.Requests))
	}
	if s.SocketErrors > 0 {
		den += fmt.Sprintf("  socket errors %d", s.SocketErrors)
	}
	if s.Undecided > 0 {
		den += fmt.Sprintf("  UNDECIDED (failure_mode) %d", s.Undecided)
	}
	return fmt.Sprintf("round %d %-8s %7.0f req/s  p50 %5.2f ms  p99 %6.2f ms  cores: nginx %.2f %s %.2f redis %.2f app %.2f load %.2f other %.2f  evalsha/req %.2f%s",
		s.Round, s.Target, s.RPS, s.P50MS, s.P99MS, r["nginx"]/s.WallS, s.Target, r["auth"]/s.WallS, r["redis"]/s.WallS,
		r["app"]/s.WallS, r["load"]/s.WallS, r["other"]/s.WallS, s.EvalshaPerRequest, den)
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
	// RedisReadsPerRequest: Redis's network reads per request.
	RedisReadsPerRequest float64 `json:"redis_reads_per_request"`
	Non2xxShare          float64 `json:"non_2xx_share"`
	// AuthConnsPer1000 and AppConnsPer1000 are the connections the auth
	// service and the app accepted per 1000 requests; -1 when not measured.
	AuthConnsPer1000 float64 `json:"auth_conns_per_1000_requests"`
	AppConnsPer1000  float64 `json:"app_conns_per_1000_requests"`
	// SocketErrors and Undecided are totals over the rounds.
	SocketErrors int64 `json:"socket_errors"`
	Undecided    int64 `json:"undecided"`
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

func summarize(ss []sample) summary {
	col := func(f func(s *sample) float64) float64 {
		v := make([]float64, len(ss))
		for i := range ss {
			v[i] = f(&ss[i])
		}
		return median(v)
	}
	perReq := func(s *sample, cpu float64) float64 {
		if s.Requests == 0 {
			return 0
		}
		return cpu * 1e6 / float64(s.Requests)
	}
	m := summary{
		RPS:                  col(func(s *sample) float64 { return s.RPS }),
		P50MS:                col(func(s *sample) float64 { return s.P50MS }),
		P99MS:                col(func(s *sample) float64 { return s.P99MS }),
		StackUSPerRequest:    col(func(s *sample) float64 { return perReq(s, s.stackCPU()) }),
		USPerRequest:         map[string]float64{},
		RedisPerRequest:      col(func(s *sample) float64 { return s.RedisPerRequest }),
		EvalshaPerRequest:    col(func(s *sample) float64 { return s.EvalshaPerRequest }),
		RedisReadsPerRequest: col(func(s *sample) float64 { return s.RedisReadsPerRequest }),
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
			m.USPerRequest[role] = round3(col(func(s *sample) float64 { return perReq(s, s.roles()[role]) }))
		}
	}
	for i := range ss {
		m.SocketErrors += ss[i].SocketErrors
		m.Undecided += ss[i].Undecided
	}
	return m
}

// scenarioResult is one scenario's runs and their medians.
//
// The ratio is paired: each rategate run is divided by the floor run just
// before it, and Ratio is the median of those. The machine's speed drifts
// (other work, the host under a VM) by more between rounds than between
// two adjacent runs, so pairs compare like with like.
type scenarioResult struct {
	scenario
	Floor          []sample `json:"floor"`
	Rategate       []sample `json:"rategate"`
	FloorMedian    summary  `json:"floor_median"`
	RategateMedian summary  `json:"rategate_median"`
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

func (r *scenarioResult) summarize() {
	r.FloorMedian, r.RategateMedian = summarize(r.Floor), summarize(r.Rategate)
	if r.FloorMedian.RPS > 0 {
		r.RatioOfMedians = round3(r.RategateMedian.RPS / r.FloorMedian.RPS)
	}
	r.RoundRatios = nil
	var costs []float64
	for i := range min(len(r.Floor), len(r.Rategate)) {
		f, g := &r.Floor[i], &r.Rategate[i]
		if f.RPS > 0 {
			r.RoundRatios = append(r.RoundRatios, round3(g.RPS/f.RPS))
		}
		if fc, gc := f.stackCPU()+f.roles()["load"], g.stackCPU()+g.roles()["load"]; fc > 0 && gc > 0 && f.Requests > 0 && g.Requests > 0 {
			costs = append(costs, (fc/float64(f.Requests))/(gc/float64(g.Requests)))
		}
	}
	r.Ratio = round3(median(r.RoundRatios))
	r.CostRatio = round3(median(costs))
	r.Noisy = r.RategateMedian.Undecided > 0 ||
		(len(r.RoundRatios) > 1 && slices.Max(r.RoundRatios)-slices.Min(r.RoundRatios) > noisySpread)
}

// ratioRange is "min–max" of the round ratios.
func (r *scenarioResult) ratioRange() string {
	if len(r.RoundRatios) < 2 {
		return ""
	}
	return fmt.Sprintf("%.2f–%.2f", slices.Min(r.RoundRatios), slices.Max(r.RoundRatios))
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

// targetResult is one of issue 8's targets.
type targetResult struct {
	Name string `json:"name"`
	Want string `json:"want"`
	Got  string `json:"got"`
	// Verdict is "met", "not reached", or "inconclusive" when some rounds
	// are on each side of the target.
	Verdict string `json:"verdict"`
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
	return "not reached"
}

// evaluate checks the targets against what ran.
func (res *results) evaluate() {
	res.Targets = nil
	for _, r := range res.Scenarios {
		if r.Target == 0 {
			continue
		}
		what := map[string]string{
			"mostly-allowed": "behind NGINX (mostly allowed)",
			"direct":         "direct, without NGINX",
			"attack":         "attack traffic, behind NGINX",
		}[r.Name]
		target := r.Target
		res.Targets = append(res.Targets, targetResult{
			Name: what, Want: fmt.Sprintf(">= %.2fx the floor", r.Target),
			Got:     strings.TrimSuffix(fmt.Sprintf("%.2fx (rounds %s)", r.Ratio, r.ratioRange()), " (rounds )"),
			Verdict: verdict(r.RoundRatios, r.Ratio, func(v float64) bool { return v >= target }),
		})
	}
	if l := res.Latency; l != nil {
		res.Targets = append(res.Targets, targetResult{
			Name:    fmt.Sprintf("p99 at half the maximum rate (%.0f req/s)", l.Rate),
			Want:    "<= floor's p99 + 0.50 ms",
			Got:     fmt.Sprintf("%+.2f ms (%.2f vs %.2f ms)", l.DeltaP99MS, l.RategateMedian.P99MS, l.FloorMedian.P99MS),
			Verdict: verdict(l.RoundDeltas, l.DeltaP99MS, func(v float64) bool { return v <= 0.5 }),
		})
	}
}

// text is the console summary.
func (res *results) text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "summary (medians of %d rounds; ratio = median of each rategate run ÷ the floor run before it; cores = CPU seconds per second, in the rategate runs)\n", res.Settings.Rounds)
	fmt.Fprintf(&b, "%-15s %8s %8s %6s %5s %6s %13s %13s %9s %9s   %-43s %11s %6s %s %s\n",
		"scenario", "floor/s", "rg/s", "ratio", "cost", "target", "p50 fl→rg ms", "p99 fl→rg ms", "µs/req fl", "µs/req rg",
		"cores: nginx rategate redis app load other", "redis read·eval·cmd", "non2xx", "auth conns/1k fl→rg", "undecided")
	for _, r := range res.Scenarios {
		f, g := r.FloorMedian, r.RategateMedian
		if r.Noisy {
			r.Name += "*"
		}
		tgt := "-"
		if r.Target > 0 {
			tgt = fmt.Sprintf("%.2f", r.Target)
		}
		c := g.Cores
		fmt.Fprintf(&b, "%-15s %8.0f %8.0f %6.2f %5.2f %6s %6.2f→%-6.2f %6.2f→%-6.2f %9.1f %9.1f   %-43s %5.2f·%4.2f·%-5.2f %5.1f%% %6.1f→%-6.1f %d\n",
			r.Name, f.RPS, g.RPS, r.Ratio, r.CostRatio, tgt, f.P50MS, g.P50MS, f.P99MS, g.P99MS, f.StackUSPerRequest, g.StackUSPerRequest,
			fmt.Sprintf("%.2f %.2f %.2f %.2f %.2f %.2f", c["nginx"], c["auth"], c["redis"], c["app"], c["load"], c["other"]),
			g.RedisReadsPerRequest, g.EvalshaPerRequest, g.RedisPerRequest, 100*g.Non2xxShare, f.AuthConnsPer1000, g.AuthConnsPer1000, g.Undecided)
	}
	b.WriteString("* noisy: the round ratios spread by more than 0.2, or failure_mode answered some requests\n")
	for _, r := range res.Scenarios {
		fmt.Fprintf(&b, "  %-15s round ratios %v\n", r.Name, r.RoundRatios)
	}
	b.WriteString("cost = floor CPU per request ÷ rategate CPU per request (stack and wrk): the ratio req/s tend to when the CPUs are the bottleneck\n")
	b.WriteString("\nCPU µs per request (medians), floor → rategate; auth = the floor server or rategate\n")
	for _, r := range res.Scenarios {
		fmt.Fprintf(&b, "%-15s %s\n", r.Name, perRequestLine(r.FloorMedian, r.RategateMedian, "%s %.0f→%.0f  "))
	}
	if l := res.Latency; l != nil {
		fmt.Fprintf(&b, "%-15s at %.0f req/s open loop: p50 %.2f→%.2f ms, p99 %.2f→%.2f ms, p99.9 %.2f→%.2f ms (floor→rategate)\n",
			latencyScenario, l.Rate, l.FloorMedian.P50MS, l.RategateMedian.P50MS, l.FloorMedian.P99MS, l.RategateMedian.P99MS,
			medianOf(l.Floor, func(s *sample) float64 { return s.P999MS }), medianOf(l.Rategate, func(s *sample) float64 { return s.P999MS }))
	}
	b.WriteString("\ntargets (issue 8):\n")
	for _, t := range res.Targets {
		mark := strings.ToUpper(t.Verdict)
		if t.Verdict == "met" {
			mark = "met"
		}
		fmt.Fprintf(&b, "  %-45s want %-26s got %-32s %s\n", t.Name, t.Want, t.Got, mark)
	}
	fmt.Fprintf(&b, "\nload average before %.2f %.2f %.2f, after %.2f %.2f %.2f; %s\n",
		res.LoadBefore[0], res.LoadBefore[1], res.LoadBefore[2], res.LoadAfter[0], res.LoadAfter[1], res.LoadAfter[2], res.otherCPU())
	fmt.Fprintf(&b, "logs: rategate warn/error lines %d; NGINX→rategate error.log %d lines (%d of them 429 denials); NGINX→floor error.log %d lines; quiet copies %d lines\n",
		res.Logs.RategateWarnings, res.Logs.NginxRategateErrorLines, res.Logs.NginxRategateDenialLines, res.Logs.NginxFloorErrorLines, res.Logs.NginxQuietErrorLines)
	for _, l := range res.Logs.Samples {
		if len(l) > 220 {
			l = l[:220] + "…"
		}
		fmt.Fprintf(&b, "  %s\n", l)
	}
	fmt.Fprintf(&b, "took %s\n", res.Finished.Sub(res.Started).Round(time.Second))
	return b.String()
}

// perRequestLine formats the CPU µs per request of each role, floor →
// rategate, with format taking (role, floor, rategate) or, when it has two
// verbs only, (floor, rategate).
func perRequestLine(f, g summary, format string) string {
	var b strings.Builder
	for _, role := range []string{"nginx", "auth", "redis", "app", "load"} {
		if strings.Count(format, "%") == 3 {
			fmt.Fprintf(&b, format, role, f.USPerRequest[role], g.USPerRequest[role])
		} else {
			fmt.Fprintf(&b, format, f.USPerRequest[role], g.USPerRequest[role])
		}
	}
	return strings.TrimRight(b.String(), " ")
}

func medianOf(ss []sample, f func(*sample) float64) float64 {
	v := make([]float64, len(ss))
	for i := range ss {
		v[i] = f(&ss[i])
	}
	return median(v)
}

// otherCPU says how busy the rest of the machine was during the runs.
func (res *results) otherCPU() string {
	var v []float64
	for _, r := range res.Scenarios {
		for _, ss := range [][]sample{r.Floor, r.Rategate} {
			for i := range ss {
				v = append(v, ss[i].roles()["other"]/ss[i].WallS)
			}
		}
	}
	if len(v) == 0 {
		return "no runs"
	}
	return fmt.Sprintf("the rest of the machine (other processes, the idle side of the stack) used %.2f cores (median; max %.2f) of %d during the runs",
		median(v), slices.Max(v), res.Machine.CPUs)
}

// markdown is the table README's Performance section shows.
func (res *results) markdown() string {
	var b strings.Builder
	s := res.Settings
	if s.NginxKeepalive > 0 {
		fmt.Fprintf(&b, "**Experiment:** NGINX upstreams with `keepalive %d` instead of the shipped 32 (rategate) and 16 (app).\n\n", s.NginxKeepalive)
	}
	fmt.Fprintf(&b, "Measured %s with `make bench` (%s runs, %d alternations, wrk -t%d -c%d, %d users) at %s on a %d-CPU %s; "+
		"load average %.2f before, %.2f after; %s.\n\n",
		res.Started.Format("2006-01-02"), s.Duration, s.Rounds, s.Threads, s.Connections, s.Users, res.Machine.Revision,
		res.Machine.CPUs, res.Machine.Model, res.LoadBefore[0], res.LoadAfter[0], res.otherCPU())
	b.WriteString("| scenario | floor req/s | rategate req/s | rategate ÷ floor (range; target) | CPU cost ratio | p50 ms floor → rategate | p99 ms floor → rategate | " +
		"CPU µs per request, stack: floor → rategate | cores in the rategate runs: nginx · rategate · redis · app · wrk · rest | Redis reads · EVALSHAs · commands per request | non-2xx |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|\n")
	var undecided int64
	noisy := false
	for _, r := range res.Scenarios {
		f, g := r.FloorMedian, r.RategateMedian
		tgt := ""
		if r.Target > 0 {
			target := r.Target
			tgt = fmt.Sprintf(" (≥ %.2f: %s)", r.Target, verdict(r.RoundRatios, r.Ratio, func(v float64) bool { return v >= target }))
		}
		c := g.Cores
		name := r.Name
		if r.Noisy {
			name += " †"
			noisy = true
		}
		fmt.Fprintf(&b, "| %s | %.0f | %.0f | **%.2f**%s%s | %.2f | %.2f → %.2f | %.2f → %.2f | %.0f → %.0f | %.2f · %.2f · %.2f · %.2f · %.2f · %.2f | %.2f · %.2f · %.2f | %.1f%% |\n",
			name, f.RPS, g.RPS, r.Ratio, strings.TrimSuffix(" ("+r.ratioRange()+")", " ()"), tgt, r.CostRatio, f.P50MS, g.P50MS, f.P99MS, g.P99MS, f.StackUSPerRequest, g.StackUSPerRequest,
			c["nginx"], c["auth"], c["redis"], c["app"], c["load"], c["other"], g.RedisReadsPerRequest, g.EvalshaPerRequest, g.RedisPerRequest, 100*g.Non2xxShare)
		undecided += g.Undecided
	}
	b.WriteString("\nCPU µs per request, and connections the auth service and the app accepted per 1000 requests " +
		"(new connections instead of kept-alive ones; perf), floor → rategate (medians):\n\n" +
		"| scenario | nginx | floor / rategate | redis | app | wrk | connections to floor / rategate | to app |\n|---|---:|---:|---:|---:|---:|---:|---:|\n")
	for _, r := range res.Scenarios {
		fmt.Fprintf(&b, "| %s |%s %.1f → %.1f | %.1f → %.1f |\n", r.Name, perRequestLine(r.FloorMedian, r.RategateMedian, " %.0f → %.0f |"),
			r.FloorMedian.AuthConnsPer1000, r.RategateMedian.AuthConnsPer1000, r.FloorMedian.AppConnsPer1000, r.RategateMedian.AppConnsPer1000)
	}
	if noisy {
		b.WriteString("\n† noisy: the ratios of the rounds spread by more than 0.2, or rategate answered some requests by `failure_mode`; the ratio is shaky.\n")
	}
	b.WriteString("\nreq/s are medians over the rounds; rategate ÷ floor is the median of each rategate run divided by the floor run just before it, with the range over the rounds.\n")
	b.WriteString("CPU cost ratio: the floor's CPU per request ÷ rategate's (NGINX, auth service, app, Redis and wrk). " +
		"With every process on the same few CPUs the req/s ratio tends to it, and it moves far less than req/s with other load on the machine.\n")
	if undecided > 0 {
		fmt.Fprintf(&b, "\n**Warning:** rategate answered %d requests by `failure_mode` (Redis slower than `redis.timeout`): the runs they fell in flatter rategate.\n", undecided)
	}
	if l := res.Latency; l != nil {
		mark := verdict(l.RoundDeltas, l.DeltaP99MS, func(v float64) bool { return v <= 0.5 })
		fmt.Fprintf(&b, "\nLatency at a fixed %.0f req/s (half of rategate's maximum through NGINX; open loop, bench/openloop): "+
			"p50 %.2f → %.2f ms, p99 %.2f → %.2f ms (floor → rategate, medians); rategate's p99 minus the floor's, median of the rounds: **%+.2f ms** (target ≤ +0.50 ms: %s).\n",
			l.Rate, l.FloorMedian.P50MS, l.RategateMedian.P50MS, l.FloorMedian.P99MS, l.RategateMedian.P99MS, l.DeltaP99MS, mark)
		fmt.Fprintf(&b, "Per round: %v ms.", l.RoundDeltas)
		if l.Noisy {
			b.WriteString(" The floor's own p99 varied by more than 2× between rounds (or failure_mode answered): the machine was not steady.")
		}
		b.WriteString("\n")
	}
	return b.String()
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
