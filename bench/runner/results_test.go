package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// fixedRun is a sample with fixed figures: requests over 1 s, CPU seconds of
// the auth service, Redis, NGINX, the app and wrk.
func fixedRun(target, authProc, nginxProc string, round int, rps, auth, redis, nginx, app, load float64) sample {
	s := sample{Target: target, AuthProc: authProc, NginxProc: nginxProc, Round: round, WallS: 1,
		wrkResult: wrkResult{Requests: int64(rps), RPS: rps},
		CPU:       map[string]float64{authProc: auth, "redis-server": redis, "app": app, "load": load, "other": 0.05, "floor": 0.001}}
	if nginxProc != "" {
		s.CPU[nginxProc] = nginx
	}
	return s
}

func TestPerDecision(t *testing.T) {
	s := fixedRun("rategate", "rategate", "nginx-rategate", 1, 20000, 0.5, 0.36, 0.8, 0.4, 0.2)
	for _, c := range []struct {
		role string
		want float64
	}{{"auth", 25}, {"redis", 18}, {"nginx", 40}, {"app", 20}, {"load", 10}, {"stack", 103}} {
		if got := s.perDecision(c.role); !near(got, c.want) {
			t.Errorf("%s: %v µs per decision, want %v", c.role, got, c.want)
		}
	}
	// The idle floor server's CPU in a rategate run is "other", not auth.
	if got := s.roles()["other"]; !near(got, 0.051) {
		t.Errorf("other = %v, want 0.051", got)
	}
	if got := (&sample{}).perDecision("auth"); got != 0 {
		t.Errorf("no requests: %v", got)
	}
}

func TestPaired(t *testing.T) {
	a := []sample{{wrkResult: wrkResult{RPS: 30}}, {wrkResult: wrkResult{RPS: 20}}, {wrkResult: wrkResult{RPS: 45}}}
	b := []sample{{wrkResult: wrkResult{RPS: 60}}, {wrkResult: wrkResult{RPS: 50}}, {wrkResult: wrkResult{RPS: 50}}, {wrkResult: wrkResult{RPS: 1}}}
	rounds, med := paired(a, b, rps)
	if !slices.Equal(rounds, []float64{0.5, 0.4, 0.9}) || med != 0.5 {
		t.Errorf("paired = %v, %v", rounds, med)
	}
	// A zero divisor leaves its round out instead of dividing by it.
	b[1].RPS = 0
	if rounds, med = paired(a, b, rps); !slices.Equal(rounds, []float64{0.5, 0.9}) || med != 0.7 {
		t.Errorf("with a zero: %v, %v", rounds, med)
	}
}

// vsMinimal is a scenario of three arms over two rounds, the numbers of
// the speed issue (floor 59,900, minimal 34,400, rategate 27,700 req/s).
func vsMinimal(name, via string) scenarioResult {
	ng := func(p string) string {
		if via == "nginx" {
			return "nginx-" + p
		}
		return ""
	}
	r := scenarioResult{scenario: scenario{Name: name, Via: via, Target: 0.65}}
	runs := [][]sample{
		{fixedRun("floor", "floor", ng("floor"), 1, 59900, 0.6, 0, 0, 0, 0.5), fixedRun("floor", "floor", ng("floor"), 2, 60000, 0.6, 0, 0, 0, 0.5)},
		{fixedRun("rategate", "rategate", ng("rategate"), 1, 27700, 0.7008, 0.5014, 0, 0, 0.4), fixedRun("rategate", "rategate", ng("rategate"), 2, 28000, 0.7, 0.5, 0, 0, 0.4)},
		{fixedRun("minimal", "minimal", ng("minimal"), 1, 34400, 0.7499, 0.4266, 0, 0, 0.4), fixedRun("minimal", "minimal", ng("minimal"), 2, 34000, 0.75, 0.42, 0, 0, 0.4)},
	}
	r.setArms([]arm{floorArm, rategateArm, minimalArm}, runs)
	r.summarize()
	return r
}

