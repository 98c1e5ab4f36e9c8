//go:build e2e

package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/rategate/rategate/internal/testredis"
)

// ---- what deploy/ queries ---------------------------------------------------

// query is one PromQL expression of deploy/ and where it is.
type query struct {
	where string
	expr  string // Grafana variables already expanded
}

// ruleFile is the part of a Prometheus rule file the checks read.
type ruleFile struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Record string `yaml:"record"`
			Alert  string `yaml:"alert"`
			Expr   string `yaml:"expr"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// deployQueries returns every expression of deploy/prometheus/*.yaml and
// deploy/grafana/*.json, and the names the recording rules define.
func deployQueries(t *testing.T) (qs []query, recorded map[string]bool) {
	t.Helper()
	recorded = map[string]bool{}
	files, _ := filepath.Glob(filepath.Join(repoRoot, "deploy", "prometheus", "*.yaml"))
	if len(files) == 0 {
		t.Fatal("no rule files in deploy/prometheus/")
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var rf ruleFile
		if err := yaml.Unmarshal(b, &rf); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, g := range rf.Groups {
			for _, r := range g.Rules {
				name := r.Record + r.Alert
				if r.Record != "" {
					recorded[r.Record] = true
				}
				qs = append(qs, query{fmt.Sprintf("%s: %s", filepath.Base(f), name), r.Expr})
			}
		}
	}
	dashboards, _ := filepath.Glob(filepath.Join(repoRoot, "deploy", "grafana", "*.json"))
	if len(dashboards) == 0 {
		t.Fatal("no dashboard in deploy/grafana/")
	}
	for _, f := range dashboards {
		qs = append(qs, dashboardQueries(t, f)...)
	}
	return qs, recorded
}

// dashboard is the part of a Grafana dashboard the checks read.
type dashboard struct {
	Panels []struct {
		ID      int    `json:"id"`
		Title   string `json:"title"`
		Type    string `json:"type"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Name  string          `json:"name"`
			Type  string          `json:"type"`
			Query json.RawMessage `json:"query"`
		} `json:"list"`
	} `json:"templating"`
}

func dashboardQueries(t *testing.T, path string) []query {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return dashboardQueriesOf(t, filepath.Base(path), b)
}

func dashboardQueriesOf(t *testing.T, name string, b []byte) []query {
	t.Helper()
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var qs []query
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("%s: panel id %d used twice", name, p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("%s: panel %q has no query", name, p.Title)
		}
		for i, tg := range p.Targets {
			if strings.TrimSpace(tg.Expr) == "" {
				t.Errorf("%s: panel %q query %d is empty", name, p.Title, i)
			}
			qs = append(qs, query{fmt.Sprintf("%s: panel %q", name, p.Title), expandGrafana(tg.Expr)})
		}
	}
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			t.Fatalf("%s: variable %s: %v", name, v.Name, err)
		}
		m := labelValuesQuery.FindStringSubmatch(q.Query)
		if m == nil {
			t.Errorf("%s: variable %s: %q is not label_values(selector, label)", name, v.Name, q.Query)
			continue
		}
		qs = append(qs, query{fmt.Sprintf("%s: variable %s", name, v.Name), expandGrafana(m[1])})
	}
	return qs
}

// missingMetrics returns, for each query, the names it reads that are
// neither exported nor recorded. "up" is Prometheus's own.
func missingMetrics(qs []query, exported, recorded map[string]bool) []string {
	var missing []string
	for _, q := range qs {
		names, err := promqlMetricNames(q.expr)
		if err != nil {
			missing = append(missing, fmt.Sprintf("%s: %v", q.where, err))
			continue
		}
		if len(names) == 0 {
			missing = append(missing, fmt.Sprintf("%s: reads no metric: %s", q.where, q.expr))
		}
		for _, n := range names {
			if !exported[n] && !recorded[n] && n != "up" {
				missing = append(missing, fmt.Sprintf("%s: %s is not exported by rategate", q.where, n))
			}
		}
	}
	return missing
}

