package config

import (
	"math"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/rategate/rategate/adaptive"
)

func TestLoadAdaptive(t *testing.T) {
	c, err := Load(filepath.Join("testdata", "valid", "adaptive.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	want := []*adaptive.Spec{
		{
			Source: adaptive.Source{Kind: adaptive.Prometheus, URL: "https://user:pass@prometheus.example:9090/prom/",
				Query: `100 * (1 - avg(rate(node_cpu_seconds_total{mode="idle"}[1m])))`, Reduce: adaptive.Max},
			Steps:      []adaptive.Step{{Below: 50, Factor: 1.5}, {Below: 80, Factor: 1}, {Below: math.Inf(1), Factor: 0.8}},
			Hysteresis: 5, MinFactor: 0.5, MaxFactor: 2,
			Interval: 2 * time.Second, Timeout: time.Second, Cooldown: time.Minute, KeepOnError: 5 * time.Minute,
			KeepRaiseOnError: 10 * time.Second, LeaseTTL: 10 * time.Second,
		},
		{
			// Defaults: the bounds are the table's extremes, the timings
			// adaptive's defaults.
			Source:    adaptive.Source{Kind: adaptive.HTTP, URL: "http://127.0.0.1:8081/load"},
			Steps:     []adaptive.Step{{Below: 0.5, Factor: 3}, {Below: 1, Factor: 1}, {Below: math.Inf(1), Factor: 0.25}},
			MinFactor: 0.25, MaxFactor: 3,
			Interval: 5 * time.Second, Timeout: 2 * time.Second, Cooldown: 30 * time.Second, KeepOnError: time.Minute,
			KeepRaiseOnError: time.Minute, LeaseTTL: 15 * time.Second,
		},
	}
	for i, w := range want {
		if got := c.Rules[i].Adaptive; !reflect.DeepEqual(got, w) {
			t.Errorf("rules[%d].adaptive:\n got %+v\nwant %+v", i, got, w)
		}
	}
	d := c.Describe()
	for _, line := range []string{
		`  adaptive:   factor from prometheus https://user:xxxxx@prometheus.example:9090/prom/ query "100 * (1 - avg(rate(node_cpu_seconds_total{mode=\"idle\"}[1m])))" (reduce max), read every 2s (timeout 1s) by one instance at a time (lease 10s)`,
		`  steps:      below 50: x1.5; below 80: x1; above: x0.8 (hysteresis 5; within x0.5..x2; a raise at least 1m after a change)`,
		`  on error:   keep the last factor 5m (a factor above 1: 10s) after the last good reading, then x1`,
		`  on error:   keep the last factor 1m after the last good reading, then x1`,
		`  adaptive:   factor from http http://127.0.0.1:8081/load, read every 5s (timeout 2s) by one instance at a time (lease 15s)`,
	} {
		if !strings.Contains(d, line+"\n") {
			t.Errorf("Describe lacks\n%s\nin\n%s", line, d)
		}
	}
	if strings.Contains(d, "pass@") {
		t.Error("Describe prints the URL's password")
	}
}

// TestAdaptiveTimingDefaults: the timeout is capped at half the interval,
// the lease is three intervals.
func TestAdaptiveTimingDefaults(t *testing.T) {
	c, err := Parse("t.yaml", []byte(`rules:
  - name: r
    algorithm: fixed_window
    limit: 10
    period: 1m
    adaptive:
      http: {url: "http://127.0.0.1:1/x"}
      interval: 1s
      steps: [{below: 1, factor: 1}, {factor: 0.5}]
`))
	if err != nil {
		t.Fatal(err)
	}
	s := c.Rules[0].Adaptive
	if s.Timeout != 500*time.Millisecond || s.LeaseTTL != 3*time.Second || s.MinFactor != 0.5 || s.MaxFactor != 1 {
		t.Errorf("timeout %v lease %v bounds %g..%g; want 500ms 3s 0.5..1", s.Timeout, s.LeaseTTL, s.MinFactor, s.MaxFactor)
	}
	if c.Rules[0].Adaptive.Source.Reduce != adaptive.Single {
		t.Error("reduce does not default to single")
	}
}

// TestAdaptiveInvalid: one document per problem, each reported with its
// path inside the rule.
func TestAdaptiveInvalid(t *testing.T) {
	const head = "rules:\n  - name: r\n    algorithm: gcra\n    limit: 10\n    period: 1m\n    adaptive:\n"
	const src = "      http: {url: \"http://127.0.0.1:1/x\"}\n"
	const steps = "      steps: [{below: 50, factor: 1.5}, {factor: 0.8}]\n"
	for _, c := range []struct {
		name string
		body string
		want []string
	}{
		{"empty block", "", []string{
			`rules[0] "r": adaptive: needs a source: prometheus: {url: ..., query: ...} or http: {url: ...}`,
			`rules[0] "r": adaptive.steps is required, such as [{below: 50, factor: 1.5}, {below: 80, factor: 1}, {factor: 0.8}]`}},
		{"not a mapping", "      - 1\n", []string{`rules[0] "r": line 7: adaptive must be a mapping of keys to values, got a list`}},
		{"two sources", src + "      prometheus: {url: \"http://p:9090\", query: up}\n" + steps,
			[]string{`rules[0] "r": adaptive: use one source, prometheus or http, not both`}},
		{"unknown key", src + steps + "      intervall: 5s\n",
			[]string{`rules[0] "r": line 9: unknown key "intervall" in adaptive (did you mean "interval"?)`}},
		{"unknown key in a step", src + "      steps: [{below: 50, factr: 1.5}, {factor: 0.8}]\n", []string{
			`rules[0] "r": line 8: unknown key "factr" in adaptive.steps[0] (did you mean "factor"?)`,
			`rules[0] "r": adaptive.steps[0].factor is required`}},
		{"query missing", "      prometheus: {url: \"http://p:9090\"}\n" + steps,
			[]string{`rules[0] "r": adaptive.prometheus.query is required (PromQL that gives one number)`}},
		{"query empty", "      prometheus: {url: \"http://p:9090\", query: \" \"}\n" + steps,
			[]string{`rules[0] "r": adaptive.prometheus.query is empty`}},
		{"query too long", "      prometheus: {url: \"http://p:9090\", query: " + strings.Repeat("a", 4097) + "}\n" + steps,
			[]string{`rules[0] "r": adaptive.prometheus.query must be at most 4096 bytes, got 4097`}},
		{"url missing", "      http: {}\n" + steps, []string{`rules[0] "r": adaptive.http.url is required`}},
		{"url scheme", "      http: {url: \"ftp://u:secret@h/x\"}\n" + steps,
			[]string{`rules[0] "r": adaptive.http.url must start with http:// or https://, got scheme "ftp"`}},
		{"url without host", "      http: {url: \"http:///x\"}\n" + steps, []string{`rules[0] "r": adaptive.http.url has no host`}},
		{"url unparsable", "      http: {url: \"http://h:port/x\"}\n" + steps,
			[]string{`rules[0] "r": adaptive.http.url is not a URL: invalid port ":port" after host`}},
		{"prometheus url with the path", "      prometheus: {url: \"http://p:9090/api/v1/query\", query: up}\n" + steps,
			[]string{`rules[0] "r": adaptive.prometheus.url is the server's base URL: leave out /api/v1/query, rategate adds it`}},
		{"prometheus url with a query", "      prometheus: {url: \"http://p:9090/?x=1\", query: up}\n" + steps,
			[]string{`rules[0] "r": adaptive.prometheus.url is the server's base URL, without a query: rategate asks <url>/api/v1/query?query=...`}},
		{"reduce on http", src + steps + "      reduce: max\n",
			[]string{`rules[0] "r": adaptive.reduce is only for prometheus (an http source answers one number)`}},
		{"reduce unknown", "      prometheus: {url: \"http://p:9090\", query: up}\n" + steps + "      reduce: median\n",
			[]string{`rules[0] "r": adaptive.reduce must be one of single, max, min, avg, sum, got "median"`}},
		{"one step", src + "      steps: [{factor: 2}]\n",
			[]string{`rules[0] "r": adaptive.steps needs at least 2 steps, got 1 (a constant factor is an override or a new limit)`}},
		{"steps not a list", src + "      steps: {below: 1}\n",
			[]string{`rules[0] "r": line 8: adaptive.steps must be a list of steps such as [{below: 50, factor: 1.5}, {factor: 1}], got a mapping`}},
		{"a step not a mapping", src + "      steps: [1, {factor: 1}]\n",
			[]string{`rules[0] "r": line 8: adaptive.steps[0] must be a mapping such as {below: 50, factor: 1.5}, got 1`}},
		{"below missing", src + "      steps: [{factor: 1.5}, {factor: 0.8}]\n",
			[]string{`rules[0] "r": adaptive.steps[0].below is required (only the last step has none)`}},
		{"below on the last", src + "      steps: [{below: 1, factor: 1.5}, {below: 2, factor: 0.8}]\n",
			[]string{`rules[0] "r": adaptive.steps[1] is the last step: it takes every value above the others and has no below`}},
		{"below not increasing", src + "      steps: [{below: 5, factor: 1.5}, {below: 5, factor: 1}, {factor: 0.8}]\n",
			[]string{`rules[0] "r": adaptive.steps[1].below must be greater than the step before it (5), got 5`}},
		{"below infinite", src + "      steps: [{below: .inf, factor: 1.5}, {factor: 0.8}]\n",
			[]string{`rules[0] "r": adaptive.steps[0].below must be a finite number, got +Inf`}},
		{"below a string", src + "      steps: [{below: \"50%\", factor: 1.5}, {factor: 0.8}]\n",
			[]string{`rules[0] "r": line 8: adaptive.steps[0].below must be a number, got "50%"`}},
		{"factor zero", src + "      steps: [{below: 1, factor: 0}, {factor: 0.8}]\n",
			[]string{`rules[0] "r": adaptive.steps[0].factor must be > 0 and <= 1000, got 0`}},
		{"factor NaN", src + "      steps: [{below: 1, factor: .nan}, {factor: 0.8}]\n",
			[]string{`rules[0] "r": adaptive.steps[0].factor must be > 0 and <= 1000, got NaN`}},
		{"factor huge", src + "      steps: [{below: 1, factor: 1e6}, {factor: 0.8}]\n",
			[]string{`rules[0] "r": adaptive.steps[0].factor must be > 0 and <= 1000, got 1e+06`}},
		{"factor outside the bounds", src + steps + "      max_factor: 1.2\n",
			[]string{`rules[0] "r": adaptive.steps[0].factor 1.5 is outside min_factor..max_factor (0.8..1.2)`}},
		{"min_factor above 1", src + steps + "      min_factor: 1.1\n",
			[]string{`rules[0] "r": adaptive.min_factor must be > 0 and <= 1 (a failing signal returns the factor to 1), got 1.1`}},
		{"max_factor below 1", src + steps + "      max_factor: 0.9\n",
			[]string{`rules[0] "r": adaptive.max_factor must be >= 1 and <= 1000 (a failing signal returns the factor to 1), got 0.9`}},
		{"max_factor over the limit bound", "    limit: 5\n", nil}, // placeholder replaced below
		{"hysteresis negative", src + steps + "      hysteresis: -1\n",
			[]string{`rules[0] "r": adaptive.hysteresis must be a number >= 0 (in the signal's unit), got -1`}},
		{"interval too short", src + steps + "      interval: 500ms\n",
			[]string{`rules[0] "r": adaptive.interval must be >= 1s, got 500ms`}},
		{"interval too long", src + steps + "      interval: 2h\n",
			[]string{`rules[0] "r": adaptive.interval must be <= 1h, got 2h`}},
		{"interval without a unit", src + steps + "      interval: 5\n",
			[]string{`rules[0] "r": line 9: adaptive.interval must be a duration with a unit, such as "5s" or "5ms", got 5`}},
		{"timeout over half the interval", src + steps + "      interval: 2s\n      timeout: 1500ms\n",
			[]string{`rules[0] "r": adaptive.timeout must be at most half of adaptive.interval (2s) and at most 30s, got 1.5s`}},
		{"timeout zero", src + steps + "      timeout: 0s\n",
			[]string{`rules[0] "r": adaptive.timeout must be > 0, got 0s`}},
		{"cooldown negative", src + steps + "      cooldown: -1s\n",
			[]string{`rules[0] "r": adaptive.cooldown must be between 0s and 1d, got -1s`}},
		{"keep_on_error too long", src + steps + "      keep_on_error: 2d\n",
			[]string{`rules[0] "r": adaptive.keep_on_error must be between 0s and 1d, got 2d`}},
		{"keep_raise_on_error over keep_on_error", src + steps + "      keep_on_error: 10s\n      keep_raise_on_error: 20s\n",
			[]string{`rules[0] "r": adaptive.keep_raise_on_error must be between 0s and adaptive.keep_on_error (10s), got 20s`}},
		{"lease shorter than two intervals", src + steps + "      interval: 2s\n      lease_ttl: 3s\n",
			[]string{`rules[0] "r": adaptive.lease_ttl must be at least 2 times adaptive.interval (2s), so the leader renews it in time, got 3s`}},
		{"lease too long", src + steps + "      lease_ttl: 2h\n",
			[]string{`rules[0] "r": adaptive.lease_ttl must be <= 1h, got 2h`}},
	} {
		t.Run(c.name, func(t *testing.T) {
			doc := head + c.body
			want := c.want
			if c.name == "max_factor over the limit bound" {
				doc = strings.Replace(head, "limit: 10", "limit: 900000000", 1) + src +
					"      steps: [{below: 1, factor: 2}, {factor: 0.5}]\n"
				want = []string{`rules[0] "r": adaptive: max_factor 2 makes the limit 1800000000, more than 1000000000 (the bound for gcra)`}
			}
			_, err := Parse("t.yaml", []byte(doc))
			if err == nil {
				t.Fatalf("valid; want\n%s", strings.Join(want, "\n"))
			}
			for i := range want {
				want[i] = "t.yaml: " + want[i]
			}
			if got := err.Error(); got != strings.Join(want, "\n") {
				t.Errorf("\n got: %s\nwant: %s", got, strings.Join(want, "\n      "))
			}
			if strings.Contains(err.Error(), "secret") {
				t.Error("an error repeats the URL's password")
			}
		})
	}
}

// TestAdaptiveSlidingLogBound: max_factor respects the algorithm's own
// bound on the limit.
func TestAdaptiveSlidingLogBound(t *testing.T) {
	_, err := Parse("t.yaml", []byte(`rules:
  - name: r
    algorithm: sliding_log
    limit: 8000
    period: 1m
    adaptive:
      http: {url: "http://127.0.0.1:1/x"}
      steps: [{below: 1, factor: 1.5}, {factor: 1}]
`))
	want := `t.yaml: rules[0] "r": adaptive: max_factor 1.5 makes the limit 12000, more than 10000 (the bound for sliding_log)`
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
}

// TestAdaptiveMinFactorAndCost: the smallest factor must leave room for a
// request's cost.
func TestAdaptiveMinFactorAndCost(t *testing.T) {
	_, err := Parse("t.yaml", []byte(`rules:
  - name: r
    algorithm: token_bucket
    limit: 10
    period: 1m
    burst: 10
    cost: 4
    adaptive:
      http: {url: "http://127.0.0.1:1/x"}
      steps: [{below: 1, factor: 1}, {factor: 0.3}]
`))
	want := `t.yaml: rules[0] "r": adaptive: min_factor 0.3 makes the burst 3, less than the cost 4: no request could pass`
	if err == nil || err.Error() != want {
		t.Errorf("got %v\nwant %s", err, want)
	}
}
