package main

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// line is one run's console line.
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
		den += fmt.Sprintf("  UNDECIDED %d", s.Undecided)
	}
	if s.RedisFailed > 0 {
		den += fmt.Sprintf("  REDIS FAILED CALLS %d", s.RedisFailed)
	}
	return fmt.Sprintf("round %d %-14s %7.0f req/s  p50 %5.2f ms  p99 %6.2f ms  µs/decision: auth %5.1f redis %5.1f nginx %5.1f app %5.1f load %5.1f  "+
		"redis script %4.1f µs (cmds %4.1f)  scripts/req %.2f  other %.2f cores%s",
		s.Round, s.Target, s.RPS, s.P50MS, s.P99MS, s.perDecision("auth"), s.perDecision("redis"), s.perDecision("nginx"),
		s.perDecision("app"), s.perDecision("load"), s.RedisScriptUSPerRequest, s.RedisCommandUSPerRequest, s.EvalshaPerRequest, r["other"]/s.WallS, den)
}

// text is the console summary.
func (res *results) text() string {
	var b strings.Builder
	fmt.Fprintf(&b, "summary (medians of %d rounds; ÷floor = median of each run ÷ the floor run of its round; cost = the floor's CPU per request ÷ the arm's; "+
		"µs = CPU µs per decision from /proc/<pid>/stat; redis µs = INFO commandstats per decision)\n", res.Settings.Rounds)
	fmt.Fprintf(&b, "%-18s %-16s %8s %6s %5s %6s %6s | %-41s | %-16s | %-17s | %6s %s\n",
		"scenario", "arm", "req/s", "÷floor", "cost", "p50ms", "p99ms", "µs: auth  redis  nginx    app    wrk  stack",
		"redis µs: script", "reads·scripts·cmds", "non2xx", "undecided")
	for _, r := range res.Scenarios {
		name := r.Name
		if r.Noisy {
			name += "*"
		}
		for _, a := range r.arms() {
			m := a.Median
			ratio, cost := "-", "-"
			if a.Name != "floor" {
				ratio, cost = fmt.Sprintf("%.2f", a.Ratio), fmt.Sprintf("%.2f", a.CostRatio)
			}
			u := m.USPerRequest
			fmt.Fprintf(&b, "%-18s %-16s %8.0f %6s %5s %6.2f %6.2f | %5.1f %6.1f %6.1f %6.1f %6.1f %6.1f | %7.2f (%5.2f) | %5.2f·%4.2f·%-6.2f | %5.1f%% %d\n",
				name, a.Name, m.RPS, ratio, cost, m.P50MS, m.P99MS, u["auth"], u["redis"], u["nginx"], u["app"], u["load"], m.StackUSPerRequest,
				m.RedisScriptUSPerRequest, m.RedisCommandUSPerRequest, m.RedisReadsPerRequest, m.EvalshaPerRequest, m.RedisPerRequest,
				100*m.Non2xxShare, m.Undecided)
			name = ""
		}
		if c := r.CeilingMedian; c != nil {
			fmt.Fprintf(&b, "%-18s %-16s %8.0f %6s %5s %6.2f %6.2f | %5s %6.1f %6s %6s %6.1f %6s | %7.2f (%5.2f) | %5.2f·%4.2f·%-6.2f |\n",
				"", "ceiling", c.RPS, "-", "-", c.P50MS, c.P99MS, "-", c.USPerRequest["redis"], "-", "-", c.USPerRequest["load"], "-",
				c.RedisScriptUSPerRequest, c.RedisCommandUSPerRequest, c.RedisReadsPerRequest, c.EvalshaPerRequest, c.RedisPerRequest)
		}
	}
	b.WriteString("* noisy: the round ratios spread by more than 0.2, or an auth service answered some requests without a decision\n")
	for _, r := range res.Scenarios {
		var parts []string
		for _, a := range r.arms()[1:] {
			parts = append(parts, fmt.Sprintf("%s %v", a.Name, a.RoundRatios))
		}
		fmt.Fprintf(&b, "  %-18s round ratios to the floor: %s\n", r.Name, strings.Join(parts, "; "))
	}
	for _, r := range res.Scenarios {
		if line := r.ceilingLine(); line != "" {
			b.WriteString(line + "\n")
		}
	}
	if l := res.Latency; l != nil {
		fmt.Fprintf(&b, "%-18s at %.0f req/s open loop: p50 %.2f→%.2f ms, p99 %.2f→%.2f ms, p99.9 %.2f→%.2f ms (floor→rategate)\n",
			latencyScenario, l.Rate, l.FloorMedian.P50MS, l.RategateMedian.P50MS, l.FloorMedian.P99MS, l.RategateMedian.P99MS,
			medianOf(l.Floor, func(s *sample) float64 { return s.P999MS }), medianOf(l.Rategate, func(s *sample) float64 { return s.P999MS }))
	}
	b.WriteString("\ntargets (each from this run; rounds paired):\n")
	for _, t := range res.Targets {
		mark := strings.ToUpper(t.Verdict)
		if t.Verdict == "met" {
			mark = "met"
		}
		fmt.Fprintf(&b, "  %-60s want %-11s got %-62s %s\n", t.Name, t.Want, t.Got, mark)
	}
	fmt.Fprintf(&b, "\nload average before %.2f %.2f %.2f, after %.2f %.2f %.2f; %s\n",
		res.LoadBefore[0], res.LoadBefore[1], res.LoadBefore[2], res.LoadAfter[0], res.LoadAfter[1], res.LoadAfter[2], res.otherCPU())
	fmt.Fprintf(&b, "logs: rategate warn/error lines %d; bench/minimal lines %d; NGINX→rategate error.log %d lines (%d of them 429 denials); "+
		"NGINX→floor error.log %d lines; NGINX→minimal %d; quiet copies %d lines\n",
		res.Logs.RategateWarnings, res.Logs.MinimalLines, res.Logs.NginxRategateErrorLines, res.Logs.NginxRategateDenialLines,
		res.Logs.NginxFloorErrorLines, res.Logs.NginxMinimalErrorLines, res.Logs.NginxQuietErrorLines)
	for _, l := range res.Logs.Samples {
		if len(l) > 220 {
			l = l[:220] + "…"
		}
		fmt.Fprintf(&b, "  %s\n", l)
	}
	fmt.Fprintf(&b, "took %s\n", res.Finished.Sub(res.Started).Round(time.Second))
	return b.String()
}