// ---- what rategate exports --------------------------------------------------

// exportedNames returns the sample names of a /metrics answer: a histogram
// family x gives x_bucket, x_sum and x_count. Families without a sample do
// not count.
func exportedNames(t *testing.T, body string) map[string]bool {
	t.Helper()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(strings.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	names := map[string]bool{}
	for name, f := range fams {
		if len(f.GetMetric()) == 0 {
			continue
		}
		switch f.GetType().String() {
		case "HISTOGRAM":
			names[name+"_bucket"], names[name+"_sum"], names[name+"_count"] = true, true, true
		case "SUMMARY":
			names[name], names[name+"_sum"], names[name+"_count"] = true, true, true
		default:
			names[name] = true
		}
	}
	return names
}

// adminGet GETs an admin path with the token ("" = none) and returns the
// status, the Content-Type and the body.
func adminGet(t *testing.T, base, path, token string) (int, string, string) {
	t.Helper()
	req, _ := http.NewRequest("GET", base+path, nil)
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
}

func newToken(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// configMapPolicy writes the rategate.yaml of deploy/kubernetes/configmap.yaml
// into dir and returns its path.
func configMapPolicy(t *testing.T, dir string) string {
	t.Helper()
	var cm struct {
		Data map[string]string `yaml:"data"`
	}
	readYAML(t, filepath.Join(repoRoot, "deploy", "kubernetes", "configmap.yaml"), &cm)
	policy, ok := cm.Data["rategate.yaml"]
	if !ok {
		t.Fatal("deploy/kubernetes/configmap.yaml has no rategate.yaml")
	}
	path := filepath.Join(dir, "rategate.yaml")
	if err := os.WriteFile(path, []byte(policy), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}

// authRequest sends one /auth request straight to rategate (traffic for the
// metrics; what clients see is tested through NGINX elsewhere).
func authRequest(t *testing.T, addr, method, uri, ip string) int {
	t.Helper()
	req, _ := http.NewRequest("GET", "http://"+addr+"/auth", nil)
	req.Header.Set("X-Original-URI", uri)
	req.Header.Set("X-Original-Method", method)
	req.Header.Set("X-Real-IP", ip)
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("/auth: %v", err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode
}

// ---- the test ----------------------------------------------------------------

// TestDeployMetricNames runs a real rategate with a real Redis and the
// Kubernetes ConfigMap's policy, and checks that every metric the dashboard
// and the Prometheus rules read is one it exports. Then a real Prometheus,
// configured by deploy/compose/prometheus.yml, scrapes it with the token,
// evaluates every rule of deploy/prometheus/ and every dashboard query.
func TestDeployMetricNames(t *testing.T) {
	promBin := needBinary(t, "prometheus", "prometheus")
	dir := filepath.Join(workDir, safeName(t.Name()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	redis := testredis.Start(t)
	token := newToken(t)
	rg := newRategate(t, "rategate", dir, configMapPolicy(t, dir), "redis://"+redis.Addr+"/0")
	rg.env = []string{"RATEGATE_ADMIN_TOKEN=" + token}
	rg.start(t)
	admin := "http://127.0.0.1:" + strconv.Itoa(rg.adminPort)

	// The token guards /metrics like every admin path.
	for _, bad := range []string{"", "wrong-" + token} {
		if code, _, _ := adminGet(t, admin, "/metrics", bad); code != http.StatusUnauthorized {
			t.Errorf("/metrics with token %q: %d, want 401", bad, code)
		}
	}

	// Traffic: 12 logins from one IP (the limit is 10 a minute), API calls.
	needWindow(t, time.Minute, 5*time.Second)
	denied := 0
	for i := 0; i < 12; i++ {
		if authRequest(t, rg.addr(), "POST", "/login", "203.0.113.7") != http.StatusNoContent {
			denied++
		}
	}
	if denied != 2 {
		t.Errorf("12 logins: %d denied, want 2", denied)
	}
	authRequest(t, rg.addr(), "GET", "/api/items", "203.0.113.8")
	authRequest(t, rg.addr(), "GET", "/other", "203.0.113.8")

	// The redis_* gauges appear with the first INFO poll.
	var body, ctype string
	err := waitFor(15*time.Second, func() error {
		code, ct, b := adminGet(t, admin, "/metrics", token)
		body, ctype = b, ct
		if code != http.StatusOK {
			return fmt.Errorf("/metrics: %d", code)
		}
		if !strings.Contains(b, "\nrategate_redis_up 1") {
			return fmt.Errorf("no rategate_redis_up 1 yet")
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, firstLines(body, 20))
	}
	// Prometheus 3 refuses a scrape without a valid text format type.
	if !strings.HasPrefix(ctype, "text/plain; version=0.0.4") && !strings.HasPrefix(ctype, "application/openmetrics-text") {
		t.Errorf("/metrics Content-Type %q: Prometheus 3 needs text/plain; version=0.0.4", ctype)
	}
	exported := exportedNames(t, body)
	qs, recorded := deployQueries(t)
	for _, m := range missingMetrics(qs, exported, recorded) {
		t.Error(m)
	}
	t.Logf("%d queries, %d exported names, %d recording rules", len(qs), len(exported), len(recorded))

	t.Run("a misspelt metric in the dashboard is reported", func(t *testing.T) {
		b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "grafana", "rategate.json"))
		if err != nil {
			t.Fatal(err)
		}
		const good, typo = "rategate_store_errors_total", "rategate_store_error_total"
		if !strings.Contains(string(b), good) {
			t.Fatalf("the dashboard no longer reads %s: pick another metric for this check", good)
		}
		mutated := strings.Replace(string(b), good, typo, 1)
		missing := missingMetrics(dashboardQueriesOf(t, "mutated", []byte(mutated)), exported, recorded)
		if len(missing) != 1 || !strings.Contains(missing[0], typo+" is not exported") {
			t.Errorf("want exactly the misspelt %s reported, got %q", typo, missing)
		}
		// So is a recording rule nobody defines.
		missing = missingMetrics([]query{{"alert", "rule:nowhere_defined:rate5m > 1"}}, exported, recorded)
		if len(missing) != 1 {
			t.Errorf("an undefined recording rule: got %q", missing)
		}
	})

	t.Run("Prometheus scrapes it with the compose config and evaluates every rule and query", func(t *testing.T) {
		runPrometheus(t, promBin, dir, rg, token, qs)
	})
}

// runPrometheus starts Prometheus with deploy/compose/prometheus.yml (the
// service name and paths pointed at this run, intervals at 1 s) plus a job
// without the token, and checks scraping, rules and queries.
func runPrometheus(t *testing.T, bin, dir string, rg *rategate, token string, qs []query) {
	tokenFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokenFile, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(repoRoot, "deploy", "compose", "prometheus.yml"))
	if err != nil {
		t.Fatal(err)
	}
	target := "127.0.0.1:" + strconv.Itoa(rg.adminPort)
	cfg := string(b)
	for old, repl := range map[string]string{
		`"rategate:9090"`:              strconv.Quote(target),
		"/prometheus/rategate-token":   tokenFile,
		"/etc/prometheus/rules/*.yaml": filepath.Join(repoRoot, "deploy", "prometheus", "*.yaml"),
		"scrape_interval: 15s":         "scrape_interval: 1s",
		"evaluation_interval: 15s":     "evaluation_interval: 1s",
	} {
		if !strings.Contains(cfg, old) {
			t.Fatalf("deploy/compose/prometheus.yml no longer contains %q: update this test", old)
		}
		cfg = strings.ReplaceAll(cfg, old, repl)
	}
	cfg += fmt.Sprintf(`  - job_name: rategate-no-token
    static_configs:
      - targets: [%q]
`, target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	api, p := startPrometheus(t, bin, dir, cfgPath)

	// The token job is up; the one without the token gets a 401.
	err = waitFor(30*time.Second, func() error {
		var r struct {
			Data struct {
				ActiveTargets []struct {
					Labels    map[string]string `json:"labels"`
					Health    string            `json:"health"`
					LastError string            `json:"lastError"`
				} `json:"activeTargets"`
			} `json:"data"`
		}
		if err := promAPI(api, "/api/v1/targets", nil, &r); err != nil {
			return err
		}
		got := map[string]string{}
		for _, tg := range r.Data.ActiveTargets {
			got[tg.Labels["job"]] = tg.Health + " " + tg.LastError
		}
		if got["rategate"] != "up " || !strings.Contains(got["rategate-no-token"], "401") {
			return fmt.Errorf("targets: %q", got)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, p.logTail())
	}

	// Denials while Prometheus watches: the counters must move between
	// scrapes for rate() to see them.
	needWindow(t, time.Minute, 5*time.Second)
	for i := 0; i < 12; i++ {
		authRequest(t, rg.addr(), "POST", "/login", "203.0.113.9")
	}

	// Every rule evaluates without error, and the recording rules produce
	// those denials.
	err = waitFor(30*time.Second, func() error {
		var r struct {
			Data struct {
				Groups []struct {
					Rules []struct {
						Name      string `json:"name"`
						Health    string `json:"health"`
						LastError string `json:"lastError"`
					} `json:"rules"`
				} `json:"groups"`
			} `json:"data"`
		}
		if err := promAPI(api, "/api/v1/rules", nil, &r); err != nil {
			return err
		}
		n := 0
		for _, g := range r.Data.Groups {
			for _, rule := range g.Rules {
				n++
				if rule.Health != "ok" {
					return fmt.Errorf("rule %s: %s %s", rule.Name, rule.Health, rule.LastError)
				}
			}
		}
		if n == 0 {
			return fmt.Errorf("no rules loaded")
		}
		v, err := promQuery(api, `rule_decision:rategate_decisions:rate5m{rule="login-per-ip", decision="limited"}`)
		if err != nil {
			return err
		}
		if len(v) != 1 || v[0] <= 0 {
			return fmt.Errorf("login-per-ip limited rate: %v", v)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%v\n%s", err, p.logTail())
	}

	// Every query of the dashboard and the rules is valid PromQL that
	// Prometheus evaluates on rategate's series.
	for _, q := range qs {
		if _, err := promQuery(api, q.expr); err != nil {
			t.Errorf("%s: %v\n%s", q.where, err, q.expr)
		}
	}
}

// promAPI GETs a Prometheus API path and decodes its JSON answer.
func promAPI(api, path string, params url.Values, v any) error {
	c := http.Client{Timeout: 5 * time.Second}
	u := api + path
	if params != nil {
		u += "?" + params.Encode()
	}
	resp, err := c.Get(u)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %d %s", path, resp.StatusCode, b)
	}
	return json.Unmarshal(b, v)
}

// promQuery evaluates expr now and returns the sample values (vector or
// scalar results).
func promQuery(api, expr string) ([]float64, error) {
	var r struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			ResultType string          `json:"resultType"`
			Result     json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := promAPI(api, "/api/v1/query", url.Values{"query": {expr}}, &r); err != nil {
		return nil, err
	}
	if r.Status != "success" {
		return nil, fmt.Errorf("%s", r.Error)
	}
	var vals []float64
	parse := func(pair []any) {
		if len(pair) == 2 {
			if s, ok := pair[1].(string); ok {
				f, _ := strconv.ParseFloat(s, 64)
				vals = append(vals, f)
			}
		}
	}
	switch r.Data.ResultType {
	case "vector":
		var vec []struct {
			Value []any `json:"value"`
		}
		if err := json.Unmarshal(r.Data.Result, &vec); err != nil {
			return nil, err
		}
		for _, s := range vec {
			parse(s.Value)
		}
	case "scalar":
		var pair []any
		if err := json.Unmarshal(r.Data.Result, &pair); err != nil {
			return nil, err
		}
		parse(pair)
	}
	sort.Float64s(vals)
	return vals, nil
}