func TestScenarioSummarize(t *testing.T) {
	r := vsMinimal("vs-minimal-direct", "direct")
	if !slices.Equal(r.RoundRatios, []float64{0.462, 0.467}) || r.Ratio != 0.465 {
		t.Errorf("rategate ÷ floor: %v, %v", r.RoundRatios, r.Ratio)
	}
	if len(r.Others) != 1 || r.Others[0].Name != "minimal" {
		t.Fatalf("others: %+v", r.Others)
	}
	m := r.Others[0]
	if !slices.Equal(m.RoundRatios, []float64{0.574, 0.567}) || m.Ratio != 0.571 || m.Median.RPS != 34200 {
		t.Errorf("minimal ÷ floor: %v, %v, median %v", m.RoundRatios, m.Ratio, m.Median.RPS)
	}
	// Cost ratio, round 1: floor (0.6+0.5)/59900 ÷ minimal (0.7499+0.4266+0.4)/34400.
	want1 := (1.1 / 59900) / (1.5765 / 34400)
	want2 := (1.1 / 60000) / (1.57 / 34000)
	if !near(m.CostRatio, round3((want1+want2)/2)) {
		t.Errorf("minimal cost ratio %v, want %v", m.CostRatio, round3((want1+want2)/2))
	}
	if got := r.armSamples("minimal"); len(got) != 2 || got[0].RPS != 34400 {
		t.Errorf("armSamples(minimal) = %v", got)
	}
	if r.armSamples("rategate-lease") != nil {
		t.Error("an arm that did not run has samples")
	}
	if names := armNames(r.arms()); !slices.Equal(names, []string{"floor", "rategate", "minimal"}) {
		t.Errorf("arms = %v", names)
	}
	if r.Noisy {
		t.Error("steady rounds marked noisy")
	}
	r.Others[0].Samples[1].Undecided = 3
	r.summarize()
	if !r.Noisy {
		t.Error("undecided answers of the minimal limiter do not mark the scenario")
	}
}

func armNames(a []armRuns) []string {
	var n []string
	for _, x := range a {
		n = append(n, x.Name)
	}
	return n
}

// TestGoals computes the targets against the minimal limiter from fixed
// runs: the issue's own figures (rategate 25.3 µs own CPU and 18.1 µs
// Redis CPU per decision, the minimal limiter 21.8 and 12.4).
func TestGoals(t *testing.T) {
	direct := vsMinimal("vs-minimal-direct", "direct")
	res := &results{Scenarios: []scenarioResult{direct}}
	res.evaluate()
	byName := map[string]targetResult{}
	for _, tr := range res.Targets {
		byName[tr.Name] = tr
	}
	for _, c := range []struct {
		name    string
		value   float64
		a, b    float64
		verdict string
	}{
		// round 1: 18.101 ÷ 12.401 µs = 1.4597; round 2: 17.857 ÷ 12.353 = 1.4456
		{"Redis CPU per decision, rategate ÷ minimal, direct", 1.453, 17.979, 12.377, "not met"},
		{"throughput, rategate ÷ minimal, direct", 0.815, 27850, 34200, "not met"},
		// round 1: 25.299 ÷ 21.799 µs = 1.1606; round 2: 25 ÷ 22.059 = 1.1333
		{"own CPU per decision, rategate ÷ minimal, direct", 1.147, 25.15, 21.929, "not met"},
		{"throughput, rategate ÷ floor, direct (vs-minimal-direct)", 0.465, 27850, 59950, "not met"},
	} {
		tr, ok := byName[c.name]
		if !ok {
			t.Errorf("no target %q in %v", c.name, res.Targets)
			continue
		}
		if !near(tr.Value, c.value) || !near(tr.A, c.a) || !near(tr.B, c.b) || tr.Verdict != c.verdict || len(tr.Rounds) != 2 {
			t.Errorf("%s: value %v (want %v), A %v (want %v), B %v (want %v), %q (want %q), rounds %v",
				c.name, tr.Value, c.value, tr.A, c.a, tr.B, c.b, tr.Verdict, c.verdict, tr.Rounds)
		}
	}
	for _, name := range []string{"Redis CPU per decision, rategate ÷ minimal, behind NGINX", "Redis CPU per decision, 3 rules ÷ 1 rule (rategate)"} {
		if tr := byName[name]; tr.Verdict != "not run" || !strings.Contains(tr.Got, "not run") {
			t.Errorf("%s without its scenario: %+v", name, tr)
		}
	}
	if got := byName["Redis CPU per decision, rategate ÷ minimal, direct"].Got; !strings.Contains(got, "18.0 ÷ 12.4 µs") {
		t.Errorf("Got does not carry the two numbers: %q", got)
	}
}