// ceilingLine compares hot-key's arms with Redis's single-key ceiling; ""
// without ceiling runs.
func (r *scenarioResult) ceilingLine() string {
	c := r.CeilingMedian
	if c == nil || c.RPS == 0 {
		return ""
	}
	var parts []string
	for _, a := range r.arms()[1:] {
		rounds, med := paired(a.Samples, r.Ceiling, rps)
		parts = append(parts, fmt.Sprintf("%s %.0f req/s = %.2f× (rounds %v)", a.Name, a.Median.RPS, med, rounds))
	}
	return fmt.Sprintf("%s: Redis's single-key ceiling (redis-benchmark EVALSHA of rategate's script on one key, 16 pipelined per client) %.0f calls/s at %.1f µs of Redis CPU per call; %s",
		r.Name, c.RPS, c.USPerRequest["redis"], strings.Join(parts, ", "))
}

// otherCPU says how busy the rest of the machine was during the runs.
func (res *results) otherCPU() string {
	var v []float64
	for _, r := range res.Scenarios {
		for _, a := range r.arms() {
			for i := range a.Samples {
				v = append(v, a.Samples[i].roles()["other"]/a.Samples[i].WallS)
			}
		}
	}
	if len(v) == 0 {
		return "no runs"
	}
	return fmt.Sprintf("the rest of the machine (other processes, the idle side of the stack) used %.2f cores (median; max %.2f) of %d during the runs",
		median(v), slices.Max(v), res.Machine.CPUs)
}