// TestGoalBounds: at most and at least, met exactly at the bound, and
// inconclusive when the rounds disagree.
func TestGoalBounds(t *testing.T) {
	sc := func(multi, single []float64) []scenarioResult {
		r := scenarioResult{scenario: scenario{Name: "vs-minimal-multi"}}
		var a, b, f []sample
		for i := range multi {
			f = append(f, fixedRun("floor", "floor", "", i+1, 1000, 0.01, 0, 0, 0, 0.01))
			a = append(a, fixedRun("rategate", "rategate", "", i+1, 1000, 0.02, multi[i]/1000, 0, 0, 0.01))
			b = append(b, fixedRun("rategate-1rule", "rategate", "", i+1, 1000, 0.02, single[i]/1000, 0, 0, 0.01))
		}
		r.setArms([]arm{floorArm, rategateArm, {Name: "rategate-1rule", Auth: "rategate"}}, [][]sample{f, a, b})
		r.summarize()
		return []scenarioResult{r}
	}
	g := goals[slices.IndexFunc(goals, func(g goal) bool { return g.Scenario == "vs-minimal-multi" })]
	for _, c := range []struct {
		multi, single []float64
		want          string
	}{
		{[]float64{15, 15, 15}, []float64{10, 10, 10}, "met"}, // exactly 1.5
		{[]float64{16, 17, 18}, []float64{10, 10, 10}, "not met"},
		{[]float64{14, 16, 17, 14, 16}, []float64{10, 10, 10, 10, 10}, "inconclusive"},
	} {
		if got := g.judge(sc(c.multi, c.single)); got.Verdict != c.want {
			t.Errorf("%v ÷ %v: %q (value %v, rounds %v), want %q", c.multi, c.single, got.Verdict, got.Value, got.Rounds, c.want)
		}
	}
	atLeast := goal{Name: "x", Scenario: "vs-minimal-multi", A: "rategate", B: "rategate-1rule", Metric: "redis_us", Bound: 1.5}
	if got := atLeast.judge(sc([]float64{15}, []float64{10})); got.Verdict != "met" || got.Want != ">= 1.50" {
		t.Errorf("at least: %+v", got)
	}
}

// TestEvaluateLatency: the p99 target is the median of the paired deltas.
func TestEvaluateLatency(t *testing.T) {
	l := &latencyResult{Rate: 5000}
	for i, p := range [][2]float64{{1.6, 3.4}, {1.5, 1.9}, {1.7, 2.1}} {
		l.Floor = append(l.Floor, sample{Round: i + 1, WallS: 1, wrkResult: wrkResult{P99MS: p[0]}})
		l.Rategate = append(l.Rategate, sample{Round: i + 1, WallS: 1, wrkResult: wrkResult{P99MS: p[1]}})
	}
	l.summarize()
	res := &results{Latency: l}
	res.evaluate()
	tr := res.Targets[len(res.Targets)-1]
	if !strings.HasPrefix(tr.Name, "p99 at half the maximum rate (5000 req/s)") || !near(tr.Value, 0.4) || tr.Verdict != "met" || !near(tr.A, 2.1) || !near(tr.B, 1.6) {
		t.Errorf("latency target: %+v", tr)
	}
}