// markdown is the report bench/README.md shows.
func (res *results) markdown() string {
	var b strings.Builder
	s := res.Settings
	if s.NginxKeepalive > 0 {
		fmt.Fprintf(&b, "**Experiment:** NGINX upstreams with `keepalive %d` instead of the shipped 64.\n\n", s.NginxKeepalive)
	}
	fmt.Fprintf(&b, "Measured %s with `make bench` (%s runs, %d alternations, wrk -t%d -c%d, %d users) at %s on a %d-CPU %s; "+
		"load average %.2f before, %.2f after; %s.\n\n",
		res.Started.Format("2006-01-02"), s.Duration, s.Rounds, s.Threads, s.Connections, s.Users, res.Machine.Revision,
		res.Machine.CPUs, res.Machine.Model, res.LoadBefore[0], res.LoadAfter[0], res.otherCPU())
	b.WriteString("| scenario | arm | req/s | ÷ floor (range; target) | CPU cost ratio | p50 · p99 ms | " +
		"CPU µs per decision: auth · Redis · NGINX · app · wrk (stack) | Redis µs per decision: scripts (their commands) | " +
		"Redis reads · scripts · commands per decision | new connections per 1000: auth · app | non-2xx |\n")
	b.WriteString("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	var undecided int64
	noisy := false
	for _, r := range res.Scenarios {
		name := r.Name
		if r.Noisy {
			name += " †"
			noisy = true
		}
		for _, a := range r.arms() {
			m := a.Median
			ratio, cost := "—", "—"
			if a.Name != "floor" {
				ratio = fmt.Sprintf("**%.2f**", a.Ratio)
				if rr := ratioRange(a.RoundRatios); rr != "" {
					ratio += " (" + rr + ")"
				}
				if a.Name == "rategate" && r.Target > 0 {
					target := r.Target
					ratio += fmt.Sprintf(" (≥ %.2f: %s)", r.Target, verdict(a.RoundRatios, a.Ratio, func(v float64) bool { return v >= target }))
				}
				cost = fmt.Sprintf("%.2f", a.CostRatio)
			}
			u := m.USPerRequest
			fmt.Fprintf(&b, "| %s | %s | %.0f | %s | %s | %.2f · %.2f | %.1f · %.1f · %.1f · %.1f · %.1f (%.1f) | %.2f (%.2f) | %.2f · %.2f · %.2f | %s · %s | %.1f%% |\n",
				name, a.Name, m.RPS, ratio, cost, m.P50MS, m.P99MS, u["auth"], u["redis"], u["nginx"], u["app"], u["load"], m.StackUSPerRequest,
				m.RedisScriptUSPerRequest, m.RedisCommandUSPerRequest, m.RedisReadsPerRequest, m.EvalshaPerRequest, m.RedisPerRequest,
				conns(m.AuthConnsPer1000), conns(m.AppConnsPer1000), 100*m.Non2xxShare)
			undecided += m.Undecided
			name = ""
		}
		if c := r.CeilingMedian; c != nil {
			fmt.Fprintf(&b, "|  | ceiling ‡ | %.0f | — | — | %.2f · %.2f | — · %.1f · — · — · %.1f (—) | %.2f (%.2f) | %.2f · %.2f · %.2f | — | — |\n",
				c.RPS, c.P50MS, c.P99MS, c.USPerRequest["redis"], c.USPerRequest["load"],
				c.RedisScriptUSPerRequest, c.RedisCommandUSPerRequest, c.RedisReadsPerRequest, c.EvalshaPerRequest, c.RedisPerRequest)
		}
	}
	if noisy {
		b.WriteString("\n† noisy: the ratios of the rounds spread by more than 0.2, or an auth service answered some requests without a decision; the ratio is shaky.\n")
	}
	b.WriteString("\nreq/s and every per-decision figure are medians over the rounds; ÷ floor is the median of each run divided by the floor run of its round, with the range over the rounds. " +
		"CPU µs per decision: each process's CPU time over the run (`/proc/<pid>/stat`) divided by the requests wrk completed (each one decision); " +
		"auth is the process that answered `/auth` (the floor server, rategate or bench/minimal), wrk the load generator, stack everything but wrk. " +
		"Redis µs per decision: `INFO commandstats` (reset with `CONFIG RESETSTAT` before each run): the time in EVALSHA/EVAL/FCALL, and in brackets the part of it in the commands the scripts ran. " +
		"CPU cost ratio: the floor's CPU per request (stack and wrk) ÷ the arm's; with every process on the same few CPUs the req/s ratio tends to it.\n")
	for _, r := range res.Scenarios {
		if line := r.ceilingLine(); line != "" {
			b.WriteString("\n‡ " + line + ".\n")
		}
	}
	if undecided > 0 {
		fmt.Fprintf(&b, "\n**Warning:** %d requests were answered without a decision (Redis slower than the deadline): the runs they fell in flatter the service that answered them.\n", undecided)
	}
	if len(res.Targets) > 0 {
		b.WriteString("\nTargets, each computed from this run (A ÷ B round by round, median of the rounds):\n\n| target | want | got (A B: the medians) | verdict |\n|---|---|---|---|\n")
		for _, t := range res.Targets {
			v := t.Verdict
			if v == "met" || v == "not met" {
				v = "**" + v + "**"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %s |\n", t.Name, t.Want, t.Got, v)
		}
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

// conns prints connections per 1000 requests, "-" when not measured.
func conns(v float64) string {
	if v < 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f", v)
}