// TestScenarioArms: every arm of every scenario resolves to a process and
// an address, the lease arm only when it is on (not BENCH_LEASE=0).
func TestScenarioArms(t *testing.T) {
	p := func(name string) *proc { return &proc{name: name} }
	st := &stack{redis: p("redis-server"), rategate: p("rategate"), rategateQuiet: p("rategate-quiet"), rategateHot: p("rategate-hot"),
		minimal: p("minimal"), minimalHot: p("minimal-hot"), floor: p("floor"), app: p("app"), ngRG: p("nginx-rategate"),
		ngFloor: p("nginx-floor"), ngMin: p("nginx-minimal"), ngRGQuiet: p("nginx-rategate-quiet"), ngFloorQuiet: p("nginx-floor-quiet"),
		rgAddr: "a:1", floorAddr: "a:2", minAddr: "a:3", minHotAddr: "a:4", rgHotAddr: "a:5", ngRGAddr: "a:6", ngFloorAddr: "a:7",
		ngMinAddr: "a:8", ngRGQuietAddr: "a:9", ngFloorQuietAddr: "a:10", rgQuietAddr: "a:11", adminAddr: "a:12", adminHotAddr: "a:13",
		adminQuietAddr: "a:14", rgLeaseAddr: "a:15", adminLeaseAddr: "a:16"}
	seen := map[string]bool{}
	for _, lease := range []bool{false, true} {
		if lease {
			st.rategateLease = p("rategate-lease")
		}
		for _, sc := range scenarios {
			arms := sc.arms(lease)
			if arms[0].Name != "floor" || arms[1].Name != "rategate" {
				t.Errorf("%s: arms %v do not start with floor, rategate", sc.Name, arms)
			}
			for _, a := range arms {
				tg, err := st.target(a, sc.Via, sc.Quiet)
				if err != nil {
					t.Errorf("%s/%s: %v", sc.Name, a.Name, err)
					continue
				}
				if tg.auth == nil || tg.url == "" || (sc.Via == "nginx") != (tg.nginx != nil) || tg.name != a.Name ||
					(a.Auth != "floor") != (tg.undecidedAddr != "") {
					t.Errorf("%s/%s: %+v", sc.Name, a.Name, tg)
				}
				seen[sc.Name+"/"+a.Name+"/"+tg.auth.name] = true
			}
		}
	}
	for _, want := range []string{"vs-minimal/minimal/minimal", "vs-minimal-multi/rategate-1rule/rategate", "hot-key/rategate/rategate-hot",
		"hot-key/minimal/minimal-hot", "hot-key/rategate-lease/rategate-lease", "attack-quiet/rategate/rategate-quiet"} {
		if !seen[want] {
			t.Errorf("no arm %s", want)
		}
	}
	hot := scenarios[slices.IndexFunc(scenarios, func(s scenario) bool { return s.Name == "hot-key" })]
	if n := len(hot.arms(false)); n != 3 {
		t.Errorf("hot-key with BENCH_LEASE=0 runs %d arms, want 3", n)
	}
	st.rategateLease = nil
	if _, err := st.target(arm{Name: "rategate-lease", Auth: "rategate-lease"}, "direct", false); err == nil || !strings.Contains(err.Error(), "BENCH_LEASE=1") {
		t.Errorf("lease arm with BENCH_LEASE=0: %v", err)
	}
	if _, err := st.target(arm{Name: "minimal", Auth: "minimal-hot"}, "nginx", false); err == nil {
		t.Error("the hot-key minimal limiter behind NGINX resolved")
	}
	if _, err := st.target(minimalArm, "nginx", true); err == nil {
		t.Error("a quiet minimal limiter resolved")
	}
}

// TestPolicyCopies runs the quiet and lease rewrites on the shipped bench
// policies: one line added, in the right place, nothing else changed.
func TestPolicyCopies(t *testing.T) {
	dir := t.TempDir()
	for _, c := range []struct {
		src   string
		write func(src, dst string) (string, error)
		after string
		added string
	}{
		{"policy.yaml", writeQuietPolicy, "failure_mode: allow", "deny_status: 403"},
		{"policy-hotkey.yaml", writeLeasePolicy, "    algorithm: fixed_window", "    lease: true"},
	} {
		src := filepath.Join("..", c.src)
		dst, err := c.write(src, filepath.Join(dir, c.src))
		if err != nil {
			t.Fatal(err)
		}
		orig, got := strings.Split(read(t, src), "\n"), strings.Split(read(t, dst), "\n")
		i := slices.Index(got, c.added)
		if len(got) != len(orig)+1 || i < 1 || got[i-1] != c.after || !slices.Equal(slices.Delete(slices.Clone(got), i, i+1), orig) {
			t.Errorf("%s: line %d of %d is %q after %q", c.src, i, len(got), c.added, got[max(i-1, 0)])
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "two.yaml"), []byte("rules:\n    algorithm: fixed_window\n    limit: 1\n    algorithm: fixed_window\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := writeLeasePolicy(filepath.Join(dir, "two.yaml"), filepath.Join(dir, "out.yaml")); err == nil {
		t.Error("two anchor lines accepted")
	}
}

// TestReports renders fixed results: every arm has its row with its CPU
// and Redis figures per decision, and the targets section says met or
// not met with the two numbers.
func TestReports(t *testing.T) {
	direct := vsMinimal("vs-minimal-direct", "direct")
	direct.Rategate[0].RedisScriptUSPerRequest, direct.Rategate[1].RedisScriptUSPerRequest = 9.5, 9.7
	direct.Rategate[0].RedisCommandUSPerRequest, direct.Rategate[1].RedisCommandUSPerRequest = 3.1, 3.3
	direct.summarize()
	hot := vsMinimal("hot-key", "direct")
	hot.Name, hot.Target = "hot-key", 0
	hot.Ceiling = []sample{fixedRun("ceiling", "none", "", 1, 150000, 0, 0.9, 0, 0, 0.5), fixedRun("ceiling", "none", "", 2, 150000, 0, 0.9, 0, 0, 0.5)}
	hot.summarize()
	res := &results{Scenarios: []scenarioResult{direct, hot}, Settings: settings{Duration: time.Second, Rounds: 2}, Machine: machineInfo{CPUs: 2}}
	res.evaluate()
	md, text := res.markdown(), res.text()
	for _, want := range []string{
		"| vs-minimal-direct | floor | 59950 | — |",
		"|  | rategate | 27850 | **0.47** (0.46–0.47) (≥ 0.65: not met) |",
		"|  | minimal | 34200 | **0.57** (0.57–0.57) |",
		"25.1 · 18.0 · 0.0 · 0.0 · 14.4 (43.1) | 9.60 (3.20) |",
		"|  | ceiling ‡ | 150000 |",
		"| Redis CPU per decision, rategate ÷ minimal, direct | <= 0.80 | 1.45 (rategate minimal: 18.0 ÷ 12.4 µs; rounds 1.45–1.46) | **not met** |",
		"| Redis CPU per decision, 3 rules ÷ 1 rule (rategate) | <= 1.50 | not run (vs-minimal-multi) | not run |",
		"Redis's single-key ceiling",
	} {
		if !strings.Contains(md, want) {
			t.Errorf("markdown lacks %q:\n%s", want, md)
		}
	}
	t.Log(text)
	for _, want := range []string{"vs-minimal-direct  floor", "minimal", "ceiling", "NOT MET", "own CPU per decision, rategate ÷ minimal, direct"} {
		if !strings.Contains(text, want) {
			t.Errorf("text lacks %q:\n%s", want, text)
		}
	}
}
